"""Bring your own reward model as the W2S teacher or a zero-shot row (docs/export.md, "Bring your own reward model").

A tiny Llama reward model is trained here and exported (`cli.py export`); `hf_classifier:<export>` then
- gives the same weak labels and teacher margins as the checkpoint it came from (≤ 1e-5), under its own cache key,
  which changes when the exported files do;
- is the protocol's teacher without fitting: the teacher row's accuracies are `cli.py test`'s of the same model, the
  student learns from its labels, and a zero-shot row's accuracies are the direct test's, with AOG against it;
- is refused, naming the flag and the path, when the directory is missing or holds no sequence classifier.
"""
import json
import os
import shutil

import pytest

from cli import main
from datamodules.preference.weak_labels import checkpoint_key, weak_label_path
from lightning_modules.export.__main__ import export_checkpoint
from protocols.w2s.protocol import StageChangedError, main as run_protocol, parse
from tests.helpers import synth_options, tiny_data
from tests.test_export import SMALL, _train
from tests.test_w2s_protocol import ROOT, SRC, SYNTH, TARGETS, _tiny_protocol, _write


@pytest.fixture(scope="module")
def exports(word_tokenizer_dir, tmp_path_factory):
    """A tiny Llama RM trained 2 epochs (the teacher) and 1 epoch (the zero-shot model), checkpoints and exports.
    Llama, not Qwen2: an exported Qwen2 directory's AutoTokenizer would re-split our word-level text (export.md)."""
    root = tmp_path_factory.mktemp("outside")
    out = {}
    for name, epochs in (("teacher_llama", 2), ("zs_llama", 1)):
        _, trainer, _ = _train("tiny-llama", None, "last", word_tokenizer_dir, root, epochs=epochs)
        ckpt = str(root / f"{name}.ckpt")
        trainer.save_checkpoint(ckpt)
        export_checkpoint(ckpt, str(root / name))
        out[name] = (ckpt, str(root / name))
    return out


def _labels(tokenizer: str, cache: str, teacher: str) -> dict:
    dm = tiny_data(tokenizer, cache, train_subset="student", teacher_checkpoint=teacher,
                   source_options=synth_options(**SMALL))
    dm.prepare_data()
    dm.setup("fit")
    with open(dm.weak_labels_path) as f:
        return {"path": dm.weak_labels_path, **json.load(f)}


def test_weak_labels_from_the_export_equal_the_checkpoints(exports, word_tokenizer_dir, tmp_path):
    ckpt, out = exports["teacher_llama"]
    cache = str(tmp_path / "cache")
    ours, theirs = _labels(word_tokenizer_dir, cache, ckpt), _labels(word_tokenizer_dir, cache, f"hf_classifier:{out}")
    assert ours["path"] != theirs["path"]  # another teacher, another cache entry: computed, not reused
    assert theirs["meta"]["teacher_checkpoint"] == f"hf_classifier:{os.path.abspath(out)}"
    assert theirs["meta"]["teacher_tokenizer"] == out
    assert ours["labels"].keys() == theirs["labels"].keys() and len(ours["labels"]) == 32
    for pair_id, (q, swapped) in ours["labels"].items():
        assert theirs["labels"][pair_id][1] == swapped
        assert abs(theirs["labels"][pair_id][0] - q) <= 1e-5, pair_id
    qs = [q for q, _ in ours["labels"].values()]
    assert max(qs) - min(qs) > 1e-2  # a trained teacher, not a constant one
    assert ours["teacher_margins"].keys() == theirs["teacher_margins"].keys() == {"synth_helpful_cooking",
                                                                                  "synth_helpful_science",
                                                                                  "synth_helpful_travel"}
    for split, margins in ours["teacher_margins"].items():
        assert margins.keys() == theirs["teacher_margins"][split].keys()
        assert max(abs(m - theirs["teacher_margins"][split][k]) for k, m in margins.items()) <= 1e-5, split


