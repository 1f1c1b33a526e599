"""Weight averaging (WARM) and prediction ensembles of students that share a start (docs/weight_averaging.md).

Two tiny students are fitted through `cli.py fit` under one seed (2 layers, layer 1 and the embeddings frozen, the
frozen prefix cached), one with ANCHOR: the average is the hand average tensor by tensor, copies the frozen prefix
bit-exact and loads through `load_from_checkpoint` and `cli.py test --ckpt_path`; bad member sets are refused naming
the files. The ensemble's margins are the hand mean of the members' (or the logit of their mean probability), and
its `cli.py test` / `validate` results are the accuracies of those hand margins."""
import json
import math
import os

import lightning.pytorch as pl
import pytest
import torch
from torchmetrics import Metric

from cli import main
from lightning_modules.reward.backbones import LoraSpec
from lightning_modules.reward.ensemble import RewardEnsembleModule, combine_margins
from lightning_modules.reward.metrics import SplitMetrics
from lightning_modules.reward.reward_model import RewardModelModule
from lightning_modules.reward.weight_averaging import (
    average_checkpoints, averaging_record_path, frozen_start_keys, main as average_main,
)
from tests.helpers import quiet_trainer, tiny_data, tiny_model
from tests.test_cli_configs import CPU, SMALL_SYNTH, SYNTH, TINY

ENSEMBLE = "lightning_modules.reward.ensemble.RewardEnsembleModule"
TWO_LAYERS = json.dumps({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2})
STUDENT = ["--model.tiny_config=" + TWO_LAYERS, "--model.freeze_layers=1", "--model.cache_frozen_prefix=true"]
FROZEN = "backbone.layers.0.mlp.up_proj.weight"  # layer 1: frozen by --model.freeze_layers 1
TRAINED = "backbone.layers.1.mlp.up_proj.weight"


def _common(cache_dir: str) -> list[str]:
    return ["--config", CPU, "--config", TINY, "--config", SYNTH, f"--data.cache_dir={cache_dir}",
            f"--data.source_options={SMALL_SYNTH}", "--trainer.logger=false"]


@pytest.fixture(scope="module")
def students(tmp_path_factory):
    """Two students of one seed (same backbone init, frozen layer, head init), trained differently, and the common
    command-line arguments that built them."""
    root = tmp_path_factory.mktemp("students")
    common = _common(str(root / "cache"))
    paths = []
    for name, extra in (("plain", []), ("anchor", ["--model.anchor_coef=10.0"])):
        main(["fit", *common, *STUDENT, *extra, "--trainer.max_steps=3", "--trainer.limit_val_batches=1",
              f"--trainer.default_root_dir={root / name}"])
        paths.append(str(root / name / "checkpoints" / "last.ckpt"))
    return paths, common


def _state(path):
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def _load(path, **overrides):
    return RewardModelModule.load_from_checkpoint(path, map_location="cpu", **overrides).eval()


def _save_like(module, like_path, path, **hparams):
    """`module` saved as a Lightning checkpoint with the hyperparameters of `like_path` (updated by `hparams`)."""
    like = torch.load(like_path, map_location="cpu", weights_only=True)
    torch.save({"pytorch-lightning_version": like["pytorch-lightning_version"], "state_dict": module.state_dict(),
                "hyper_parameters": {**like["hyper_parameters"], **hparams}}, path)
    return str(path)


def _built_like(like_path, seed, **overrides):
    """A fresh RewardModelModule with a member's constructor arguments, built under `seed`."""
    hp = dict(torch.load(like_path, map_location="cpu", weights_only=True)["hyper_parameters"])
    kwargs = {k: v for k, v in hp.items() if not k.startswith("_")}
    pl.seed_everything(seed)
    return RewardModelModule(**{**kwargs, **overrides})


@torch.no_grad()
def _margins(models, loader):
    """Each model's margins over a whole loader, (K, N), and the pairs' indices (N,)."""
    rows, index = [], []
    for batch in loader:
        rows.append(torch.stack([m.pair_margins(batch) for m in models]))  # (K, B)
        index.append(batch["index"])
    return torch.cat(rows, 1), torch.cat(index)


