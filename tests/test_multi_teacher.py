"""Multi-teacher weak-to-strong (docs/multi_teacher.md): the mixture objective against hand values, its logits'
gradient and optimiser group, the data's (B, K+1) teacher labels, the refusals, and a tiny protocol run with two extra
teachers whose rows stay scored against the main teacher."""
import glob
import json
import math
import os

import pytest
import torch

from datamodules.preference.datamodule import PreferenceDataModule
from datamodules.preference.sources import DataError
from lightning_modules.reward.objectives import MultiTeacherSoftBT, resolve_objective_class
from protocols.w2s.protocol import main as run_protocol
from tests.helpers import quiet_trainer, tiny_data, tiny_model, tiny_teacher_checkpoint
from tests.test_w2s_protocol import SRC, TARGETS, _stage_acc, _tiny_protocol, _write


def _hand_loss(margins: list[float], labels: list[list[float]], w: list[float]) -> float:
    """mean_i −[q̄_i log σ(Δ_i) + (1 − q̄_i) log σ(−Δ_i)], q̄_i = Σ_k w_k q_ik, in plain floats."""
    total = 0.0
    for d, qs in zip(margins, labels):
        qbar = sum(wk * qk for wk, qk in zip(w, qs))
        total -= qbar * math.log(1 / (1 + math.exp(-d))) + (1 - qbar) * math.log(1 / (1 + math.exp(d)))
    return total / len(margins)


MARGINS = [1.5, -0.5, 0.25, -2.0]
LABELS = [[0.9, 0.2], [0.3, 0.8], [0.6, 0.1], [0.2, 0.7]]


def _objective(logits: list[float], **kwargs) -> MultiTeacherSoftBT:
    objective = MultiTeacherSoftBT(num_teachers=len(logits), **kwargs)
    with torch.no_grad():
        objective.logits.copy_(torch.tensor(logits))
    return objective


def test_the_loss_is_the_bce_of_the_hand_mixture():
    objective = _objective([0.0, math.log(3.0)])  # w = [1/4, 3/4]
    assert objective.weights().tolist() == pytest.approx([0.25, 0.75], abs=1e-7)
    loss = objective(torch.tensor(MARGINS), torch.tensor(LABELS), 0.0)
    assert float(loss) == pytest.approx(_hand_loss(MARGINS, LABELS, [0.25, 0.75]), abs=1e-6)
    assert objective.mixture(torch.tensor(LABELS)).tolist() == pytest.approx(
        [0.25 * a + 0.75 * b for a, b in LABELS], abs=1e-6)
    # uniform at the start
    assert MultiTeacherSoftBT(num_teachers=3).weights().tolist() == pytest.approx([1 / 3] * 3)
    assert resolve_objective_class("multi_teacher") is MultiTeacherSoftBT


def test_the_logits_move_as_the_hand_derivative_says():
    """∂L/∂logit_k = −w_k · mean_i Δ_i (q_ik − q̄_i): one SGD step moves the logits by −lr times that, towards the
    teacher whose labels lie on the side of the student's margins (teacher 0 here)."""
    objective = _objective([0.0, math.log(3.0)])
    w = [0.25, 0.75]
    qbar = [w[0] * a + w[1] * b for a, b in LABELS]
    grad = [-w[k] * sum(d * (qs[k] - qb) for d, qs, qb in zip(MARGINS, LABELS, qbar)) / len(MARGINS)
            for k in range(2)]
    assert grad[0] < 0 < grad[1]  # teacher 0 agrees with the margins' signs, teacher 1 disagrees
    before = objective.logits.detach().clone()
    optimizer = torch.optim.SGD(objective.parameters(), lr=0.5)
    objective(torch.tensor(MARGINS), torch.tensor(LABELS), 0.0).backward()
    assert objective.logits.grad.tolist() == pytest.approx(grad, abs=1e-6)
    optimizer.step()
    assert (objective.logits.detach() - before).tolist() == pytest.approx([-0.5 * g for g in grad], abs=1e-6)
    assert objective.weights()[0] > 0.25  # weight moved towards the teacher the student agrees with


