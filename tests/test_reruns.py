"""What a rerun reuses (docs/reruns.md): the data behind a stage's options is part of its identity (file contents,
the generators' code, a hub revision), `--force` reruns all or the named stages, and both protocols hold their
folder with the same lock and refusal rules."""
import json
import os
import subprocess
import sys
import time

import pytest

from protocols.engine.data_identity import FileDigests, data_identity, hub_revision
from protocols.engine.stage_identity import ForceSpec, StageChangedError
from protocols.w2s.protocol import main as run_protocol
from tests.test_w2s_protocol import _stage_acc, _tiny_protocol, _write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = [{"prompt": f"question {i}", "chosen": f"good answer {i}", "rejected": f"bad answer {i}"} for i in range(40)]


def _write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _swapped(rows):
    return [dict(r, chosen=r["rejected"], rejected=r["chosen"]) for r in rows]


def test_file_digests_hash_contents_and_are_cached_by_path_size_and_time(tmp_path):
    path, cache = tmp_path / "prefs.jsonl", str(tmp_path / "digests.json")
    _write_rows(path, ROWS)
    old = time.time_ns() - 10**10  # an old file: its cached hash is trusted while size and time stay
    os.utime(path, ns=(old, old))
    digests = FileDigests(cache)
    first = digests.tree(str(path))
    digests.save()
    again = FileDigests(cache)
    assert again.tree(str(path)) == first and not again.dirty  # answered from the cache
    _write_rows(path, _swapped(ROWS))  # same size, other contents
    assert os.path.getsize(path) == int(next(iter(first.values())).split()[0])
    os.utime(path, ns=(old, old))  # ... and the old time: the cache answers without reading (documented limit)
    assert FileDigests(cache).tree(str(path)) == first
    os.utime(path, ns=(old + 1, old + 1))  # any other time: hashed again
    swapped = FileDigests(cache).tree(str(path))
    assert swapped.keys() == first.keys() and swapped != first
    _write_rows(path, ROWS)  # rewritten just now: too young to trust a cached hash (a racy rewrite keeps the time)
    young = FileDigests(cache)
    young.known[str(path)] = [os.path.getsize(path), os.stat(path).st_mtime_ns, "stale", time.time_ns()]
    assert young.tree(str(path)) == first


def test_data_identity_names_files_generators_and_hub_revisions(tmp_path, monkeypatch):
    folder = tmp_path / "hh"
    folder.mkdir()
    _write_rows(folder / "train.jsonl", ROWS)
    _write_rows(folder / "test.jsonl", ROWS[:5])
    (folder / ".hidden").write_text("not data")
    prefs = tmp_path / "prefs.jsonl"
    _write_rows(prefs, ROWS)
    flat = {"data.class_path": "datamodules.preference.datamodule.PreferenceDataModule",
            "data.init_args.source": "synth_helpful_cooking",
            "data.init_args.ood_targets.0": "hh_helpful", "data.init_args.ood_targets.1": f"local:{prefs}",
            "data.init_args.ood_targets.2": "ultrafeedback",
            "data.init_args.local_dirs.hh_helpful": str(folder),
            "model.init_args.backbone": "tiny-qwen2", "data.init_args.seed": 0}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    ident = data_identity(flat, digests=FileDigests(str(tmp_path / "d.json")))
    assert sorted(ident["files"]) == sorted([str(folder / "test.jsonl"), str(folder / "train.jsonl"), str(prefs)])
    assert ident["files"][str(prefs)].startswith(f"{os.path.getsize(prefs)} bytes sha256:")
    assert set(ident["generators"]) == {"synthetic_shift"}  # the synthetic source's code version
    assert ident["hub"] == {"HuggingFaceH4/ultrafeedback_binarized": "unresolved"}  # offline, never downloaded
    ref = tmp_path / "hub" / "datasets--HuggingFaceH4--ultrafeedback_binarized" / "refs"
    ref.mkdir(parents=True)
    (ref / "main").write_text("0123abcd\n")
    assert hub_revision("HuggingFaceH4/ultrafeedback_binarized") == "0123abcd"
    # a registered source name is never read as a path, even when a folder of that name exists
    (tmp_path / "synth_helpful_cooking").mkdir()
    assert data_identity({**flat, "data.init_args.ood_targets.1": "hh_helpful"}, cwd=str(tmp_path),
                         digests=FileDigests(str(tmp_path / "d.json")))["files"].keys() == {
        str(folder / "test.jsonl"), str(folder / "train.jsonl")}