# ---- weight averaging ---------------------------------------------------------------------------------------------
def test_average_is_the_hand_average_and_keeps_the_frozen_prefix_bit_exact(students, tmp_path):
    (a, b), _ = students
    sa, sb = _state(a), _state(b)
    assert not torch.equal(sa[TRAINED], sb[TRAINED]) and torch.equal(sa[FROZEN], sb[FROZEN])
    out = average_checkpoints([a, b], str(tmp_path / "avg.ckpt"))
    avg = torch.load(out, map_location="cpu", weights_only=True)
    for key in (TRAINED, "head.score.weight"):
        assert torch.equal(avg["state_dict"][key], (0.5 * sa[key].double() + 0.5 * sb[key].double()).float()), key
    for key in frozen_start_keys(list(sa), 1):
        assert torch.equal(avg["state_dict"][key], sa[key]), key
    assert set(avg["state_dict"]) == set(sa)
    assert "optimizer_states" not in avg and "loops" not in avg
    assert avg["hyper_parameters"] == torch.load(a, weights_only=True)["hyper_parameters"]
    with open(averaging_record_path(out)) as f:
        record = json.load(f)
    assert record == avg["weight_averaging"]
    assert record["members"] == [os.path.abspath(a), os.path.abspath(b)] and record["weights"] == [0.5, 0.5]
    assert record["hyperparameters_that_differ"] == {"anchor_coef": [0.0, 10.0]}
    assert record["data_hyperparameters_that_differ"] == {}
    assert avg["datamodule_hyper_parameters"]["seed"] == 0
    assert record["shared_start"]["verified"] and record["shared_start"]["frozen_tensors_identical"] > 0
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]  # atomic: no temporary file left


def test_weights_quarter_and_three_quarters(students, tmp_path):
    (a, b), _ = students
    sa, sb = _state(a), _state(b)
    out = average_main([a, b, "--out", str(tmp_path / "w.ckpt"), "--weights", "0.25", "0.75"])
    avg = _state(out)
    for key in (TRAINED, "head.score.weight"):
        assert torch.equal(avg[key], (0.25 * sa[key].double() + 0.75 * sb[key].double()).float()), key
    assert not torch.equal(avg[TRAINED], _state(average_checkpoints([a, b], str(tmp_path / "u.ckpt")))[TRAINED])


@pytest.mark.parametrize("weights, message", [
    ([0.5, 0.4], r"weights must sum to 1, got \[0.5, 0.4\] \(sum 0.9\); normalised: \[0.55"),
    ([1.5, -0.5], r"weights must be finite and >= 0"),
    ([1.0], r"1 weight\(s\) \[1.0\] for 2 checkpoints"),
])
def test_bad_weights_are_refused(students, tmp_path, weights, message):
    (a, b), _ = students
    with pytest.raises(ValueError, match=message):
        average_checkpoints([a, b], str(tmp_path / "x.ckpt"), weights)
    assert not os.listdir(tmp_path)


def test_one_member_missing_or_corrupt_members_are_refused_naming_the_file(students, tmp_path):
    (a, b), _ = students
    out = str(tmp_path / "x.ckpt")
    with pytest.raises(ValueError, match=r"at least 2 checkpoints, got 1"):
        average_checkpoints([a], out)
    missing = str(tmp_path / "gone.ckpt")
    with pytest.raises(ValueError, match=f"{missing}' does not exist"):
        average_checkpoints([a, missing], out)
    corrupt = tmp_path / "cut.ckpt"
    corrupt.write_bytes(open(b, "rb").read()[:5000])
    with pytest.raises(ValueError, match=f"{corrupt}' is truncated"):
        average_checkpoints([a, str(corrupt)], out)
    with pytest.raises(ValueError, match="is one of the members"):
        average_checkpoints([a, b], a)
    assert not os.path.exists(out)


