"""The published claims (docs/claims/*.yaml, tests/claims.py): the files read, the pages say exactly what the claims
render, every claim holds on the per-seed values the docs print, every assertion can fail (the meta-test), and no
interval or "k of n" statement of the README, docs/results.md or docs/policy_mixtures.md stands outside a claim."""
import re

import pytest

from tests.doc_tables import NUMBER, documented_table
from tests.claims import (
    PAGES, ROOT, SPAN, Claim, ClaimsFileError, all_claims, check, claims_files, documented_problems, falsify,
    load_claims, problems, render, rendered_page, set_values, sets_of,
)

CLAIMS = all_claims()
IDS = [c.id for c in CLAIMS]


def _claim(spec: dict, sets: dict | None = None) -> Claim:
    return Claim("results", {"id": "t", "set": "w2s-x", **spec}, sets or {"w2s-x": {"seeds": 5}})


# ---- the checker on hand-made values --------------------------------------------------------------------------------
def test_interval_statements_use_the_tables_t_interval():
    # mean 2, sample std 1 over 5 seeds: half-width 2.776 / sqrt(5) = 1.2415 -> [0.8, 3.2]
    values = [1.0, 2.0, 3.0, 3.0, 1.0]
    claim = _claim({"mean": 2.0, "interval": [0.8, 3.2], "excludes": 0})
    assert problems(claim, values, exact=True) == []
    assert [a for a, _ in problems(claim, [v - 1.0 for v in values], exact=True)] == ["mean", "interval", "excludes"]
    # on another machine only the statement is asserted: the same shifted run fails there on `excludes` alone
    assert [a for a, _ in problems(claim, [v - 1.0 for v in values], exact=False)] == ["excludes"]


def test_k_of_n_is_the_count_as_written():
    claim = _claim({"seeds": "4 of 5 > 0"})
    assert problems(claim, [1, 2, 3, 4, -1], exact=False) == []
    assert problems(claim, [1, 2, 3, 4, 5], exact=False)[0][0] == "seeds"  # 5 of 5 is not "4 of 5"
    assert problems(claim, [1, 2, 3, -4, -5], exact=False)[0][0] == "seeds"
    assert problems(claim, [1, 2, 3, 4], exact=False)[0][1] == "4 values, the claim counts 5"
    at_least = _claim({"seeds": "at least 4 of 5 > 0"})
    assert problems(at_least, [1, 2, 3, 4, 5], exact=False) == []
    every = _claim({"seeds": "every seed <= -1"})
    assert problems(every, [-1, -2, -3], exact=False) == []
    assert problems(every, [-1, -0.5, -3], exact=False)[0][0] == "seeds"


def test_categorical_claims_count_names():
    claim = Claim("policy_mixtures", {"id": "w", "set": "mixture-e-s", "winner": "B", "seeds": "3 of 3 == Alice",
                                      "per_seed": ["Alice", "Alice", "Alice"]}, {"mixture-e-s": {"seeds": 3}})
    assert claim.categorical
    assert problems(claim, ["Alice"] * 3, exact=True) == []
    assert [a for a, _ in problems(claim, ["Alice", "Bob", "Alice"], exact=True)] == ["per_seed", "seeds"]


def test_quantities_read_from_results_json_and_stage_summaries():
    part_a = {"rows": {"anchor": {"nts": {"per_seed": {"1": 5.0, "0": 3.0}}},
                       "naive": {"nts": {"per_seed": {"0": 1.0, "1": 1.5}}}},
              "selection": {"swept": {"anchor": {"id_val": {"0": 100, "1": 10}}}}}
    header = {"rows": "rows", "rule": "id_val"}
    assert set_values("w2s-x", header, part_a, {"row": "anchor"}) == [3.0, 5.0]  # seed order, not file order
    assert set_values("w2s-x", header, part_a, {"row": "anchor", "minus": "naive"}) == [2.0, 3.5]
    assert set_values("w2s-x", header, part_a, {"pick": "anchor"}) == [100, 10]
    part_b = {"rows": {"A": {"acc_after": [0.9, 0.8], "acc_before": [0.4, 0.5]}},
              "history": {"10": {"acc B": [0.1, 0.2]}}, "winners": {"B": {"1": "Bob", "0": "Alice"}}}
    assert set_values("mixture-e-s", {}, part_b, {"dist": "A", "column": "acc_after"}) == [0.9, 0.8]
    diff = set_values("mixture-e-s", {}, part_b, {"dist": "A", "column": "acc_after", "minus": {"column": "acc_before"}})
    assert [round(v, 6) for v in diff] == [0.5, 0.3]
    assert set_values("mixture-e-s", {}, part_b, {"step": 10, "key": "acc B"}) == [0.1, 0.2]
    assert set_values("mixture-e-s", {}, part_b, {"winner": "B"}) == ["Alice", "Bob"]