def test_weak_label_cache_key_follows_the_exported_files(exports, tmp_path):
    _, out = exports["teacher_llama"]
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    spec = f"hf_classifier:{copy}"
    key = checkpoint_key(spec)
    assert checkpoint_key(spec) == key and key.startswith(f"hf_classifier:{copy}:")
    with open(os.path.join(copy, "README.md"), "a") as f:
        f.write("\nedited card\n")  # the card does not score: same labels
    assert checkpoint_key(spec) == key
    records = [{"id": "a", "source": "s", "split": "train", "prompt": [], "chosen": "x", "rejected": "y"}]
    path = weak_label_path("c", spec, records, {}, 0, 96, "keep_response")
    weights = os.path.join(copy, "model.safetensors")
    st = os.stat(weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a new export written over it
    assert checkpoint_key(spec) != key
    assert weak_label_path("c", spec, records, {}, 0, 96, "keep_response") != path
    assert checkpoint_key(f"hf_classifier:{out}") != checkpoint_key(spec)  # another directory


def _broken_dirs(root, export: str) -> dict[str, tuple[str, str]]:
    """name -> (path, the error's words)."""
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("x")
    (root / "base").mkdir()
    config = json.load(open(os.path.join(export, "config.json")))
    json.dump(dict(config, architectures=["LlamaModel"]), open(root / "base" / "config.json", "w"))
    (root / "noweights").mkdir()
    shutil.copy(os.path.join(export, "config.json"), root / "noweights" / "config.json")
    (root / "file.txt").write_text("x")
    return {"missing": (str(root / "missing"), "there is no directory"),
            "no_config": (str(root / "empty"), "has no config.json"),
            "not_a_classifier": (str(root / "base"), "holds a LlamaModel, not a sequence classification model"),
            "no_weights": (str(root / "noweights"), "has no weights"),
            "a_file": (str(root / "file.txt"), "is a file, not directory")}


@pytest.mark.parametrize("case", ["missing", "no_config", "not_a_classifier", "no_weights", "a_file"])
def test_bad_outside_teacher_is_refused_naming_flag_and_path(exports, word_tokenizer_dir, tmp_path, case):
    from lightning_modules.reward.weak_labeller import load_teacher

    path, words = _broken_dirs(tmp_path, exports["teacher_llama"][1])[case]
    spec = f"hf_classifier:{path}"
    with pytest.raises(ValueError) as err:
        tiny_data(word_tokenizer_dir, str(tmp_path / "cache"), train_subset="student", teacher_checkpoint=spec)
    assert str(err.value).startswith(f"--data.teacher_checkpoint {spec!r}") and words in str(err.value)
    with pytest.raises(ValueError, match="--data.teacher_checkpoint"):
        load_teacher(spec)  # the same checks where the labels are computed


def test_protocol_refuses_a_bad_outside_model_before_any_work(exports, word_tokenizer_dir, tmp_path):
    _, out = exports["teacher_llama"]
    base = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"))
    spec = f"hf_classifier:{out}"
    cases = [(dict(teacher_pretrained=out), "--teacher_pretrained '.*': give an outside reward model as 'hf_class"),
             (dict(teacher_pretrained=f"hf_classifier:{tmp_path}/no"), "--teacher_pretrained .* there is no directory"),
             (dict(teacher_configs=[], teacher_pretrained=None), "--teacher_configs is empty"),
             (dict(teacher_pretrained=spec), "give either --teacher_configs .* or --teacher_pretrained"),
             (dict(zero_shot=[spec, spec]), r"row names \['zero_shot_teacher_llama'\]")]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            parse(["--config", _write(tmp_path, {**base, **overrides})])
    cfg = {**base, "teacher_configs": [], "teacher_pretrained": spec,
           "teacher_args": ["--model.lora={\"r\": 4}"]}  # a training option on a model scored whole
    with pytest.raises(ValueError, match=r"seed0/teacher \(outside teacher\).*--model.lora"):
        run_protocol(["--config", _write(tmp_path, cfg)])
    assert not os.path.exists(os.path.join(cfg["out_dir"], "seed0"))


def _direct_test(spec_dir: str, cache: str, root: str) -> dict[str, dict]:
    """`cli.py test --model.backbone hf_classifier:<dir>` on the protocol's data settings."""
    cli = main(["test", "--config", os.path.join(ROOT, "configs/trainer/cpu.yaml"),
                "--config", os.path.join(ROOT, "configs/data/synth_helpful.yaml"),
                "--model.class_path=lightning_modules.reward.reward_model.RewardModelModule",
                f"--model.backbone=hf_classifier:{spec_dir}", f"--model.tokenizer={spec_dir}",
                f"--data.source_options={json.dumps(SYNTH)}", "--data.max_length=96", f"--data.cache_dir={cache}",
                "--data.seed=0", "--trainer.logger=false", f"--trainer.default_root_dir={root}", "--verbose=false"])
    return cli.model.test_results


def test_protocol_with_an_outside_teacher_and_a_zero_shot_row(exports, word_tokenizer_dir, cache_dir, tmp_path):
    (_, teacher), (_, zs) = exports["teacher_llama"], exports["zs_llama"]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, teacher_configs=[],
                         teacher_pretrained=f"hf_classifier:{teacher}", zero_shot=[f"hf_classifier:{zs}"])
    cfg["zero_shot_args"] = cfg["teacher_args"]  # the data flags; their --model.tokenizer yields to the model's
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    out, rows = cfg["out_dir"], results["rows"]
    assert list(rows) == ["teacher", "naive", "zero_shot_zs_llama"]

    # the teacher stage only tested the outside model, with its own tokenizer
    stage = json.load(open(os.path.join(out, "seed0", "teacher", "result.json")))
    assert stage["checkpoint"] == f"hf_classifier:{teacher}" and stage["fit_seconds"] == 0.0
    commands = open(os.path.join(out, "seed0", "teacher", "commands.sh")).read().splitlines()
    assert len(commands) == 1 and commands[0].startswith("python cli.py test ")
    assert f"--model.tokenizer={teacher}" in commands[0]
    assert not os.path.exists(os.path.join(out, "seed0", "teacher", "fit"))

    splits = [SRC, *TARGETS]
    direct = {"teacher": _direct_test(teacher, cache_dir, str(tmp_path / "t")),
              "zero_shot_zs_llama": _direct_test(zs, cache_dir, str(tmp_path / "z"))}
    for row in direct:
        for split in splits:
            assert rows[row][f"acc/{split}"]["per_seed"][0] == pytest.approx(100 * direct[row][split]["acc"],
                                                                              abs=1e-9), (row, split)
    assert {direct["teacher"][s]["acc"] for s in splits} != {direct["zero_shot_zs_llama"][s]["acc"] for s in splits}
    assert stage["test"][SRC] == direct["teacher"][SRC]  # the same pairs counted, the same accuracy

    # the zero-shot row against the teacher: WRG, AOG per target, NTS from the two direct tests
    t, z = ({s: 100 * d[s]["acc"] for s in splits} for d in (direct["teacher"], direct["zero_shot_zs_llama"]))
    zero = rows["zero_shot_zs_llama"]
    assert zero["wrg"]["mean"] == pytest.approx(z[SRC] - t[SRC], abs=1e-6)
    aog = {tg: z[tg] - t[tg] for tg in TARGETS}
    for tg in TARGETS:
        assert zero[f"aog/{tg}"]["mean"] == pytest.approx(aog[tg], abs=1e-6), tg
    assert zero["nts"]["mean"] == pytest.approx(sum(aog.values()) / 3 - max(0.0, t[SRC] - z[SRC]), abs=1e-6)
    assert rows["teacher"]["wrg"]["mean"] == 0.0 and "pgr" not in zero

    # the student learned from the outside teacher's labels; its teacher accuracies are the direct test's
    student = json.load(open(os.path.join(out, "seed0", "naive", "result.json")))
    assert f"--data.teacher_checkpoint=hf_classifier:{teacher}" in student["args"]
    for split in splits:
        assert student["test"]["transfer"]["acc_teacher"][split] == pytest.approx(t[split], abs=1e-6), split
    label_files = os.listdir(os.path.join(cache_dir, "weak_labels"))
    assert len(label_files) == 1  # one teacher pass, shared by the zero-shot stage and the student
    meta = json.load(open(os.path.join(cache_dir, "weak_labels", label_files[0])))["meta"]
    assert meta["teacher_checkpoint"] == f"hf_classifier:{teacher}" and meta["pairs"] == 80
    assert student["teacher_labels"]["pairs"] == 80
    md = open(os.path.join(out, "results.md")).read()
    assert f"the teacher is the outside reward model `hf_classifier:{teacher}`" in md
    assert "| zero_shot_zs_llama | " in md

    # reuse; a new export written over the teacher's directory makes its stage (and so its students) stale
    stamp = {s: os.path.getmtime(os.path.join(out, "seed0", s, "result.json")) for s in rows}
    run_protocol(["--config", _write(tmp_path, cfg)])
    assert {s: os.path.getmtime(os.path.join(out, "seed0", s, "result.json")) for s in rows} == stamp
    weights = os.path.join(teacher, "model.safetensors")
    st = os.stat(weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        with pytest.raises(StageChangedError) as err:
            run_protocol(["--config", _write(tmp_path, cfg)])
    finally:
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    message = str(err.value)
    assert os.path.join(out, "seed0", "teacher") + ": model: 'hf_classifier:" in message
    assert os.path.join(out, "seed0", "zero_shot_zs_llama") not in message  # its own model did not change