def test_the_reward_model_optimises_the_logits_in_their_own_group(word_tokenizer_dir):
    model = tiny_model(word_tokenizer_dir, objective=MultiTeacherSoftBT(num_teachers=3, weights_lr=0.07))
    assert "objective.logits" in model.state_dict()
    groups = model.configure_optimizers().param_groups
    assert len(groups) == 2 and len(groups[1]["params"]) == 1 and groups[1]["params"][0] is model.objective.logits
    assert groups[1]["lr"] == 0.07 and groups[1]["weight_decay"] == 0.0 and groups[0]["lr"] == 3e-3
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in model.parameters())
    plain = tiny_model(word_tokenizer_dir)  # any other objective: one flat list, as before
    assert len(plain.configure_optimizers().param_groups) == 1


def test_refusals_of_the_objective_and_of_the_protocol(word_tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="num_teachers must be an integer >= 2"):
        MultiTeacherSoftBT(num_teachers=1)
    with pytest.raises(ValueError, match="weights_lr must be > 0"):
        MultiTeacherSoftBT(weights_lr=0.0)
    with pytest.raises(ValueError, match=r"num_teachers is 3, but the batch holds \(4, 2\) teacher labels"):
        MultiTeacherSoftBT(num_teachers=3)(torch.tensor(MARGINS), torch.tensor(LABELS), 0.0)
    model = tiny_model(word_tokenizer_dir, objective=MultiTeacherSoftBT(num_teachers=2))
    with pytest.raises(ValueError, match="give --data.extra_teacher_checkpoints"):
        model._preference_loss(torch.tensor(MARGINS), {"labels": torch.tensor([0.9, 0.3, 0.6, 0.2])})
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"),
                         methods=[{"name": "multi", "objective": "multi_teacher"}])
    with pytest.raises(ValueError, match="--extra_teachers is empty"):
        run_protocol(["--config", _write(tmp_path, cfg), "--status"])
    extra = [{"name": "teacher_b", "args": []}]
    for methods, extras, message in [
        ([{"name": "s", "teacher": "teacher_x"}], extra, r"teacher\(s\) \['teacher_x'\] are not among"),
        ([{"name": "s", "sweep": {"teacher": ["teacher", "nope"]}}], extra, r"\['nope'\] are not among"),
        ([{"name": "teacher_b"}], extra, r"names \['teacher_b'\] repeat or are taken"),
        ([{"name": "m", "objective": "multi_teacher", "teacher": "teacher_b"}], extra, "reads every teacher"),
        ([{"name": "m", "objective": "multi_teacher", "objective_args": {"num_teachers": 3}}], extra,
         "num_teachers 3 must be 1 \\+ the 1 --extra_teachers"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_protocol(["--config", _write(tmp_path, dict(cfg, methods=methods, extra_teachers=extras)),
                          "--status"])


@pytest.fixture(scope="module")
def teachers(tmp_path_factory, word_tokenizer_dir) -> tuple[str, list[str]]:
    """Three tiny teachers (2, 4 and 6 steps on the teacher half) and a label cache shared by this file's tests."""
    cache = str(tmp_path_factory.mktemp("mt_cache"))
    ckpts = [tiny_teacher_checkpoint(tmp_path_factory, word_tokenizer_dir, cache, max_steps=n) for n in (2, 4, 6)]
    return cache, ckpts


def _student_data(tok: str, cache: str, ckpts: list[str], **kwargs) -> PreferenceDataModule:
    dm = tiny_data(tok, cache, train_subset="student", teacher_checkpoint=ckpts[0],
                   extra_teacher_checkpoints=ckpts[1:], **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _ids(dm: PreferenceDataModule, kind: str, batch: dict) -> list[str]:
    """The record ids of a batch's pairs (`index` is a pair's position among its split's records)."""
    cols = dm.datasets[kind].cols
    by_index = dict(zip(cols["index"], cols["id"]))
    return [by_index[i] for i in batch["index"].tolist()]


def _label_file(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def test_batches_carry_every_teachers_labels_and_the_main_teachers_margins(word_tokenizer_dir, teachers):
    cache, ckpts = teachers
    dm = _student_data(word_tokenizer_dir, cache, ckpts)
    files = [_label_file(dm.weak_labels_path)] + [_label_file(p) for p in dm.extra_weak_labels_paths]
    assert [f["meta"]["teacher_checkpoint"] for f in files] == [os.path.abspath(c) for c in ckpts]
    batch = next(iter(dm.train_dataloader()))
    assert batch["teacher_labels"].shape == (len(batch["labels"]), 3)
    assert torch.equal(batch["teacher_labels"][:, 0], batch["labels"])
    ids = _ids(dm, "train_student", batch)
    for k, f in enumerate(files):  # column k = teacher k's q of the same (a, b): one order coin for all
        assert batch["teacher_labels"][:, k].tolist() == pytest.approx([f["labels"][i][0] for i in ids], abs=1e-6)
        assert [f["labels"][i][1] for i in ids] == [files[0]["labels"][i][1] for i in ids]
    assert not torch.allclose(batch["teacher_labels"][:, 1], batch["teacher_labels"][:, 0])
    assert len(dm.manifest["extra_teacher_labels"]) == 2 and dm.manifest["label_teacher"] == 0

    # another teacher's labels for training, the main teacher's margins for the scores
    other = _student_data(word_tokenizer_dir, cache, ckpts, label_teacher=2)
    batch = next(iter(other.train_dataloader()))
    assert torch.equal(batch["labels"], batch["teacher_labels"][:, 2])
    test = next(iter(other.test_dataloader()[0]))
    test_ids = _ids(other, f"test/{other.source}", test)
    assert test["teacher_margin"].tolist() == pytest.approx(
        [files[0]["teacher_margins"][other.source][i] for i in test_ids], abs=1e-5)
    assert "teacher_labels" not in test  # evaluation batches: margins only


def test_the_data_refuses_bad_extra_teachers(word_tokenizer_dir, teachers, tmp_path):
    cache, ckpts = teachers
    missing = str(tmp_path / "nowhere.ckpt")
    with pytest.raises(ValueError, match=r"--data.extra_teacher_checkpoints\[1\] '.*nowhere.ckpt' does not exist"):
        tiny_data(word_tokenizer_dir, cache, train_subset="student", teacher_checkpoint=ckpts[0],
                  extra_teacher_checkpoints=[ckpts[1], missing])
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"--data.extra_teacher_checkpoints\[0\] '.*corrupt.ckpt' is not a torch"):
        tiny_data(word_tokenizer_dir, cache, train_subset="student", teacher_checkpoint=ckpts[0],
                  extra_teacher_checkpoints=[str(corrupt)])
    with pytest.raises(ValueError, match="--data.label_teacher must be an integer in \\[0, 1\\]"):
        tiny_data(word_tokenizer_dir, cache, train_subset="student", teacher_checkpoint=ckpts[0],
                  extra_teacher_checkpoints=[ckpts[1]], label_teacher=2)
    with pytest.raises(ValueError, match="needs a main teacher"):
        tiny_data(word_tokenizer_dir, cache, train_subset="student", extra_teacher_checkpoints=[ckpts[1]])
    with pytest.raises(ValueError, match="twice"):
        tiny_data(word_tokenizer_dir, cache, train_subset="student", teacher_checkpoint=ckpts[0],
                  extra_teacher_checkpoints=[ckpts[0]])
    # a label file that lacks a training pair (its own cache folder: the shared one stays intact)
    own_cache = str(tmp_path / "cache")
    path = _student_data(word_tokenizer_dir, own_cache, ckpts[:2]).extra_weak_labels_paths[0]
    payload = _label_file(path)
    payload["labels"].pop(next(iter(payload["labels"])))
    with open(path, "w") as f:
        json.dump(payload, f)
    with pytest.raises(DataError, match=r"--data.extra_teacher_checkpoints\[0\] .*: its label file .* has no label "
                                        r"for 1 training pairs"):
        _student_data(word_tokenizer_dir, own_cache, ckpts[:2])


def test_a_multi_teacher_fit_trains_logs_and_checkpoints_the_weights(word_tokenizer_dir, teachers, tmp_path):
    cache, ckpts = teachers
    torch.manual_seed(0)
    model = tiny_model(word_tokenizer_dir, objective=MultiTeacherSoftBT(num_teachers=3, weights_lr=0.1))
    trainer = quiet_trainer(str(tmp_path), max_steps=3, limit_val_batches=0)
    trainer.fit(model, tiny_data(word_tokenizer_dir, cache, train_subset="student", teacher_checkpoint=ckpts[0],
                                 extra_teacher_checkpoints=ckpts[1:]))
    logits = model.objective.logits.detach().clone()
    assert not torch.allclose(logits, torch.zeros(3))  # optimised
    logged = trainer.callback_metrics
    logged_weights = [float(logged[f"train/teacher_weight/{k}"]) for k in range(3)]
    assert sum(logged_weights) == pytest.approx(1.0, abs=1e-6)
    assert logged_weights == pytest.approx(torch.softmax(logits, 0).tolist(), abs=0.05)  # before the last update
    assert 0.0 <= float(logged["train/agree"]) <= 1.0
    path = str(tmp_path / "multi.ckpt")
    trainer.save_checkpoint(path)
    restored = tiny_model(word_tokenizer_dir, objective=MultiTeacherSoftBT(num_teachers=3))
    restored.load_state_dict(torch.load(path, weights_only=False)["state_dict"])
    assert torch.equal(restored.objective.logits, logits)
    from lightning_modules.reward.weak_labeller import load_teacher  # a member / teacher: the logits are dropped

    assert not hasattr(load_teacher(path).objective, "logits")


@pytest.mark.slow  # a whole protocol run (15-25 s): make test-slow; the fast suite keeps its parts' unit tests
def test_a_protocol_with_two_extra_teachers(tmp_path, word_tokenizer_dir, cache_dir):
    """Extra teacher stages, a row of the best single teacher (a sweep over teachers) and a multi-teacher row: the
    weights in result.json sum to 1, and every row's scores are against the main teacher's own test accuracies."""
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, extra_args=("--trainer.log_every_n_steps=1",),
                         extra_teachers=[{"name": "teacher_b", "args": ["--seed_everything=11"]},
                                         {"name": "teacher_c", "args": ["--model.optimizer.init_args.lr=0.004"]}],
                         paired_reference="multi",
                         methods=[{"name": "best_single", "sweep": {"teacher": ["teacher", "teacher_b", "teacher_c"]}},
                                  {"name": "multi", "objective": "multi_teacher", "objective_args": {"weights_lr": 0.1}}])
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]
    assert list(results["rows"]) == ["teacher", "best_single", "multi"]  # the extra teachers are no rows
    main = _stage_acc(out, 0, "teacher")
    assert any(_stage_acc(out, 0, "teacher_b")[s] != main[s] for s in main)  # the check below can fail
    for stage in ("multi", "best_single@teacher=teacher_b", "best_single@teacher=teacher_c"):
        result = json.load(open(os.path.join(out, "seed0", stage, "result.json")))
        transfer = result["test"]["transfer"]
        assert transfer["acc_teacher"] == pytest.approx(main, abs=1e-6), stage
        assert transfer["wrg"] == pytest.approx(100.0 * result["test"][SRC]["acc"] - main[SRC], abs=1e-6)
        for t in TARGETS:
            assert transfer["aog"][t] == pytest.approx(100.0 * result["test"][t]["acc"] - main[t], abs=1e-6)
        assert result["identity"]["upstream"].keys() == {"teacher", "teacher_b", "teacher_c"}
    multi = json.load(open(os.path.join(out, "seed0", "multi", "result.json")))
    weights = multi["teacher_weights"]
    assert list(weights) == ["teacher", "teacher_b", "teacher_c"] and sum(weights.values()) == pytest.approx(1.0)
    assert weights != pytest.approx({k: 1 / 3 for k in weights}, abs=1e-4)  # the mixture moved
    logits = torch.load(multi["checkpoint"], weights_only=False)["state_dict"]["objective.logits"]
    assert list(weights.values()) == pytest.approx(torch.softmax(logits, 0).tolist(), abs=1e-6)
    args = json.load(open(os.path.join(out, "seed0", "best_single@teacher=teacher_c", "result.json")))["args"]
    assert "--data.label_teacher=2" in args and any(a.startswith("--data.extra_teacher_checkpoints=") for a in args)
    # every step logged the weights, per teacher
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(glob.glob(os.path.join(out, "seed0", "multi", "fit"))[0]).Reload()
    assert {f"train/teacher_weight/{k}" for k in range(3)} <= set(events.Tags()["scalars"])
    # the table: the best single teacher picked per seed, the weights per seed beside the teachers' accuracies
    assert set(results["selection"]["swept"]["best_single"]["id_val"].values()) <= {"teacher", "teacher_b",
                                                                                     "teacher_c"}
    md = open(os.path.join(out, "results.md")).read()
    assert "| best_single |" in md and "- best_single (teacher ∈ {teacher, teacher_b, teacher_c})" in md
    acc_b = _stage_acc(out, 0, "teacher_b")
    ood_b = sum(acc_b[t] for t in TARGETS) / len(TARGETS)
    assert f"| teacher_b | {acc_b[SRC]:.1f} | {ood_b:.1f} | {weights['teacher_b']:.3f} |" in md
    assert results["multi_teacher"]["per_seed"][0]["weights"]["multi"] == pytest.approx(weights)