def test_a_lora_member_among_full_fine_tunes_is_refused_naming_the_files(students, tmp_path):
    (a, b), _ = students
    module = _built_like(a, 0, lora=LoraSpec(r=4), cache_frozen_prefix=False)
    lora = _save_like(module, a, tmp_path / "lora.ckpt", lora={"r": 4}, cache_frozen_prefix=False)
    with pytest.raises(ValueError, match=rf"(?s)'{a}' and '{lora}' are different architectures.*--model.lora: "
                                         rf"'{a}' has None, '{lora}' has \{{'r': 4\}}"):
        average_checkpoints([a, lora], str(tmp_path / "x.ckpt"))
    unlabelled = _save_like(module, a, tmp_path / "unlabelled.ckpt")  # LoRA weights, hyperparameters saying none
    with pytest.raises(ValueError, match=rf"'{a}' and '{unlabelled}' hold different tensors.*LoRA member"):
        average_checkpoints([a, unlabelled], str(tmp_path / "x.ckpt"))
    with pytest.raises(ValueError, match="are LoRA models .* not an average of their weight updates"):
        average_checkpoints([lora, lora], str(tmp_path / "x.ckpt"))


def test_members_built_under_another_seed_do_not_share_a_start(students, tmp_path):
    (a, b), _ = students
    other = _save_like(_built_like(a, 1), a, tmp_path / "seed1.ckpt")  # same architecture, another random init
    assert set(_state(other)) == set(_state(a))
    with pytest.raises(ValueError, match=rf"'{a}' and '{other}' do not share a start: parameters that "
                                         r"--model.freeze_layers 1 keeps frozen .*differ \(backbone.embed_tokens"):
        average_checkpoints([a, b, other], str(tmp_path / "x.ckpt"))
    assert not os.path.exists(tmp_path / "x.ckpt")


def test_members_of_another_data_seed_are_refused(students, tmp_path):
    """A pretrained backbone's frozen layers are the same in every seed: the data split tells the seeds apart."""
    (a, b), _ = students
    ckpt = torch.load(b, map_location="cpu", weights_only=True)
    ckpt["datamodule_hyper_parameters"]["seed"] = 1
    other = str(tmp_path / "seed1_data.ckpt")
    torch.save(ckpt, other)
    with pytest.raises(ValueError, match=rf"'{a}' and '{other}' were trained on different data splits "
                                         r"\(--data.seed: 0 vs 1\)"):
        average_checkpoints([a, other], str(tmp_path / "x.ckpt"))


def test_frozen_start_keys_are_the_parameters_freeze_layers_freezes(word_tokenizer_dir):
    for backbone in ("tiny-qwen2", "tiny-gpt2"):
        model = tiny_model(word_tokenizer_dir, backbone=backbone, freeze_layers=1,
                           tiny_config={"num_hidden_layers": 3} if backbone == "tiny-qwen2" else {"n_layer": 3})
        frozen = {f"backbone.{n}" for n, p in model.backbone.named_parameters() if not p.requires_grad}
        frozen -= {"backbone.ln_f.bias"}  # GPT-2's noise-only bias, frozen apart from freeze_layers
        params = [f"backbone.{n}" for n, _ in model.backbone.named_parameters()]
        assert set(frozen_start_keys(params, 1)) == frozen and frozen, backbone
        assert frozen_start_keys(params, 0) == []


def test_the_average_loads_and_tests_through_the_cli(students, tmp_path):
    (a, b), common = students
    out = average_checkpoints([a, b], str(tmp_path / "avg.ckpt"))
    loaded = _load(out)
    for key, value in _state(out).items():
        assert torch.equal(loaded.state_dict()[key], value), key
    cli = main(["test", *common, *STUDENT, f"--ckpt_path={out}", f"--trainer.default_root_dir={tmp_path / 'test'}"])
    with open(tmp_path / "test" / "test_results.json") as f:
        results = json.load(f)
    dm = cli.datamodule
    assert list(results) == dm.test_split_names
    for name, loader in zip(dm.test_split_names, dm.test_dataloader()):
        margins, _ = _margins([loaded], loader)
        assert results[name] == {"acc": float((margins[0] > 0).double().mean()), "pairs": margins.shape[1]}