def test_exact_mode_only_on_the_machine_the_set_records():
    sets = {"w2s-x": {"seeds": 2, "machine": "abc"}, "w2s-y": {"seeds": 2, "machine": "unrecorded"}}
    claims = [Claim("results", {"id": "x", "set": "w2s-x", "row": "r", "mean": 1.0}, sets),
              Claim("results", {"id": "y", "set": "w2s-y", "row": "r", "mean_is": "> 0"}, sets)]
    run = {"rows": {"r": {"nts": {"per_seed": {"0": 1.0, "1": 1.2}}}}}
    here = check(claims, lambda s: run, lambda s: "abc")
    assert here["x"][0] == "exact" and here["x"][1][0][0] == "mean"  # 1.1 is not the stated 1.0
    assert here["y"] == ("claims", [])
    elsewhere = check(claims, lambda s: run, lambda s: "other")
    assert elsewhere["x"] == ("claims", [])  # no statement but a number: nothing to assert on another machine


def test_a_finding_of_one_machine_is_checked_there_only():
    sets = {"w2s-x": {"seeds": 3}}
    published = Claim("results", {"id": "p", "set": "w2s-x", "row": "r", "seeds": "2 of 3 > 0", "except_on": ["m1"]},
                      sets)
    there = Claim("results", {"id": "t", "set": "w2s-x", "row": "r", "seeds": "1 of 3 > 0", "only_on": ["m1"]}, sets)
    run = {"rows": {"r": {"nts": {"per_seed": {"0": 1.0, "1": -1.0, "2": -2.0}}}}}
    assert check([published, there], lambda s: run, lambda s: "m1") == {"t": ("claims", [])}
    elsewhere = check([published, there], lambda s: run, lambda s: "m2")
    assert list(elsewhere) == ["p"] and elsewhere["p"][1][0][0] == "seeds"  # 1 of 3 is not the published 2 of 3


def test_a_set_the_run_does_not_make_is_skipped():
    claims = [Claim("results", {"id": "x", "set": "w2s-x", "row": "r", "mean_is": "> 0"}, {"w2s-x": {}})]
    assert check(claims, lambda s: {"rows": {}}, lambda s: None) == {}


def test_bad_claims_files_name_the_file_and_claim(tmp_path, monkeypatch):
    import tests.claims as claims_module

    monkeypatch.setattr(claims_module, "CLAIMS_DIR", str(tmp_path))
    (tmp_path / "results.yaml").write_text("sets: {w2s-x: {seeds: 3}}\nclaims:\n  - {id: a, set: w2s-x, row: r, "
                                           "meen: 1.0}\n")
    with pytest.raises(ClaimsFileError, match=r"results.yaml: claim 1 \(a\): unknown field\(s\) \['meen'\]"):
        load_claims("results")
    (tmp_path / "results.yaml").write_text("sets: {w2s-x: {seeds: 3}}\nclaims:\n  - {id: a, set: w2s-y, row: r, "
                                           "mean_is: '> 0'}\n")
    with pytest.raises(ClaimsFileError, match="set 'w2s-y' is not in a `sets:` header"):
        load_claims("results")


def test_rendering_fills_the_span_and_signs_gains():
    claim = _claim({"row": "a", "minus": "b", "mean": -0.3, "interval": [-2.2, 1.5],
                    "text": "{mean} {interval}, in the mean"})
    assert render(claim) == "−0.3 [−2.2, +1.5], in the mean"
    page = "x <!-- claim: t -->old<!-- /claim --> y"
    assert rendered_page("results", page, [claim]) == "x <!-- claim: t -->−0.3 [−2.2, +1.5], in the mean<!-- /claim --> y"


# ---- the published claims ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
def test_claim_holds_on_the_documented_values(claim):
    assert documented_problems(claim) == []


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
def test_every_assertion_of_a_claim_can_fail(claim):
    """The meta-test: for each assertion, the falsifier (the documented values changed just enough) breaks exactly
    that assertion in the mode it is asserted in."""
    broken = falsify(claim)
    stated = {k for k in ("per_seed", "mean", "interval", "excludes", "includes", "mean_is", "seeds")
              if k in claim.spec and not (claim.categorical and k in ("mean", "interval"))}
    assert set(broken) == stated
    for assertion, (values, exact) in broken.items():
        assert assertion in {a for a, _ in problems(claim, values, exact)}, (assertion, values)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_pages_say_what_their_claims_render(page):
    if not claims_files(page):
        return
    text = open(f"{ROOT}/{PAGES[page]}", encoding="utf-8").read()
    claims = load_claims(page)
    assert rendered_page(page, text, claims) == text, "run `python -m tests.claims` to render the claim spans"
    spans = [m["id"] for m in SPAN.finditer(text)]
    assert sorted(spans) == sorted(c.id for c in claims), "every claim has exactly one span in its page"


@pytest.mark.parametrize("page", ["results", "policy_mixtures"])
def test_every_marked_table_is_a_declared_set(page):
    """A marked table's header records the machine that made it: without one, its rerun could never be exact."""
    marked = re.findall(r"<!-- table: (\S+) -->", open(f"{ROOT}/{PAGES[page]}", encoding="utf-8").read())
    assert [name for name in marked if name not in sets_of(page)] == []


