"""Export to transformers and back (docs/export.md).

The exported directories are scored in a fresh Python process that cannot import this codebase (its top-level
packages are blocked, the repository is not on sys.path, the cwd is elsewhere), by the model card's own code:
rewards equal the module's on fixture pairs (right and left padding) for tiny Qwen2 / Llama / GPT-2, merged LoRA
and PEFT adapters, a tokenizer whose pad token is its EOS, mean pooling and the shipped MiniLM teacher. Policies:
`pipeline("text-generation")` gives our greedy completions. Outside classifiers come back in as
`--model.backbone hf_classifier:<dir>` with the accuracies of the module they were exported from.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from callbacks.reference_model import ReferenceModelCallback
from cli import main
from datamodules.preference.pair_tokenization import PairTokenizer
from datamodules.preference.sources import build_source
from datamodules.tokenizers import build_wordlevel_tokenizer, load_tokenizer
from lightning_modules.export.__main__ import export_checkpoint
from lightning_modules.export.reward_model import ExportError, pad_rows
from lightning_modules.reward.backbones import LoraSpec
from lightning_modules.reward.reward_model import RewardModelModule
from tests.conftest import HUB_FIXTURES, _fixture_words
from tests.helpers import SOURCE, TARGETS, quiet_trainer, synth_options, tiny_data, tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = ("cli", "cli_guards", "lightning_modules", "datamodules", "callbacks", "protocols", "analysis", "benchmarks")
LORA = LoraSpec(r=4, alpha=8)
SMALL = dict(n_train=64, n_validation=8, n_test=16)

# name -> (backbone, lora, --lora_only, pooling, tokenizer: "words" | "words_pad_eos" | "minilm")
CASES = {
    "qwen2": ("tiny-qwen2", None, False, "last", "words"),
    "qwen2_lora_merged": ("tiny-qwen2", LORA, False, "last", "words"),
    "qwen2_lora_adapter": ("tiny-qwen2", LORA, True, "last", "words"),
    "llama": ("tiny-llama", None, False, "last", "words"),
    "llama_lora_merged": ("tiny-llama", LORA, False, "last", "words"),
    "llama_lora_adapter": ("tiny-llama", LORA, True, "last", "words"),
    "gpt2": ("tiny-gpt2", None, False, "last", "words"),
    "gpt2_lora_merged": ("tiny-gpt2", LORA, False, "last", "words"),
    "gpt2_lora_adapter": ("tiny-gpt2", LORA, True, "last", "words"),
    "gpt2_pad_is_eos": ("tiny-gpt2", None, False, "last", "words_pad_eos"),
    "qwen2_mean_pooling": ("tiny-qwen2", None, False, "mean", "words"),
    "minilm_teacher": ("minilm", None, False, "mean", "minilm"),
}

SCORER = r'''
import json, re, sys

BLOCKED = set(sys.argv[3].split(","))


class NoShiftgen:  # the export must stand alone: importing this codebase fails here
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"the exported model imported {name}")


sys.meta_path.insert(0, NoShiftgen())
jobs, out = json.load(open(sys.argv[1])), {}
for job in [j for j in jobs if not j.get("pipeline")]:
    card = open(job["dir"] + "/README.md").read()
    ns = {}
    exec(re.search(r"```python\n(.*?)```", card, re.S).group(1), ns)  # the card's code, as a user runs it
    result = {"class": type(ns.get("rm", ns.get("backbone"))).__name__}
    for side in ("right", "left"):
        ns["tok"].padding_side = side
        result[side] = [ns["rewards"](p["prompt"], [p["chosen"], p["rejected"]]).tolist() for p in job["pairs"]]
    out[job["name"]] = result
for job in [j for j in jobs if j.get("pipeline")]:
    from transformers import pipeline

    generate = pipeline("text-generation", model=job["dir"])
    out[job["name"]] = {"texts": [generate(p, return_full_text=False)[0]["generated_text"] for p in job["prompts"]]}
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
out["_leaked"] = leaked
json.dump(out, open(sys.argv[2], "w"))
'''


def run_fresh_python(jobs: list[dict], workdir) -> dict:
    """Score exported directories in a new interpreter that has never seen this codebase."""
    workdir.mkdir(exist_ok=True)
    script, jobs_path, out_path = workdir / "score.py", workdir / "jobs.json", workdir / "out.json"
    script.write_text(SCORER)
    jobs_path.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", str(script), str(jobs_path), str(out_path), ",".join(OURS)],
                          cwd=str(workdir), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(out_path.read_text())
    assert out.pop("_leaked") == []
    return out


def fixture_pairs() -> list[dict]:
    pairs = []
    for name in ("hh_helpful", "helpsteer3", "pku_saferlhf"):
        part = build_source(name, os.path.join(HUB_FIXTURES, name)).load("test")
        pairs += [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in part.records[:3]]
    return pairs


@torch.no_grad()
def module_rewards(module, pairs: list[dict], side: str = "right") -> list[list[float]]:
    """[r(chosen), r(rejected)] per pair, by the module on our own tokenization, one pair per batch like the card's
    `rewards(prompt, [chosen, rejected])` (GPT-2's absolute positions make left padding batch-dependent)."""
    tok = load_tokenizer(module.tokenizer_name)
    enc = PairTokenizer(tok, max_length=512)({k: [p[k] for p in pairs] for k in ("prompt", "chosen", "rejected")})
    return [module(*pad_rows([a, b], tok.pad_token_id, side))[0].tolist()
            for a, b in zip(enc["a_input_ids"], enc["b_input_ids"])]


def _tokenizer(kind: str, word_tokenizer_dir: str, root) -> str:
    if kind == "words":
        return word_tokenizer_dir
    if kind == "minilm":
        return "minilm"
    path = str(root / "tok_pad_eos")
    if not os.path.isdir(path):
        from datamodules.preference.synthetic_shift import synthetic_vocabulary

        tok = build_wordlevel_tokenizer(_fixture_words() | set(synthetic_vocabulary()))
        tok.pad_token = tok.eos_token  # GPT-2's usual setup: no pad token of its own
        tok.save_pretrained(path)
    return path


def _train(backbone, lora, pooling, tokenizer, root, epochs=2, **model_kw):
    torch.manual_seed(0)
    dm = tiny_data(tokenizer, str(root / "cache"), source_options=synth_options(**SMALL))
    extra = {"keep_layers": 1} if backbone == "minilm" else {}
    module = tiny_model(tokenizer, lr=1e-2, backbone=backbone, lora=lora, pooling=pooling, **extra, **model_kw)
    trainer = quiet_trainer(str(root), max_epochs=epochs, limit_val_batches=0, callbacks=[ReferenceModelCallback()])
    trainer.fit(module, dm)
    return module, trainer, dm


GROUPS = {  # trained, exported and scored together: one fresh interpreter per group keeps each test's setup short
    "qwen2": ["qwen2", "qwen2_lora_merged", "qwen2_lora_adapter"],
    "llama": ["llama", "llama_lora_merged", "llama_lora_adapter"],
    "gpt2": ["gpt2", "gpt2_lora_merged", "gpt2_lora_adapter", "gpt2_pad_is_eos"],
    "mean": ["qwen2_mean_pooling", "minilm_teacher"],
}


@pytest.fixture(scope="module")
def exported(word_tokenizer_dir, tmp_path_factory):
    """name -> {"theirs", "ours"} per case, computed a group at a time on first use: every case trained (2 epochs on
    32 pairs), exported, and scored by a fresh interpreter."""
    root = tmp_path_factory.mktemp("export")
    pairs = fixture_pairs()
    results: dict = {"root": root}

    def get(name: str) -> dict:
        if name not in results:
            group = next(g for g in GROUPS.values() if name in g)
            trained, jobs, ours = {}, [], {}
            for case in group:
                backbone, lora, lora_only, pooling, tok_kind = CASES[case]
                key = (backbone, lora is not None, pooling, tok_kind)
                if key not in trained:
                    tokenizer = _tokenizer(tok_kind, word_tokenizer_dir, root)
                    module, trainer, _ = _train(backbone, lora, pooling, tokenizer, root)
                    ckpt = str(root / f"{case}.ckpt")
                    trainer.save_checkpoint(ckpt)
                    trained[key] = (module.eval(), ckpt)
                module, ckpt = trained[key]
                out_dir = str(root / "out" / case)
                if case == "qwen2":  # the documented command, through cli.py
                    main(["export", "--ckpt_path", ckpt, "--out_dir", out_dir])
                else:
                    export_checkpoint(ckpt, out_dir, lora_only=lora_only)
                ours[case] = {side: module_rewards(module, pairs, side) for side in ("right", "left")}
                if lora is not None:
                    with module.backbone.disable_adapter():
                        ours[case]["without_adapters"] = module_rewards(module, pairs)
                jobs.append({"name": case, "dir": out_dir, "pairs": pairs})
            theirs = run_fresh_python(jobs, root / f"fresh_{group[0]}")
            results.update({case: {"ours": ours[case], "theirs": theirs[case]} for case in group})
        return results[name]

    results["get"] = get
    return results


# The llama group joins `make test-slow` (the fast suite's budget): qwen2's group covers the same rotary/RMSNorm path
@pytest.mark.parametrize("name", [pytest.param(c, marks=pytest.mark.slow) if c in GROUPS["llama"] else c
                                  for c in CASES])
def test_exported_reward_model_scores_like_the_module(exported, name):
    case = exported["get"](name)
    ours, theirs = case["ours"], case["theirs"]
    for side in ("right", "left"):
        got, want = torch.tensor(theirs[side]), torch.tensor(ours[side])
        assert got.shape == want.shape == (9, 2)
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (side, (got - want).abs().max())
    assert torch.tensor(ours["right"]).std() > 1e-3  # not a constant scorer
    if "without_adapters" in ours:  # the adapters are trained and carried: without them the scores move
        assert (torch.tensor(ours["without_adapters"]) - torch.tensor(ours["right"])).abs().max() > 1e-3
    backbone, _, lora_only, pooling, _ = CASES[name]
    if pooling == "last":  # a standard transformers class; the adapter loads onto one
        assert theirs["class"] == ("PeftModelForSequenceClassification" if lora_only
                                   else {"tiny-qwen2": "Qwen2", "tiny-llama": "Llama", "tiny-gpt2": "GPT2"}[backbone]
                                   + "ForSequenceClassification")
    else:
        assert theirs["class"] == "PooledRewardModel"


def test_pad_token_equal_to_eos_gets_a_new_pad_token(exported):
    exported["get"]("gpt2_pad_is_eos")
    out = os.path.join(exported["root"], "out", "gpt2_pad_is_eos")
    tok = json.load(open(os.path.join(out, "tokenizer_config.json")))
    config = json.load(open(os.path.join(out, "config.json")))
    vocab = json.load(open(os.path.join(out, "tokenizer.json")))["added_tokens"]
    new_id = {t["content"]: t["id"] for t in vocab}["<|reward_pad|>"]
    assert tok["pad_token"] == "<|reward_pad|>" and config["pad_token_id"] == new_id
    assert config["vocab_size"] == new_id + 1
    assert "pad token was its EOS" in open(os.path.join(out, "README.md")).read()


def test_model_card_states_provenance_and_results(word_tokenizer_dir, tmp_path):
    module, trainer, dm = _train("tiny-qwen2", None, "last", word_tokenizer_dir, tmp_path, epochs=1, anchor_coef=0.5)
    trainer.test(module, dm, verbose=False)
    ckpt, results = str(tmp_path / "m.ckpt"), tmp_path / "test_results.json"
    trainer.save_checkpoint(ckpt)
    results.write_text(json.dumps(module.test_results))
    export_checkpoint(ckpt, str(tmp_path / "with"), results=str(results))
    card = open(tmp_path / "with" / "README.md").read()
    acc = 100 * module.test_results[SOURCE]["acc"]
    assert f"| {SOURCE} | ID | 16 | {acc:.2f} |" in card
    for target in TARGETS:
        assert f"| {target} | OOD | 16 | {100 * module.test_results[target]['acc']:.2f} |" in card
    assert "| ANCHOR λ (anchor_coef) | 0.5 on depth fractions [1.0] |" in card
    assert f"`{SOURCE}`, teacher half, gold" in card and "| seed | 0 (data seed 0) |" in card
    export_checkpoint(ckpt, str(tmp_path / "without"))
    assert "Accuracies: not measured" in open(tmp_path / "without" / "README.md").read()


def test_protocol_stage_results_are_found_beside_the_checkpoint(word_tokenizer_dir, tmp_path):
    module, trainer, _ = _train("tiny-qwen2", None, "last", word_tokenizer_dir, tmp_path, epochs=1)
    stage = tmp_path / "seed0" / "naive"
    stage.mkdir(parents=True)
    ckpt = str(stage / "final.ckpt")
    trainer.save_checkpoint(ckpt)
    result = {"test": {SOURCE: {"acc": 0.8125, "pairs": 16}, TARGETS[0]: {"acc": 0.5, "pairs": 16}},
              "checkpoint": ckpt}
    (stage / "result.json").write_text(json.dumps(result))
    export_checkpoint(ckpt, str(tmp_path / "out"))
    card = open(tmp_path / "out" / "README.md").read()
    assert f"| {SOURCE} | ID | 16 | 81.25 |" in card and f"| {TARGETS[0]} | OOD | 16 | 50.00 |" in card


# ---- refusals ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_ckpt(word_tokenizer_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    module, trainer, _ = _train("tiny-qwen2", None, "last", word_tokenizer_dir, root, epochs=1)
    ckpt = str(root / "plain.ckpt")
    trainer.save_checkpoint(ckpt)
    return ckpt


def _with_hparams(ckpt: str, tmp_path, **changes) -> str:
    data = torch.load(ckpt, map_location="cpu", weights_only=False)
    data["hyper_parameters"].update(changes)
    path = str(tmp_path / "edited.ckpt")
    torch.save(data, path)
    return path


def _refusal(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(["export", *args])
    assert info.value.code == 2
    return capsys.readouterr().err


def test_quantized_backbone_is_refused(plain_ckpt, tmp_path, capsys):
    ckpt = _with_hparams(plain_ckpt, tmp_path, quantization="4bit", lora={"r": 4})
    err = _refusal(["--ckpt_path", ckpt, "--out_dir", str(tmp_path / "out")], capsys)
    assert "refused: the checkpoint's backbone is quantized (--model.quantization 4bit)" in err
    assert not os.path.exists(tmp_path / "out")


def test_lora_only_without_lora_is_refused(plain_ckpt, tmp_path, capsys):
    err = _refusal(["--ckpt_path", plain_ckpt, "--out_dir", str(tmp_path / "out"), "--lora_only"], capsys)
    assert "refused: --lora_only: the checkpoint has no LoRA adapters" in err


def test_lora_only_with_mean_pooling_is_refused(word_tokenizer_dir, tmp_path):
    module, trainer, _ = _train("tiny-qwen2", LORA, "mean", word_tokenizer_dir, tmp_path, epochs=1)
    trainer.save_checkpoint(str(tmp_path / "m.ckpt"))
    with pytest.raises(ExportError, match="--lora_only: Qwen2Model with mean pooling has no transformers class"):
        export_checkpoint(str(tmp_path / "m.ckpt"), str(tmp_path / "out"), lora_only=True)
    assert not os.listdir(tmp_path / "out") if os.path.isdir(tmp_path / "out") else True


def test_existing_out_dir_and_foreign_files_are_refused(plain_ckpt, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    err = _refusal(["--ckpt_path", plain_ckpt, "--out_dir", str(tmp_path / "full")], capsys)
    assert "--out_dir" in err and "exists and is not empty" in err
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    err = _refusal(["--ckpt_path", str(tmp_path / "notes.txt"), "--out_dir", str(tmp_path / "o")], capsys)
    assert "is not a torch checkpoint" in err


def test_checkpoint_written_by_the_cli_exports(plain_ckpt, tmp_path):
    """LightningCLI adds `_class_path` to the saved hyperparameters; the export must not pass it to the module."""
    ckpt = _with_hparams(plain_ckpt, tmp_path, _class_path="lightning_modules.reward.reward_model.RewardModelModule")
    facts = export_checkpoint(ckpt, str(tmp_path / "out"))
    assert facts["max_abs_diff"] <= 1e-5 and os.path.isfile(tmp_path / "out" / "model.safetensors")


def test_a_scoring_difference_refuses_the_export(plain_ckpt, tmp_path, monkeypatch):
    import lightning_modules.export.reward_model as rm

    monkeypatch.setattr(rm, "module_scores", lambda *a: {s: torch.zeros(5) + 1.0 for s in ("right", "left")})
    with pytest.raises(ExportError, match="scores differently from the checkpoint"):
        export_checkpoint(plain_ckpt, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out") and not any(p.name.startswith("out.tmp") for p in tmp_path.iterdir())


# ---- bring your own reward model ----------------------------------------------------------------------------------------
def _cli_test_args(backbone: str, tokenizer: str, cache: str, root: str) -> list[str]:
    return ["test", "--config", os.path.join(ROOT, "configs", "trainer", "cpu.yaml"),
            "--model.class_path=lightning_modules.reward.reward_model.RewardModelModule",
            f"--model.backbone={backbone}", f"--model.tokenizer={tokenizer}",
            "--data.class_path=datamodules.preference.datamodule.PreferenceDataModule", f"--data.source={SOURCE}",
            f"--data.ood_targets={json.dumps(TARGETS)}", f"--data.source_options={json.dumps(synth_options(**SMALL))}",
            "--data.batch_size=16", "--data.eval_batch_size=16", "--data.max_length=96", f"--data.cache_dir={cache}",
            "--trainer.logger=false", f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false",
            "--verbose=false"]


@pytest.mark.parametrize("name", ["qwen2", "gpt2_pad_is_eos",
                                  pytest.param("llama_lora_merged", marks=pytest.mark.slow)])  # slow: as above
def test_exported_model_comes_back_with_the_same_accuracies(exported, word_tokenizer_dir, name):
    """Round trip: `cli.py test --model.backbone hf_classifier:<export>` = the module's own test accuracies."""
    root = exported["root"]
    exported["get"](name)
    backbone, lora, _, pooling, tok_kind = CASES[name]
    ckpt = str(root / f"{name}.ckpt")
    module = RewardModelModule.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False)
    tokenizer = _tokenizer(tok_kind, word_tokenizer_dir, root)
    dm = tiny_data(tokenizer, str(root / "cache"), source_options=synth_options(**SMALL))
    quiet_trainer(str(root)).test(module, dm, verbose=False)
    out = str(root / "out" / name)
    # transformers 5's AutoTokenizer gives a qwen2 directory the Qwen2 tokenizer class whatever it holds, so our
    # word-level tokenizer is given by its own directory there (the card loads it with PreTrainedTokenizerFast)
    cli = main(_cli_test_args(f"hf_classifier:{out}", tokenizer if name == "qwen2" else out, str(root / "cache"),
                              str(root / f"byo_{name}")))
    before, after = module.test_results, cli.model.test_results
    assert list(after) == [SOURCE, *TARGETS]
    for split in after:
        assert after[split] == before[split], split  # same pairs counted, same accuracy
    assert {before[s]["acc"] for s in before} != {0.5}


def test_outside_classifier_refuses_training_options(exported):
    exported["get"]("qwen2")  # an export the fast suite makes anyway
    out = os.path.join(exported["root"], "out", "qwen2")
    with pytest.raises(ValueError, match=r"only evaluates; these options need our backbone \+ head: "
                                         r"--model.anchor_coef 0.1, --model.pooling 'mean'"):
        RewardModelModule(backbone=f"hf_classifier:{out}", tokenizer=out, anchor_coef=0.1, pooling="mean")
    module = RewardModelModule(backbone=f"hf_classifier:{out}")  # the tokenizer defaults to the same directory
    assert module.tokenizer_name == out and module.head is None
    with pytest.raises(ValueError, match="is an outside reward model scored whole: it evaluates"):
        module.on_fit_start()


def test_outside_classifier_with_several_labels_is_refused(exported, tmp_path):
    exported["get"]("qwen2")
    from transformers import AutoModelForSequenceClassification

    out = os.path.join(exported["root"], "out", "qwen2")
    two = AutoModelForSequenceClassification.from_pretrained(out, num_labels=2, ignore_mismatched_sizes=True)
    two.save_pretrained(str(tmp_path / "two"))
    load_tokenizer(out).save_pretrained(str(tmp_path / "two"))
    with pytest.raises(ValueError, match="has 2 outputs .* a reward model has one"):
        RewardModelModule(backbone=f"hf_classifier:{tmp_path / 'two'}")


# ---- policies ---------------------------------------------------------------------------------------------------------------
def test_exported_policy_generates_our_greedy_completions(tmp_path):
    import lightning as L

    from datamodules.triggers.datamodule import TriggerDataModule, encode_prompt, left_pad
    from lightning_modules.policy.sft import PolicySFTModule

    torch.manual_seed(0)
    dm = TriggerDataModule(family="two_policies", num_train=48, batch_size=16, num_val_per_distribution=3,
                           cache_dir=str(tmp_path / "cache"))
    module = PolicySFTModule(n_layer=1, n_embd=32, n_head=2, max_positions=96, max_new_tokens=12, lr=1e-4,
                             eval_generate=False, stop_fidelity=None)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0)
    trainer.fit(module, dm)
    with torch.no_grad():  # a tiny model trained for seconds says one thing to every prompt; large random weights
        for p in module.model.parameters():  # make completions depend on the prompt, so equality checks something
            p.add_(torch.randn_like(p))
    trainer.save_checkpoint(str(tmp_path / "sft.ckpt"))
    main(["export", "--ckpt_path", str(tmp_path / "sft.ckpt"), "--out_dir", str(tmp_path / "policy")])

    prompts = [it["prompt"] for it in dm.val_items]
    tok = dm.tokenizer
    ids, mask = left_pad([encode_prompt(tok, p) for p in prompts], tok.pad_token_id)
    module.eval()
    comp, _ = module.sample(ids, mask, temperature=0.0)  # the evaluation's own sampler, greedy
    ours = [t.strip() for t in tok.batch_decode(comp, skip_special_tokens=True)]
    theirs = run_fresh_python([{"name": "policy", "dir": str(tmp_path / "policy"), "pipeline": True,
                                "prompts": prompts, "pairs": []}], tmp_path / "fresh")
    assert [t.strip() for t in theirs["policy"]["texts"]] == ours
    assert len(set(ours)) > 1 and all(ours)  # real, prompt-dependent completions
    card = open(tmp_path / "policy" / "README.md").read()
    assert 'pipeline("text-generation"' in card and "Alice" in card