# ---- prediction ensembles -----------------------------------------------------------------------------------------
def test_ensemble_margins_are_the_mean_of_the_members_margins(students, cache_dir):
    (a, b), _ = students
    dm = tiny_data("builtin:synthetic_shift", cache_dir, max_length=128)
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()[0]))
    with torch.no_grad():
        ensemble = RewardEnsembleModule(members=[a, b])
        margins = ensemble.pair_margins(batch)
        # a cached frozen prefix, reused: members of one start share a store, so the second one reads it back
        assert ensemble.members[0].frozen_prefix.prefix_forwards == 2 * len(batch["index"])
        assert ensemble.members[1].frozen_prefix.prefix_forwards == 0
        ma, mb = _load(a).pair_margins(batch), _load(b).pair_margins(batch)
        assert not torch.equal(ma, mb)
        assert torch.equal(margins, torch.stack([ma, mb]).mean(0))
        plain = _load(a, cache_frozen_prefix=False).pair_margins(batch)
        torch.testing.assert_close(plain, ma, rtol=1e-5, atol=1e-6)
        by_probability = RewardEnsembleModule(members=[a, b], combine="probability").pair_margins(batch)
        p = (torch.sigmoid(ma) + torch.sigmoid(mb)) / 2
        torch.testing.assert_close(by_probability, torch.log(p / (1 - p)), rtol=1e-5, atol=1e-6)
        twice = RewardEnsembleModule(members=[a, a])
        assert len(twice.members) == 1  # loaded once
        assert torch.equal(twice.pair_margins(batch), ma)
        torch.testing.assert_close(RewardEnsembleModule(members=[a, a], combine="probability").pair_margins(batch),
                                   ma, rtol=1e-5, atol=1e-5)
        weighted = RewardEnsembleModule(members=[a, a, b])  # a path given twice counts twice
        assert torch.equal(weighted.pair_margins(batch), torch.stack([ma, ma, mb]).mean(0))
        rewards, _ = ensemble(batch["input_ids"], batch["attention_mask"])
        r_a, r_b = rewards.chunk(2)
        torch.testing.assert_close(r_a - r_b, ensemble.pair_margins(batch), rtol=1e-5, atol=1e-6)
    assert not any(p.requires_grad for p in ensemble.parameters()) and not ensemble.members[0].training


def test_combine_probability_is_the_logit_of_the_mean_probability():
    margins = torch.tensor([[2.0, -1.0, 9.0, 0.0], [-0.5, -3.0, 7.0, 0.0]])  # (K=2, B=4)
    p = torch.sigmoid(margins.double()).mean(0)
    torch.testing.assert_close(combine_margins(margins, "probability").double(), torch.log(p / (1 - p)),
                               rtol=1e-5, atol=1e-6)
    # far margins, where 1 − p̄ rounds to 0 in float32: −log((e^-40 + e^-30) / 2), to float32 rounding
    far = combine_margins(torch.tensor([[40.0], [30.0]]), "probability")
    assert float(far) == pytest.approx(30.0 + math.log(2.0) - math.log1p(math.exp(-10.0)), rel=1e-6)
    assert torch.equal(combine_margins(margins, "reward"), margins.mean(0))
    with pytest.raises(ValueError, match="'reward' or 'probability'"):
        combine_margins(margins, "vote")


