"""A run finished by older code is reused whole by this code (issue 35: nothing a user has finished is lost).

tests/fixtures/finished_run/ holds a tiny W2S run (teacher, naive, ANCHOR swept over two λ, WiSE-FT of its pick)
finished by the commit named in its MADE_BY, before the stage engine; `tests/fixtures/make_finished_run.py` wrote it.
Laid out again where it was made (a run cannot move: a stage's identity names its upstream stages by the digest of
theirs, which holds absolute paths), with the same tokenizer, a rerun of its configuration must run no stage: every stage's
result keeps its run id, and the republished tables hold the cells the old code published.
"""
import json
import os
import shutil

from protocols.w2s.protocol import main as run_protocol
from tests.doc_tables import documented_columns, parse_table
from tests.fixtures.make_finished_run import ROOT, build_tokenizer, protocol

TARGETS = ("synth_helpful_science", "synth_helpful_travel", "synth_helpful_tech")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "finished_run")


def _lay_out(root: str) -> None:
    for folder, _, files in os.walk(FIXTURE):
        for name in files:
            src = os.path.join(folder, name)
            dst = os.path.join(root, os.path.relpath(src, FIXTURE))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(src, encoding="utf-8") as f:
                text = f.read().replace("<ROOT>", root)
            with open(dst, "w", encoding="utf-8") as f:
                f.write(text)


def _runs(out: str) -> dict[str, str]:
    runs = {}
    for stage in sorted(os.listdir(os.path.join(out, "seed0"))):
        with open(os.path.join(out, "seed0", stage, "result.json")) as f:
            runs[stage] = json.load(f)["run"]
    return runs


def test_a_run_finished_by_the_old_code_is_reused_with_no_stage_rerun():
    root = ROOT
    shutil.rmtree(root, ignore_errors=True)
    _lay_out(root)
    build_tokenizer(os.path.join(root, "tokenizer"))
    out = os.path.join(root, "run")
    before = _runs(out)
    assert set(before) == {"teacher", "naive", "anchor@anchor_coef=1.0", "anchor@anchor_coef=10.0", "wise"}
    old_table = open(os.path.join(out, "results", "results.md"), encoding="utf-8").read()
    config = os.path.join(root, "protocol.json")
    with open(config, "w") as f:
        json.dump(protocol(root), f)
    cwd = os.getcwd()
    os.chdir(REPO)  # the config names its files from the repository
    try:
        run_protocol(["--config", config])
    finally:
        os.chdir(cwd)
    assert _runs(out) == before  # no stage ran: a rerun draws a new run id
    assert not os.path.exists(os.path.join(out, "seed0", "naive", "fit"))  # no fit folder was made again
    new_table = open(os.path.join(out, "results.md"), encoding="utf-8").read()
    old_parts, new_parts = old_table.split("\n\n"), new_table.split("\n\n")
    # the W2S tables (id_val, oracle) hold the same cells; since, they print each OOD accuracy beside its AOG (issue
    # 47), a caption naming each column's unit and a legend under them
    w2s = lambda parts: [parse_table(p) for p in parts if p.startswith("| method | ID acc |")]  # noqa: E731
    assert len(w2s(old_parts)) == len(w2s(new_parts)) == 2
    for old, new in zip(w2s(old_parts), w2s(new_parts)):
        assert set(new) == set(old) and documented_columns(new, old) == old
        assert set(new["naive"]) - set(old["naive"]) == {f"OOD acc {t}" for t in TARGETS} | {"mean OOD acc"}
    formats = ("| method | ID acc |", "Percent points, 1 seed", "1 seed; accuracies", "Legend (", "Columns and units")
    rest = lambda parts: [p for p in parts if not p.startswith(formats)]  # noqa: E731
    # the rest is the same; what the report added since (issue 36) are the budget table and the note that the
    # weak_val rule cannot read stages finished before it
    added = [part for part in rest(new_parts) if part not in old_parts]
    assert [part.split(":")[0][:19] for part in added] == ["Budget per seed", "| method | fits | e", "No `weak_val` table"]
    assert [part for part in rest(new_parts) if part not in added] == rest(old_parts)
    assert "| wise | 0 | 1 | 3 |" in added[1]  # one evaluation of the anchor sweep's pick: 1 + its 2 candidates
    assert "seed0/naive" in added[2] and "--force" in added[2]
    shutil.rmtree(root)