def test_a_set_declared_on_several_pages_is_declared_the_same():
    seen = {}
    for page in PAGES:
        for name, header in sets_of(page).items():
            assert seen.setdefault(name, header) == header, (name, page)


PART_A_HEADERS = {"wrg": "WRG", "nts": "NTS", "pgr": "PGR", "aog_mean": "mean AOG", "acc/ood_mean": "mean OOD acc"}


def _documented_cell(claim: Claim, q: dict):
    """The marked table's printed cell a quantity reads (None where the quantity is not a table cell: a history
    step, a pick, a winner, a difference), as the page prints it."""
    if any(k in q for k in ("minus", "pick", "winner", "step")):
        return None
    page = "policy_mixtures.md" if q["set"].startswith("mixture-") else "results.md"
    try:
        markdown = documented_table(page, q["set"])
    except AssertionError:
        markdown = documented_table("results.md" if page == "policy_mixtures.md" else "policy_mixtures.md", q["set"])
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    if q["set"].startswith("mixture-"):
        if header[0] != "distribution":  # an SFT stage's per-seed table: no distribution rows to read
            return None
        row, column = q["dist"], q["column"].replace("share_", "its share ").replace("_", " ")
    else:
        key = q.get("key", "nts")
        row = q["row"]
        column = PART_A_HEADERS.get(key) or ("AOG " + key[4:] if key.startswith("aog/") else None)
        if column is None and key.startswith("acc/"):
            column = "ID acc" if "ID acc" in header and f"OOD acc {key[4:]}" not in header else f"OOD acc {key[4:]}"
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == row and column in header:
            return cells[header.index(column)]
    raise AssertionError(f"{claim.id}: the marked table {q['set']} has no row {row!r} with a column {column!r}")


@pytest.mark.parametrize("claim", CLAIMS, ids=IDS)
def test_a_claim_reads_what_its_marked_table_prints(claim):
    """A claim's quantity names a row and column its table has, and the numbers agree with the printed cell: the
    mean (Part A, one decimal) or the per-seed values in parentheses (Part B). A wrong row or key shows here, not
    only in an hour-long slow run."""
    if "only_on" in claim.spec:  # a rerun's finding on another machine: not the published table's run
        return
    if len(claim.quantities) != 1 or (cell := _documented_cell(claim, claim.quantities[0])) is None:
        return
    numbers = [float(x.replace("−", "-")) for x in NUMBER.findall(cell.replace("**", ""))]
    if claim.set_names[0].startswith("mixture-"):
        if "per_seed" in claim.spec:
            assert numbers[2:] == [float(v) for v in claim.spec["per_seed"]], (claim.id, cell)
    elif "mean" in claim.spec:
        assert f"{numbers[0]:.1f}" == f"{claim.spec['mean']:.1f}", (claim.id, cell)


INTERVAL = re.compile(r"\[[+−-]?\d+(?:\.\d+)?, [+−-]?\d+(?:\.\d+)?\]")
K_OF_N = re.compile(r"\b(\d+) of (\d+)\b(?! (?:steps|layers|prompts|pairs|candidates|texts|rows))")
EVERY = re.compile(r"\b(?:every seed|all seeds|every run|all runs)\b")


def unclaimed_statements(text: str) -> list[str]:
    """Intervals, "k of n" counts (n ≤ 12: seeds or runs) and "every seed" statements in prose outside claim spans;
    tables (printed run output, checked cell by cell) and code blocks are not prose."""
    text = SPAN.sub(lambda m: " " * len(m.group(0)), text)
    found, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fence = not fence
        if fence or line.strip().startswith(("|", "```")):
            continue
        for m in [*INTERVAL.finditer(line), *EVERY.finditer(line),
                  *(m for m in K_OF_N.finditer(line) if int(m.group(2)) <= 12)]:
            found.append(f"line {number}: {m.group(0)!r} in {line.strip()[:100]!r}")
    return found


def test_the_scan_finds_what_it_should():
    text = ("naive +1.1 [−0.6, +2.9] in 4 of 5 seeds; step 12 of 100; 2 of 30 layers\n| a | [1.0, 2.0] |\n"
            "<!-- claim: x -->+0.5 [−3.6, +4.5] in every seed<!-- /claim -->, then every seed agrees")
    assert [f.split(": ", 1)[1].split(" in ")[0] for f in unclaimed_statements(text)] == [
        "'[−0.6, +2.9]'", "'4 of 5'", "'every seed'"]


@pytest.mark.parametrize("page", ["README.md", "docs/results.md", "docs/policy_mixtures.md"])
def test_no_interval_or_count_outside_a_claim(page):
    """Issue 50: every interval and every "k of n" statement of these pages is a checked claim (or reworded: "in the
    mean", "one seed")."""
    assert unclaimed_statements(open(f"{ROOT}/{page}", encoding="utf-8").read()) == []