def test_ensemble_cli_test_writes_the_hand_accuracies(students, tmp_path):
    (a, b), common = students
    root = tmp_path / "ensemble"
    cli = main(["test", *common, *STUDENT, f"--model.class_path={ENSEMBLE}", f"--model.init_args.members=[{a}, {b}]",
                f"--trainer.default_root_dir={root}"])
    assert isinstance(cli.model, RewardEnsembleModule) and cli.model.member_paths == [a, b]
    with open(root / "test_results.json") as f:
        results = json.load(f)
    dm, members = cli.datamodule, [_load(a), _load(b)]
    assert list(results) == dm.test_split_names
    differs = False
    for name, loader in zip(dm.test_split_names, dm.test_dataloader()):
        margins, _ = _margins(members, loader)
        acc = float((margins.mean(0) > 0).double().mean())
        assert results[name] == {"acc": acc, "pairs": margins.shape[1]}, name
        assert float(cli.trainer.callback_metrics[f"test/acc/{name}"]) == pytest.approx(acc)
        differs |= acc != float((margins[0] > 0).double().mean())
    assert differs  # the ensemble is not its first member


def test_ensemble_cli_validate_logs_val_acc(students, tmp_path):
    (a, b), common = students
    cli = main(["validate", *common, *STUDENT, f"--model.class_path={ENSEMBLE}",
                f"--model.init_args.members=[{a}, {b}]", "--model.init_args.combine=probability",
                f"--trainer.default_root_dir={tmp_path}"])
    margins, _ = _margins([_load(a), _load(b)], cli.datamodule.val_dataloader())
    p = torch.sigmoid(margins).mean(0)
    assert float(cli.trainer.callback_metrics["val/acc"]) == pytest.approx(float((p > 0.5).double().mean()))
    assert float(cli.trainer.callback_metrics["val/loss"]) == pytest.approx(float(-torch.log(p).mean()), rel=1e-5)


def test_ensemble_refuses_another_tokenizer_fit_and_ckpt_path(students, word_tokenizer_dir, cache_dir, tmp_path):
    (a, b), _ = students
    other = _save_like(tiny_model(word_tokenizer_dir), a, tmp_path / "words.ckpt", tokenizer=word_tokenizer_dir,
                       tiny_config=None, freeze_layers=0, cache_frozen_prefix=False)
    with pytest.raises(ValueError, match=rf"members: '{a}' uses tokenizer 'builtin:synthetic_shift' and '{other}' "
                                         rf"uses '{word_tokenizer_dir}', which tokenize differently"):
        RewardEnsembleModule(members=[a, other])
    with pytest.raises(ValueError, match=r"init_args.tokenizer .* differs from the members' 'builtin:synthetic_shift'"):
        RewardEnsembleModule(members=[a, b], tokenizer=word_tokenizer_dir)
    with pytest.raises(ValueError, match="must be a non-empty list"):
        RewardEnsembleModule(members=[])
    ensemble = RewardEnsembleModule(members=[a, b])
    assert ensemble.tokenizer_name == "builtin:synthetic_shift"
    dm = tiny_data("builtin:synthetic_shift", cache_dir, max_length=128)
    with pytest.raises(ValueError, match="RewardEnsembleModule is for test / validate"):
        quiet_trainer(str(tmp_path / "fit"), max_steps=1).fit(ensemble, dm)
    with pytest.raises(ValueError, match="drop --ckpt_path"):
        quiet_trainer(str(tmp_path / "test")).test(ensemble, dm, ckpt_path=a, verbose=False)


def test_ensemble_has_every_evaluation_metric_of_a_single_model(students, word_tokenizer_dir):
    """The ensemble builds RewardModelModule's evaluation state itself (it has no backbone of its own): a metric added
    there must be added here too."""
    (a, _), _ = students
    plain, ensemble = tiny_model(word_tokenizer_dir), RewardEnsembleModule(members=[a])
    metrics = {n for n, m in plain.named_children() if isinstance(m, (Metric, SplitMetrics))}
    assert metrics and metrics == {n for n, m in ensemble.named_children() if isinstance(m, (Metric, SplitMetrics))}
    for name in ("transfer", "frozen_reference", "frozen_prefix", "wise_ft_alpha"):
        assert getattr(ensemble, name) is None
    assert ensemble.reference_coef == 0.0