def test_trigger_data_identity_holds_the_generator_and_question_files(tmp_path):
    qdir = tmp_path / "arc"
    qdir.mkdir()
    (qdir / "test.jsonl").write_text('{"question": "q"}\n')
    flat = {"data.class_path": "datamodules.triggers.datamodule.TriggerDataModule",
            "data.init_args.question_dirs.arc_easy": "arc"}  # relative: read from the stage's folder
    ident = data_identity(flat, cwd=str(tmp_path), digests=FileDigests(str(tmp_path / "d.json")))
    assert list(ident["files"]) == [str(qdir / "test.jsonl")] and set(ident["generators"]) == {"triggers"}


def test_force_spec_names_stages_and_seeds():
    assert not ForceSpec(None) and not ForceSpec(None).forces("teacher", 0)
    every = ForceSpec([])
    assert every and every.forces("teacher", 0) and every.forces("naive", 3)
    some = ForceSpec(["teacher", "seed1/naive", "seed_2/sft"])
    assert some.forces("teacher", 5) and some.forces("naive", 1) and not some.forces("naive", 0)
    assert some.forces("sft", 2) and not some.forces("sft", 1)
    with pytest.raises(ValueError, match=r"--force names unknown stage\(s\) \['sft'\]; the stages are"):
        ForceSpec(["seed_2/sft"]).check({"teacher", "naive"})


def test_changed_data_file_refuses_reuse_naming_it_and_force_reruns_on_the_new_data(tmp_path, word_tokenizer_dir,
                                                                                     cache_dir):
    """The issue's case: chosen and rejected swapped in a target's test file (same size). Before, a rerun and even
    `--force` printed the old table; now the rerun is refused naming the file, and `--force` gives 100 - old."""
    prefs = tmp_path / "prefs.jsonl"
    _write_rows(prefs, ROWS)
    target = f"local:{prefs}"
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, extra_args=[f"--data.ood_targets+={target}"])
    path = _write(tmp_path, cfg)
    run_protocol(["--config", path])
    out = cfg["out_dir"]
    before = {s: _stage_acc(out, 0, s)[target] for s in ("teacher", "naive")}
    results = {s: os.path.join(out, "seed0", s, "result.json") for s in ("teacher", "naive")}
    stamps = {s: os.path.getmtime(p) for s, p in results.items()}

    _write_rows(prefs, _swapped(ROWS))
    with pytest.raises(StageChangedError) as err:
        run_protocol(["--config", path])
    message = str(err.value)
    for stage in ("teacher", "naive"):  # both read the file: named at once, before any work
        assert os.path.join(out, "seed0", stage) + ": data.files." + str(prefs) in message
    assert "--force" in message and {s: os.path.getmtime(p) for s, p in results.items()} == stamps

    run_protocol(["--config", path, "--force"])  # alone: every stage runs again, on the new file
    after = {s: _stage_acc(out, 0, s)[target] for s in ("teacher", "naive")}
    assert after["teacher"] == pytest.approx(100.0 - before["teacher"])  # the same teacher (deterministic), pairs swapped
    table = json.load(open(os.path.join(out, "results.json")))["rows"]["teacher"][f"acc/{target}"]["mean"]
    assert table == pytest.approx(after["teacher"])
    stamps = {s: os.path.getmtime(p) for s, p in results.items()}
    run_protocol(["--config", path])  # unchanged now: reused
    assert {s: os.path.getmtime(p) for s, p in results.items()} == stamps


MIXTURE_HOLDER = r"""
import sys, time
sys.path.insert(0, {root!r})
from protocols.engine.run_files import OutDirLock
with OutDirLock({folder!r}):
    print("held", flush=True)
    time.sleep(60)
"""


def test_mixture_protocol_holds_its_family_folder(tmp_path, capsys):
    """Two mixture runs on one --out: the second is refused naming the holder, before any stage (issue 28, case 2)."""
    from protocols.mixture import protocol as mixture

    folder = str(tmp_path / "two_policies")
    holder = subprocess.Popen([sys.executable, "-c", MIXTURE_HOLDER.format(root=ROOT, folder=folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=rf"{folder} is in use by another protocol run \(PID {holder.pid}"):
            # tiny, so that code without the lock (d2cc27e) runs it in seconds and fails here instead of hanging
            mixture.main(["two_policies", "--seeds", "0", "--out", str(tmp_path), "--stages", "sft",
                          "--sft-set=--trainer.max_steps=1", "--sft-set=--data.num_train=64",
                          "--sft-set=--data.num_val_per_distribution=4",
                          "--sft-set=--model.fidelity_prompts_per_distribution=2"])
        assert not os.path.exists(os.path.join(folder, "seed_0"))  # nothing started
    finally:
        holder.kill()
        holder.wait()
