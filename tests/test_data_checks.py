"""Nothing stale, nothing silent on the data side (issue 28): label values checked where they enter, errors that name
their file, line and column, cache writes on a full disk that name the path and the flag and leave nothing behind,
and the temp folders of killed runs removed by the next run."""
import errno
import gc
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from datamodules.preference.sources import DataError, build_source
from tests.helpers import SOURCE, synth_options, tiny_data

SOURCE_ONLY = {SOURCE: synth_options()[SOURCE]}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")  # NaN / Infinity as Python writes
    return path


# ---- label values ---------------------------------------------------------------------------------------------
def helpsteer3_rows(preferences):
    return [{"context": [user(f"Question {i}?")], "response1": f"first {i}", "response2": f"second {i}",
             "overall_preference": p} for i, p in enumerate(preferences)]


HS3_PREFERENCES = [-2, 3, 2.0, 0, 7, 1e9, -99, 2.5, math.nan, True, "3", None]


def test_helpsteer3_preference_out_of_range_or_type_is_dropped_with_its_reason(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", helpsteer3_rows(HS3_PREFERENCES))
    out = build_source("helpsteer3", local_dir=str(tmp_path)).load("train")
    assert dict(out.dropped) == {
        "tie": 1,
        "overall_preference out of range [-3, 3]": 3,  # 7, 1e9, -99
        "overall_preference not an integer": 3,  # 2.5, true, "3"
        "overall_preference not a finite number": 1,  # NaN (once read as "response2 is better")
        "overall_preference missing": 1,
    }
    # -2: response1 is better; 3 and 2.0 (an integral float, as pandas writes an int column with gaps): response2
    assert [(r["prompt"][0]["content"], r["chosen"]) for r in out.records] == [
        ("Question 0?", "first 0"), ("Question 1?", "second 1"), ("Question 2?", "second 2")]


def test_ultrafeedback_scores_must_be_finite_numbers(tmp_path):
    def row(i, sc, sr):
        q = f"Question {i}?"
        return {"prompt": q, "prompt_id": str(i), "chosen": [user(q), assistant(f"good {i}")],
                "rejected": [user(q), assistant(f"bad {i}")], "messages": [], "score_chosen": sc, "score_rejected": sr}

    rows = [row(0, 8.0, 3.0), row(1, 2.0, 9.5), row(2, math.nan, 3.0), row(3, 8.0, math.nan), row(4, math.inf, 1.0),
            row(5, "high", 1.0), row(6, True, 1.0), row(7, None, 1.0), row(8, 5, 5)]
    write_jsonl(tmp_path / "train_prefs.jsonl", rows)
    out = build_source("ultrafeedback", local_dir=str(tmp_path)).load("train")
    assert dict(out.dropped) == {
        "score_chosen not a finite number": 2, "score_rejected not a finite number": 1,
        "score_chosen not a number": 2, "score_chosen missing": 1, "tie": 1,
    }
    assert [r["chosen"] for r in out.records] == ["good 0", "good 1"]  # a lower chosen score: the label wins


def test_pku_safer_response_id_must_be_0_or_1(tmp_path):
    rows = [{"prompt": f"Question {i}?", "response_0": f"zero {i}", "response_1": f"one {i}", "safer_response_id": s}
            for i, s in enumerate([0, 1, 1.0, 2, -1, True, math.nan, "1", 0.5, None])]
    write_jsonl(tmp_path / "train.jsonl", rows)
    out = build_source("pku_saferlhf", local_dir=str(tmp_path)).load("train")
    assert dict(out.dropped) == {
        "safer_response_id not 0 or 1": 2, "safer_response_id not an integer": 3,
        "safer_response_id not a finite number": 1, "safer_response_id missing": 1,
    }
    assert [r["chosen"] for r in out.records] == ["zero 0", "one 1", "one 2"]


def test_rail_and_local_scores_must_be_finite_numbers(tmp_path):
    def rail(i, sc, sr):
        return {"context": "", "prompt": f"Question {i}?", "chosen_response": f"good {i}",
                "rejected_response": f"bad {i}", "chosen_score": sc, "rejected_score": sr}

    write_jsonl(tmp_path / "rail" / "test.jsonl",
                [rail(0, 8.0, 2.0), rail(1, None, None), rail(2, "high", 2.0), rail(3, 8.0, math.nan),
                 rail(4, 8.0, None), rail(5, False, 1.0)])
    out = build_source("rail", local_dir=str(tmp_path / "rail")).load("test")
    assert dict(out.dropped) == {"chosen_score not a number": 2, "rejected_score not a finite number": 1,
                                 "rejected_score missing": 1}
    assert [r["chosen"] for r in out.records] == ["good 0", "good 1"]  # no scores on a row: nothing to compare

    def local(i, sc, sr):
        return {"prompt": f"Question {i}?", "chosen": f"good {i}", "rejected": f"bad {i}", "score_chosen": sc,
                "score_rejected": sr}

    path = write_jsonl(tmp_path / "mine.jsonl", [local(0, 1, 0), local(1, math.nan, 0), local(2, 1, "0"),
                                                 local(3, None, None), local(4, -math.inf, 0)])
    out = build_source(f"local:{path}").load("test")
    assert dict(out.dropped) == {"score_chosen not a finite number": 2, "score_rejected not a number": 1}
    assert [r["chosen"] for r in out.records] == ["good 0", "good 3"]


def test_label_faults_are_named_in_the_data_modules_drop_summary(word_tokenizer_dir, cache_dir, tmp_path, caplog):
    write_jsonl(tmp_path / "hs3" / "validation.jsonl", helpsteer3_rows([-2, 3, math.nan, 7, 7]))
    dm = tiny_data(word_tokenizer_dir, cache_dir, ood_targets=["helpsteer3"], source_options=SOURCE_ONLY,
                   local_dirs={"helpsteer3": str(tmp_path / "hs3")})
    with caplog.at_level("INFO"):
        dm.setup("test")
    assert dm.manifest["dropped"]["helpsteer3/test"] == {
        "overall_preference not a finite number": 1, "overall_preference out of range [-3, 3]": 2}
    assert len(dm.datasets["test/helpsteer3"]) == 2
    assert "'overall_preference out of range [-3, 3]': 2" in caplog.text  # the printed summary


# ---- errors that name file, line and column --------------------------------------------------------------------
GOOD = json.dumps({"prompt": "p" * 40, "chosen": "a", "rejected": "b"})


def load_local(path: Path):
    return build_source(f"local:{path}").load("test")


@pytest.mark.parametrize("name, newline", [("rows.jsonl", "\n"), ("rows.json", "\n"), ("crlf.jsonl", "\r\n")])
def test_json_error_reports_the_column_of_the_fault(tmp_path, name, newline):
    """A line cut before its closing brace: the parser stops where the "," or "}" is missing, one past the line's
    end -- not at "column 1" of the newline that ends it."""
    cut = GOOD[:-1]
    path = tmp_path / name
    path.write_text(GOOD + newline + cut + newline + GOOD + newline, encoding="utf-8", newline="")
    with pytest.raises(DataError) as err:
        load_local(path)
    assert str(err.value) == f"{path}:2: malformed JSON line (Expecting ',' delimiter at column {len(cut) + 1})"


def test_json_error_message_reads_cleanly(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"prompt": "a\tb", "chosen": "a", "rejected": "b"}\n')
    with pytest.raises(DataError) as err:
        load_local(path)
    assert str(err.value) == f"{path}:2: malformed JSON line (Invalid control character at column 14)"


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json"])
def test_byte_order_mark_is_skipped(tmp_path, name):
    path = tmp_path / name
    body = GOOD + "\n" + GOOD.replace("a", "c") if name.endswith("l") else f"[{GOOD},\n{GOOD.replace('a', 'c')}]"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert [r["chosen"] for r in load_local(path).records] == ["a", "c"]


def test_non_utf8_byte_in_jsonl_names_file_line_and_column(tmp_path):
    """The bad byte sits past the first 8 KiB read chunk, where a bare UnicodeDecodeError gave only its position."""
    lines = [GOOD.encode()] * 200
    lines[149] = GOOD.encode().replace(b'"a"', b'"caf\xe9"')  # latin-1 é
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    column = GOOD.index('"a"') + 5  # 1-based column of the byte after `"caf`
    offset = 149 * (len(GOOD) + 1) + column - 1
    with pytest.raises(DataError) as err:
        load_local(path)
    assert str(err.value).startswith(
        f"{path}:150: not UTF-8 text: byte 0xe9 at column {column} (byte offset {offset} in the file;")


def test_non_utf8_byte_in_json_array_names_file_line_and_column(tmp_path):
    path = tmp_path / "rows.json"
    path.write_bytes(b"[\n" + GOOD.encode() + b",\n  " + GOOD.encode().replace(b'"a"', b'"\xff"') + b"\n]")
    with pytest.raises(DataError, match=rf"{path}:3: not UTF-8 text: byte 0xff at column {GOOD.index('a') + 3} "):
        load_local(path)


# ---- cache writes on a full disk ------------------------------------------------------------------------------
def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def partial_save_then_full(target_part: str):
    """A `Dataset.save_to_disk` that writes a part of a file into folders whose name holds `target_part`, then hits
    a full disk; other folders are saved normally."""
    import datasets

    real = datasets.Dataset.save_to_disk

    def save(self, path, *args, **kwargs):
        if target_part not in os.path.basename(str(path)):
            return real(self, path, *args, **kwargs)
        os.makedirs(path, exist_ok=True)
        Path(path, "data-00000-of-00001.arrow").write_bytes(b"ARROW1" + b"\0" * 1000)
        disk_full()

    return save


def leftovers(directory) -> list[str]:
    return sorted(e for e in os.listdir(directory) if ".tmp" in e or ".raw" in e) if os.path.isdir(directory) else []


def test_full_disk_while_saving_a_tokenized_split(word_tokenizer_dir, cache_dir, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", partial_save_then_full("validation-"))
    dm = tiny_data(word_tokenizer_dir, cache_dir)
    with pytest.raises(OSError) as err:
        dm.prepare_data()
    assert err.value.errno == errno.ENOSPC
    tokenized = os.path.join(cache_dir, "tokenized")
    assert re.fullmatch(rf"cannot write {tokenized}/validation-[0-9a-f]{{20}}-[0-9a-f]{{12}}: no space left on the "
                        "device; the directory was chosen by --data.cache_dir -- free space there or point it at "
                        "another disk", str(err.value)), str(err.value)
    assert leftovers(tokenized) == []  # the half-written temp and the raw columns are gone
    (done,) = os.listdir(tokenized)  # the split before the full disk, complete
    assert done.startswith("train_teacher-") and len(datasets.load_from_disk(os.path.join(tokenized, done))) == 120


def test_full_disk_while_writing_raw_columns_names_the_variable(word_tokenizer_dir, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("SHIFTGEN_CACHE", str(tmp_path / "env_cache"))
    monkeypatch.setattr(datasets.Dataset, "save_to_disk", partial_save_then_full("part0"))
    with pytest.raises(OSError) as err:
        tiny_data(word_tokenizer_dir, None).prepare_data()
    message = str(err.value)
    tokenized = tmp_path / "env_cache" / "tokenized"
    assert message.startswith(f"cannot write {tokenized}/train_teacher-")
    assert ".raw.tmp-" in message and "part00000" in message and "chosen by $SHIFTGEN_CACHE" in message
    assert os.listdir(tokenized) == []


def test_full_disk_while_writing_the_prepared_index(word_tokenizer_dir, cache_dir, monkeypatch):
    import datamodules.atomic_files as af

    def open_then_full(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        real_write = f.write

        def write(data):
            real_write(data[: len(data) // 2])
            f.flush()
            disk_full()

        f.write = write
        return f

    monkeypatch.setattr(af, "open", open_then_full, raising=False)
    dm = tiny_data(word_tokenizer_dir, cache_dir)
    with pytest.raises(OSError) as err:
        dm.prepare_data()
    prepared = os.path.join(cache_dir, "prepared")
    assert str(err.value).startswith(f"cannot write {prepared}/")
    assert str(err.value).endswith(".json: no space left on the device; the directory was chosen by "
                                   "--data.cache_dir -- free space there or point it at another disk")
    assert os.listdir(prepared) == []  # neither a half index nor its temp


def test_full_disk_while_building_a_tokenizer(tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerFast

    from datamodules.tokenizers import builtin_tokenizer_dir, cached_wordlevel_tokenizer

    def save_then_full(self, directory, *args, **kwargs):
        os.makedirs(directory, exist_ok=True)
        Path(directory, "tokenizer.json").write_text('{"version": "1.0", "trunc')
        disk_full()

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", save_then_full)
    monkeypatch.setenv("SHIFTGEN_CACHE", str(tmp_path / "env"))
    with pytest.raises(OSError, match=rf"cannot write {tmp_path}/env/tokenizers/synthetic_shift-[0-9a-f]{{12}}: no "
                                      r"space left on the device; the directory was chosen by \$SHIFTGEN_CACHE"):
        builtin_tokenizer_dir("synthetic_shift")
    assert os.listdir(tmp_path / "env" / "tokenizers") == []  # no half-built tokenizer, no temp
    with pytest.raises(OSError, match=r"cannot write .*/tokenizers/mine-[0-9a-f]{12}: no space left on the device; "
                                      r"the directory was chosen by --data.cache_dir"):
        cached_wordlevel_tokenizer(["a", "b"], str(tmp_path / "c"), "mine", chosen_by="--data.cache_dir")
    assert os.listdir(tmp_path / "c" / "tokenizers") == []


@pytest.fixture
def tiny_tmpfs(tmp_path):
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small_disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield str(mount)
    finally:
        gc.collect()  # loaded datasets memory-map their files: a live one keeps the mount busy
        if subprocess.run(["umount", str(mount)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)  # detached now, freed when the last map goes


def test_real_full_disk_as_cache_dir(word_tokenizer_dir, tiny_tmpfs):
    """A 256 KiB tmpfs fills while the synthetic splits are cached (after the teacher half and validation, ~100 KiB
    each): the error names the path and the flag, and the cache holds only complete splits."""
    import datasets

    dm = tiny_data(word_tokenizer_dir, tiny_tmpfs)
    with pytest.raises(OSError) as err:
        dm.prepare_data()
    assert err.value.errno == errno.ENOSPC
    message = str(err.value)
    assert message.startswith(f"cannot write {tiny_tmpfs}/tokenized/"), message
    assert "no space left on the device; the directory was chosen by --data.cache_dir" in message
    tokenized = os.path.join(tiny_tmpfs, "tokenized")
    assert leftovers(tokenized) == []
    finished = {entry.rsplit("-", 2)[0]: entry for entry in os.listdir(tokenized)}  # <kind>-<records>-<tokenizer>
    assert finished and set(finished) <= {"train_teacher", "validation"}
    for kind, entry in finished.items():  # what was finished before the disk filled loads whole
        expected = {"train_teacher": 120, "validation": 40}[kind]
        assert len(datasets.load_from_disk(os.path.join(tokenized, entry))) == expected


# ---- orphans of killed runs ------------------------------------------------------------------------------------
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temp_path_names_host_and_pid():
    from datamodules.atomic_files import temp_path

    assert temp_path("/c/tokenized/x") == f"/c/tokenized/x.tmp-{socket.gethostname()}-{os.getpid()}"


def test_remove_orphans_removes_only_temps_of_dead_processes_of_this_host(tmp_path):
    from datamodules.atomic_files import remove_orphans

    host, dead = socket.gethostname(), dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan_dir = tmp_path / f"split-abc.raw.tmp-{host}-{dead}"
        (orphan_dir / "part00000").mkdir(parents=True)
        (orphan_dir / "part00000" / "data.arrow").write_bytes(b"x" * 100)
        orphan_file = tmp_path / f"index.json.tmp-{host}-{dead}"
        orphan_file.write_text("{")
        kept = [tmp_path / f"split-def.tmp-{host}-{live.pid}", tmp_path / f"split-ghi.tmp-{host}-{os.getpid()}",
                tmp_path / f"split-jkl.tmp-otherhost-{dead}", tmp_path / "split-abc", tmp_path / f"notes-{dead}"]
        for path in kept:
            path.mkdir()
        removed = remove_orphans(str(tmp_path))
        assert sorted(removed) == sorted([str(orphan_dir), str(orphan_file)])
        assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in kept)
        assert remove_orphans(str(tmp_path / "missing")) == []
    finally:
        live.kill()
        live.wait()


def test_data_preparation_removes_orphans_of_killed_runs(word_tokenizer_dir, cache_dir):
    host, dead = socket.gethostname(), dead_pid()
    first = tiny_data(word_tokenizer_dir, cache_dir)
    first.prepare_data()  # a warm cache: the next run writes nothing, yet sweeps
    tokenized, prepared = Path(cache_dir, "tokenized"), Path(cache_dir, "prepared")
    complete = sorted(os.listdir(tokenized))
    (tokenized / f"{complete[0]}.raw.tmp-{host}-{dead}" / "part00000").mkdir(parents=True)
    (tokenized / f"{complete[0]}.tmp-{host}-{dead}").mkdir()
    (prepared / f"abc.json.tmp-{host}-{dead}").write_text("{")
    live = tokenized / f"{complete[1]}.tmp-{host}-{os.getpid()}"
    live.mkdir()
    tiny_data(word_tokenizer_dir, cache_dir).prepare_data()
    assert sorted(os.listdir(tokenized)) == sorted(complete + [live.name])
    assert len(os.listdir(prepared)) == 1 and not os.listdir(prepared)[0].startswith("abc")


# ---- issue 29, item 2: options a source does not take -----------------------------------------------------------
def test_options_a_source_does_not_take_fail_at_construction_naming_flag_and_source(word_tokenizer_dir, cache_dir):
    from datamodules.preference.datamodule import PreferenceDataModule

    from tests.conftest import HUB_FIXTURES

    hub = os.path.join(HUB_FIXTURES, "hh_helpful")
    common = dict(source="hh_helpful", tokenizer=word_tokenizer_dir, local_dirs={"hh_helpful": hub}, cache_dir=cache_dir)
    with pytest.raises(ValueError, match=r"--data.teacher_source_options: source 'hh_helpful' takes no option\(s\) "
                                         r"\['artifact_rate'\]"):
        PreferenceDataModule(**common, teacher_source_options={"artifact_rate": 0.8})
    with pytest.raises(ValueError, match=r"--data.source_options: source 'hh_helpful' takes no option\(s\) \['n_train'\]"):
        PreferenceDataModule(**common, source_options={"hh_helpful": {"n_train": 10}})
    # a synthetic source takes its generator's options, and refuses one it does not know, naming it
    PreferenceDataModule(source="synth_helpful_cooking", tokenizer=word_tokenizer_dir, cache_dir=cache_dir,
                         teacher_source_options={"artifact_rate": 0.8})
    with pytest.raises(ValueError, match=r"--data.source_options for source 'synth_helpful_cooking': .*artefact_rate"):
        PreferenceDataModule(source="synth_helpful_cooking", tokenizer=word_tokenizer_dir, cache_dir=cache_dir,
                             source_options={"synth_helpful_cooking": {"artefact_rate": 0.8}})
