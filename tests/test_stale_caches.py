"""No cache between a data file and a published number is keyed by the file's size and mtime alone (issue 34): a file
rewritten with other contents but its old size and mtime (`cp -p`, `touch -d`, a restored backup) is read again by
the prepared index, the weak-label cache and a forced rerun's data identity."""
import json
import os
import time

import pytest

from tests.helpers import SOURCE, synth_options, tiny_data


def _rows(n: int) -> list[dict]:
    """Chosen and rejected of equal length per row, and explicit ids: a swapped file has the same size and ids."""
    return [{"id": f"p{i}", "prompt": f"question {i}", "chosen": f"good answer {i}", "rejected": f"bad answer {i}"}
            for i in range(n)]


ROWS = _rows(30)


def _write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _swapped(rows):
    return [dict(r, chosen=r["rejected"], rejected=r["chosen"]) for r in rows]


def _rewrite_keeping_stat(path, write) -> None:
    """Rewrite `path` with `write(path)` (same size, other bytes) and restore its old mtime, as `cp -p` leaves it."""
    st = os.stat(path)
    write(path)
    assert os.path.getsize(path) == st.st_size  # the same size: only the contents tell the files apart
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def _pairs(dm, split: str) -> dict[str, tuple[list, list]]:
    """{pair id: (a token ids, b token ids)} of a prepared split (a test pair's a is its chosen response)."""
    cols = dm.datasets[split].cols
    return {i: (list(a), list(b)) for i, a, b in zip(cols["id"], cols["a_input_ids"], cols["b_input_ids"])}


def _prepared(tokenizer, cache, **kw):
    dm = tiny_data(tokenizer, cache, **kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_prepared_index_reads_a_target_rewritten_with_its_old_size_and_mtime(word_tokenizer_dir, cache_dir, tmp_path,
                                                                              monkeypatch):
    """The issue's case on the data module: chosen and rejected swapped in a local target, size and mtime restored.
    Keyed by stat, the index served the old pairs from the same cache_dir (the teacher's published accuracy stayed
    55.0 where a fresh cache gave 45.0); keyed by contents, the swapped pairs are read."""
    import datamodules.preference.datamodule as pd

    path = tmp_path / "prefs.jsonl"
    _write_rows(path, ROWS)
    old = time.time_ns() - 10**10
    os.utime(path, ns=(old, old))
    name, split = f"local:{path}", f"test/local:{path}"
    kw = dict(ood_targets=[name], source_options={SOURCE: synth_options(n_train=80)[SOURCE]})
    before = _pairs(_prepared(word_tokenizer_dir, cache_dir, **kw), split)
    assert len(before) == 30 and all(a != b for a, b in before.values())  # a swap is visible in the token ids

    _rewrite_keeping_stat(path, lambda p: _write_rows(p, _swapped(ROWS)))
    after = _pairs(_prepared(word_tokenizer_dir, cache_dir, **kw), split)
    assert after == {i: (b, a) for i, (a, b) in before.items()}  # every pair's sides swapped, as in the file
    assert after == _pairs(_prepared(word_tokenizer_dir, str(tmp_path / "fresh"), **kw), split)

    # Still an index: unchanged contents under a new mtime (`touch`) reload the cache without loading records.
    monkeypatch.setattr(pd.PreferenceDataModule, "load_records",
                        lambda self: pytest.fail("records loaded although the files' contents are unchanged"))
    os.utime(path, ns=(old + 5, old + 5))
    assert _pairs(_prepared(word_tokenizer_dir, cache_dir, **kw), split) == after


def test_prepared_index_reads_a_source_folder_file_rewritten_with_its_old_size_and_mtime(word_tokenizer_dir,
                                                                                        cache_dir, tmp_path):
    """A source folder (`local:<dir>`, hashed file by file): its train file's pairs swapped, size and mtime restored,
    reach the training split."""
    folder = tmp_path / "prefs"
    folder.mkdir()
    _write_rows(folder / "train.jsonl", _rows(60))
    _write_rows(folder / "test.jsonl", ROWS[:8])
    kw = dict(source=f"local:{folder}", ood_targets=[], source_options={}, val_fraction=0.1)
    before = _pairs(_prepared(word_tokenizer_dir, cache_dir, **kw), "train_teacher")
    assert len(before) == 27 and all(a != b for a, b in before.values())

    _rewrite_keeping_stat(folder / "train.jsonl", lambda p: _write_rows(p, _swapped(_rows(60))))
    after = _pairs(_prepared(word_tokenizer_dir, cache_dir, **kw), "train_teacher")
    assert after == {i: (b, a) for i, (a, b) in before.items()}  # the same seeded halves, sides swapped


def test_weak_label_cache_key_follows_the_teachers_bytes(tmp_path):
    """A teacher rewritten with its old size and mtime (another checkpoint copied with `cp -p`) gets its own labels:
    the cache is keyed by the files' SHA-256 too, for a .ckpt and for an `hf_classifier:` directory."""
    from datamodules.preference.weak_labels import weak_label_path

    records = [{"id": "a", "source": "s", "split": "train", "prompt": [], "chosen": "x", "rejected": "y"}]

    def path_for(teacher: str) -> str:
        return weak_label_path(str(tmp_path / "c"), teacher, records, {}, 0, 96, "keep_response")

    ckpt = tmp_path / "teacher.ckpt"
    ckpt.write_bytes(b"weights of teacher one")
    one = path_for(str(ckpt))
    assert path_for(str(ckpt)) == one  # the same bytes: the same labels
    _rewrite_keeping_stat(ckpt, lambda p: p.write_bytes(b"weights of teacher two"))
    assert path_for(str(ckpt)) != one

    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text('{"a": 1}')
    (export / "model.safetensors").write_bytes(b"export weights one")
    spec = f"hf_classifier:{export}"
    first = path_for(spec)
    _rewrite_keeping_stat(export / "model.safetensors", lambda p: p.write_bytes(b"export weights two"))
    assert path_for(spec) != first


def _hashed_then_rewritten_keeping_stat(tmp_path, monkeypatch):
    """An old file hashed into a digest cache, then rewritten (chosen and rejected swapped) with its size and mtime
    kept: (path, cache file, the cached digests)."""
    import protocols.engine.data_identity as di

    monkeypatch.setenv(di.REHASH_ENV, "0")  # nothing distrusted yet; unset again after the test
    path, cache = tmp_path / "prefs.jsonl", str(tmp_path / "digests.json")
    _write_rows(path, ROWS)
    old = time.time_ns() - 10**10
    os.utime(path, ns=(old, old))
    digests = di.FileDigests(cache)
    before = digests.tree(str(path))
    digests.save()
    _rewrite_keeping_stat(path, lambda p: _write_rows(p, _swapped(ROWS)))
    return path, cache, before


def test_rehash_files_distrusts_every_earlier_hash_once(tmp_path, monkeypatch):
    """The stat-keyed digest cache misses a rewrite with the old size and mtime (documented); after `rehash_files()`
    (what `--force` calls) each file is hashed again, once, and the cache file holds the new hash for later runs."""
    import protocols.engine.data_identity as di

    path, cache, before = _hashed_then_rewritten_keeping_stat(tmp_path, monkeypatch)
    assert di.FileDigests(cache).tree(str(path)) == before  # the limit that --force answers

    reads = []
    real = di.file_sha256
    monkeypatch.setattr(di, "file_sha256", lambda p: reads.append(p) or real(p))
    di.rehash_files()
    forced = di.FileDigests(cache)
    after = forced.tree(str(path))
    assert after != before and after[str(path)].endswith(real(str(path))[:16])
    assert di.FileDigests(cache).tree(str(path)) == after and reads == [str(path)]  # hashed once in this run
    forced.save()

    monkeypatch.delenv(di.REHASH_ENV)  # a later run without --force: the corrected cache answers, nothing is read
    later = di.FileDigests(cache)
    assert later.tree(str(path)) == after and reads == [str(path)] and not later.dirty


def test_rehash_files_reaches_the_processes_a_run_starts(tmp_path, monkeypatch):
    """A seed pool or a cluster job hashes in another process: it inherits the distrust through the environment."""
    import subprocess
    import sys

    import protocols.engine.data_identity as di

    path, cache, before = _hashed_then_rewritten_keeping_stat(tmp_path, monkeypatch)
    di.rehash_files()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import json, sys; from protocols.engine.data_identity import FileDigests; "
            f"print(json.dumps(FileDigests({cache!r}).tree({str(path)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) != before and json.loads(out)[str(path)].endswith(di.file_sha256(str(path))[:16])


def test_a_bad_rehash_time_is_refused_naming_the_variable(tmp_path, monkeypatch):
    """Set by hand to something else, the variable would silently trust or distrust every hash: refused."""
    import protocols.engine.data_identity as di

    monkeypatch.setenv(di.REHASH_ENV, "yesterday")
    with pytest.raises(ValueError, match=r"\$SHIFTGEN_REHASH_SINCE_NS must be a time in ns .* got 'yesterday'"):
        di.FileDigests(str(tmp_path / "d.json"))


def test_trigger_questions_read_a_file_rewritten_with_its_old_size_and_mtime(tmp_path):
    from datamodules.triggers.questions import HUB_SOURCES

    folder = tmp_path / "arc"
    folder.mkdir()

    def arc(question: str):
        return lambda p: p.write_text(json.dumps({"id": "q0", "question": question, "answerKey": "A",
                                                  "choices": {"label": ["A", "B"], "text": ["cat", "dog"]}}) + "\n")

    arc("Which one purrs?")(folder / "train.jsonl")
    assert HUB_SOURCES["arc_easy"].load("train", str(folder))[0].stem == "Which one purrs?"
    _rewrite_keeping_stat(folder / "train.jsonl", arc("Which one barks?"))
    assert HUB_SOURCES["arc_easy"].load("train", str(folder))[0].stem == "Which one barks?"


def test_forced_rerun_publishes_the_accuracy_on_a_target_rewritten_with_its_old_size_and_mtime(
        tmp_path, word_tokenizer_dir, cache_dir, monkeypatch):
    """The issue's numbers end to end: a protocol (its teacher is what is read; `methods: []` is refused since issue
    49, so one student runs beside it); its target's chosen and rejected swapped, size and
    mtime restored; `--force` retrains and retests the same (deterministic) teacher on the same cache_dir. Its
    published accuracy on the target is 100 - the old one; the stat-keyed index published the old one again."""
    from protocols.engine.data_identity import REHASH_ENV
    from protocols.w2s.protocol import main as run_protocol
    from tests.test_w2s_protocol import _stage_acc, _tiny_protocol, _write

    monkeypatch.setenv(REHASH_ENV, "0")  # the forced run may distrust earlier hashes: unset again after the test
    prefs = tmp_path / "prefs.jsonl"
    _write_rows(prefs, ROWS)
    old = time.time_ns() - 10**10  # an old file: the digest cache trusts its hash while size and mtime stay
    os.utime(prefs, ns=(old, old))
    target = f"local:{prefs}"
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, extra_args=[f"--data.ood_targets+={target}"])
    path = _write(tmp_path, cfg)
    run_protocol(["--config", path])
    before = _stage_acc(cfg["out_dir"], 0, "teacher")[target]
    assert before != pytest.approx(50.0)  # else a swap could not show

    _rewrite_keeping_stat(prefs, lambda p: _write_rows(p, _swapped(ROWS)))
    run_protocol(["--config", path, "--force"])
    after = _stage_acc(cfg["out_dir"], 0, "teacher")[target]
    assert after == pytest.approx(100.0 - before)
    table = json.load(open(os.path.join(cfg["out_dir"], "results.json")))["rows"]["teacher"][f"acc/{target}"]
    assert table["mean"] == pytest.approx(after)
    # the forced run recorded the file's true hash (not the cached one), so a plain rerun agrees and reuses the stage
    from datamodules.preference.prepared_index import file_sha256

    recorded = json.load(open(os.path.join(cfg["out_dir"], "seed0", "teacher", "result.json")))["identity"]["data"]
    assert recorded["files"][str(prefs)] == f"{os.path.getsize(prefs)} bytes sha256:{file_sha256(str(prefs))[:16]}"
    run_protocol(["--config", path])
    assert _stage_acc(cfg["out_dir"], 0, "teacher")[target] == pytest.approx(after)
