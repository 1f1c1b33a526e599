"""Published claims as data (docs/claims.md): each quantitative statement of a docs page is written once in
`docs/claims/<page>.yaml`, rendered into the page between `<!-- claim: ID -->` and `<!-- /claim -->`, and checked
against a run's own results.json by the slow suite.

A claim reads one quantity per seed from a published set (the marked table it belongs to) and states what holds:

    - id: helpful-fixed-lambda-es-vs-es          # the span's name in the page
      set: w2s-budget-helpful                    # the marked table whose run holds the numbers
      row: anchor_early_stop_fixed               # Part A: a row of the table, its `key` (default nts) ...
      minus: early_stop                          # ... optionally minus another row, seed by seed
      per_seed: [12.1, 3.3, 18.2, 20.1, -1.8]    # as the docs print them: the evidence every number is made of
      mean: 10.4                                 # stated numbers: compared at print precision on the machine
      interval: [1.2, 19.5]                      #   that made the table (exact mode), not elsewhere
      excludes: 0                                # statements: checked on every machine (claims mode)
      seeds: 4 of 5 > 0                          #   "k of n" is exactly k; "at least k of n"; "every seed > 0"
      text: "{mean} [{lo}, {hi}], positive in 4 of 5 seeds"

Part B quantities name a stage's column (`dist`, `column`), a history cell (`step`, `key`) or the dominant persona
(`winner`); `pool` joins several quantities (possibly of several sets) into one list of runs for a "k of n runs"
statement; `pick` reads a swept method's selected value per seed.

Two checks of a set's run: **exact** where the run's machine fingerprint equals the one the claims file records for
the set (every stated number equal at print precision, every statement holds), **claims** elsewhere (the statements
only, with their counts as written). `falsify` gives, for each assertion of a claim, per-seed values that break it:
tests/test_claims.py proves every assertion can fail.
"""
from __future__ import annotations

import math
import operator
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import yaml

from protocols.engine.stats import ci95, mean_std

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAIMS_DIR = os.path.join(ROOT, "docs", "claims")
PAGES = {"results": "docs/results.md", "policy_mixtures": "docs/policy_mixtures.md", "readme": "README.md"}
UNRECORDED = "unrecorded"  # a set measured before results.json recorded its machine: claims mode everywhere
OPS: dict[str, Callable[[Any, Any], bool]] = {">=": operator.ge, "<=": operator.le, "!=": operator.ne,
                                              "==": operator.eq, ">": operator.gt, "<": operator.lt}
SEEDS_RULE = re.compile(r"^(?:(?P<atleast>at least )?(?P<k>\d+) of (?P<n>\d+)|(?P<every>every seed))\s*"
                        r"(?P<op>>=|<=|!=|==|>|<)\s*(?P<than>\S.*)$")
QUANTITY_KEYS = ("set", "row", "key", "minus", "minus_key", "pick", "dist", "column", "step", "winner")
STATEMENT_KEYS = ("mean", "interval", "per_seed", "excludes", "includes", "seeds", "mean_is")
MACHINE_KEYS = ("only_on", "except_on")  # a finding of some machines: fingerprint ids (docs/claims.md)
CLAIM_KEYS = {"id", "text", "pool", "decimals", *MACHINE_KEYS, *QUANTITY_KEYS, *STATEMENT_KEYS}


class ClaimsFileError(ValueError):
    """A claims file that cannot be read: names the file and the claim."""


# ---- reading the files ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    page: str  # docs/claims/<page>.yaml
    spec: dict
    sets: dict  # the file's `sets:` header

    @property
    def id(self) -> str:
        return self.spec["id"]

    @property
    def quantities(self) -> list[dict]:
        """The claim's quantities: its own fields, or each `pool` entry over them (a pool entry inherits the
        claim's fields it does not set)."""
        own = {k: self.spec[k] for k in QUANTITY_KEYS if k in self.spec}
        return [{**own, **entry} for entry in self.spec["pool"]] if "pool" in self.spec else [own]

    @property
    def set_names(self) -> list[str]:
        return list(dict.fromkeys(q["set"] for q in self.quantities))

    @property
    def decimals(self) -> int:
        if "decimals" in self.spec:
            return int(self.spec["decimals"])
        return 2 if self.set_names[0].startswith("mixture-") else 1

    @property
    def categorical(self) -> bool:
        return any("winner" in q or "pick" in q for q in self.quantities)


def claims_files(page: str) -> list[str]:
    """A page's claims files: `docs/claims/<page>.yaml` and any `docs/claims/<page>.<part>.yaml` beside it."""
    if not os.path.isdir(CLAIMS_DIR):
        return []
    return sorted(os.path.join(CLAIMS_DIR, f) for f in os.listdir(CLAIMS_DIR)
                  if f == f"{page}.yaml" or f.startswith(f"{page}.") and f.endswith(".yaml"))


def _read_page(page: str) -> tuple[dict[str, dict], list[tuple[str, int, dict]]]:
    """A page's claims files, each read once: the `sets:` headers merged (a set declared twice must say the same)
    and every claim spec with its file and position."""
    sets, specs = {}, []
    for path in claims_files(page):
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        rel = os.path.relpath(path, ROOT)
        for name, header in (data.get("sets") or {}).items():
            if sets.setdefault(name, header) != header:
                raise ClaimsFileError(f"{rel}: set {name!r} is declared differently in another claims file of {page}")
        specs += [(rel, i, spec) for i, spec in enumerate(data.get("claims") or [])]
    return sets, specs


def sets_of(page: str) -> dict[str, dict]:
    """A page's `sets:` headers, merged."""
    return _read_page(page)[0]


def set_header(name: str) -> dict:
    """A set's header on whichever page declares it ({} where none does; tests/test_claims.py checks that a set
    declared on several pages is declared the same)."""
    for page in PAGES:
        if name in (sets := sets_of(page)):
            return sets[name]
    return {}


def run_machine(run: dict) -> Optional[str]:
    """The fingerprint id a results.json records (None: made before fingerprints were recorded)."""
    return (run.get("machine") or {}).get("id")


def recorded_on(header: dict, machine: Optional[str]) -> bool:
    """Whether a set's header records `machine` as the one that made it: where its rerun must be exact."""
    return header.get("machine", UNRECORDED) not in (UNRECORDED, None) and header["machine"] == machine


def load_claims(page: str) -> list[Claim]:
    """Every claim of a page, its files' `sets:` headers merged (a set declared twice must say the same)."""
    sets, specs = _read_page(page)
    claims, seen = [], set()
    for rel, i, spec in specs:
        where = f"{rel}: claim {i + 1} ({spec.get('id', 'no id')})"
        unknown = set(spec) - CLAIM_KEYS
        if "id" not in spec or unknown:
            raise ClaimsFileError(f"{where}: " + (f"unknown field(s) {sorted(unknown)}" if unknown else "no id"))
        if spec["id"] in seen:
            raise ClaimsFileError(f"{where}: id used twice")
        seen.add(spec["id"])
        claim = Claim(page, spec, sets)
        for q in claim.quantities:
            if q.get("set") not in sets:
                raise ClaimsFileError(f"{where}: set {q.get('set')!r} is not in a `sets:` header of {page}")
        if not any(k in spec for k in STATEMENT_KEYS if k != "per_seed"):
            raise ClaimsFileError(f"{where}: states nothing (one of mean, interval, excludes, includes, seeds, "
                                  "mean_is)")
        claims.append(claim)
    return claims


def all_claims() -> list[Claim]:
    return [c for page in PAGES for c in load_claims(page)]


# ---- reading a quantity from a run ------------------------------------------------------------------------------
def set_values(set_name: str, header: dict, source: dict, q: dict) -> list:
    """One quantity's per-seed values (seed order) from its set's results: Part A's results.json, or Part B's
    stage summary (`results[stages][stage][summary]`)."""
    if set_name.startswith("mixture-"):
        return _mixture_values(source, q)
    rows = source[header.get("rows", "rows")]
    if "pick" in q:
        picks = source["selection"]["swept"][q["pick"]][header.get("rule", "id_val")]
        return [picks[s] for s in sorted(picks, key=int)]
    key = q.get("key", "nts")
    values = rows[q["row"]][key]["per_seed"]
    if "minus" in q:
        other = rows[q["minus"]][q.get("minus_key", key)]["per_seed"]
        return [values[s] - other[s] for s in sorted(values, key=int)]
    return [values[s] for s in sorted(values, key=int)]


def _mixture_values(summary: dict, q: dict) -> list:
    if "winner" in q:
        winners = summary["winners"][q["winner"]]
        return [winners[s] for s in sorted(winners, key=int)]
    if "step" in q:
        values = summary["history"][str(q["step"])][q["key"]]
    else:
        values = summary["rows"][q["dist"]][q["column"]]
    if "minus" in q:
        other = _mixture_values(summary, {k: v for k, v in {**q, **q["minus"]}.items() if k != "minus"})
        values = [a - b for a, b in zip(values, other)]
    return list(values)


def claim_values(claim: Claim, load: Callable[[str], dict]) -> list:
    """The claim's per-seed values (pooled over its quantities) from the runs `load(set name)` returns."""
    out = []
    for q in claim.quantities:
        out += set_values(q["set"], claim.sets[q["set"]], load(q["set"]), q)
    return out


# ---- a run's numbers, all of them ----------------------------------------------------------------------------------
# results.json's parts that hold what a run measured (not how long it took, where, or its prose): the tables, paired
# differences, selections and budgets (Part A); each stage's summary (Part B)
NUMBER_PARTS = ("rows", "weak_val_rows", "oracle_rows", "paired_by_reference", "weak_val_paired_by_reference",
                "selection", "budget", "same_step", "multi_teacher", "teacher_labels", "summary")


def numbers_digest(results: dict) -> str:
    """A digest of every number a run measured (full precision): equal digests are the same run to the last bit.
    Part A's results.json, or one Part B stage (`results[stages][stage]`)."""
    import hashlib
    import json

    parts = {k: results[k] for k in NUMBER_PARTS if k in results}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- checking -----------------------------------------------------------------------------------------------------
def fmt(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}".replace("-0." + "0" * decimals, "0." + "0" * decimals)


def _same(value, stated, decimals: int) -> bool:
    """Equal as printed: numbers at `decimals`, names (personas) as written; a pick read back as 1000.0 is 1000."""
    try:
        return fmt(float(value), decimals) == fmt(float(stated), decimals)
    except (TypeError, ValueError):
        return str(value) == str(stated)


def _seeds_rule(text: str) -> tuple[Optional[int], Optional[int], bool, str, Any]:
    m = SEEDS_RULE.match(str(text).strip())
    if m is None:
        raise ClaimsFileError(f"seeds: {text!r} is not 'k of n OP X', 'at least k of n OP X' or 'every seed OP X'")
    than = m["than"].strip()
    try:
        than = float(than)
    except ValueError:
        pass
    k, n = (None, None) if m["every"] else (int(m["k"]), int(m["n"]))
    return k, n, bool(m["atleast"]), m["op"], than


def _mean_rule(text) -> tuple[str, float]:
    """`mean_is: "> 0"` -> (">", 0.0)."""
    m = re.match(r"^\s*(>=|<=|>|<)\s*(\S+)$", str(text))
    if m is None:
        raise ClaimsFileError(f"mean_is: {text!r} is not 'OP X' (OP one of > >= < <=)")
    return m[1], float(m[2])


def statistics_of(values: list) -> dict:
    """Mean and 95% t-interval of per-seed values (NaN left out), as every table computes them."""
    m, sd, n = mean_std(list(values))
    return {"mean": m, "interval": ci95(m, sd, n), "n": n}


def problems(claim: Claim, values: list, exact: bool) -> list[tuple[str, str]]:
    """(assertion, what failed) for each assertion of the claim that fails on these per-seed values: the statements
    always, the stated numbers only in exact mode (the machine that made the table)."""
    spec, d, out = claim.spec, claim.decimals, []
    numeric = not claim.categorical
    stats = statistics_of(values) if numeric else {}
    interval = stats.get("interval")
    if exact:
        if "per_seed" in spec:
            if len(spec["per_seed"]) != len(values) or not all(_same(v, s, d) for v, s in zip(values, spec["per_seed"])):
                out.append(("per_seed", f"per-seed values {[_show(v, d) for v in values]} are not the stated "
                                    f"{spec['per_seed']}"))
        if "mean" in spec and not _same(stats["mean"], spec["mean"], d):
            out.append(("mean", f"mean {fmt(stats['mean'], d)} is not the stated {spec['mean']}"))
        if "interval" in spec and (interval is None
                                   or not all(_same(a, b, d) for a, b in zip(interval, spec["interval"]))):
            out.append(("interval", f"interval {_show_interval(interval, d)} is not the stated {spec['interval']}"))
    if "excludes" in spec and (interval is None or interval[0] <= spec["excludes"] <= interval[1]):
        out.append(("excludes", f"interval {_show_interval(interval, d)} does not exclude {spec['excludes']}"))
    if "includes" in spec and (interval is None or not interval[0] <= spec["includes"] <= interval[1]):
        out.append(("includes", f"interval {_show_interval(interval, d)} does not include {spec['includes']}"))
    if "mean_is" in spec:
        op, than = _mean_rule(spec["mean_is"])
        if not OPS[op](stats["mean"], than):
            out.append(("mean_is", f"mean {fmt(stats['mean'], d)} is not {op} {than:g}"))
    if "seeds" in spec:
        k, n, at_least, op, than = _seeds_rule(spec["seeds"])
        n_seen = len(values)
        hits = sum(1 for v in values if not _is_nan(v) and OPS[op](v, than))
        if n is not None and n_seen != n:
            out.append(("seeds", f"{n_seen} values, the claim counts {n}"))
        elif k is None and hits != n_seen or k is not None and (hits < k if at_least else hits != k):
            out.append(("seeds", f"{hits} of {n_seen} values are {op} {than} ({[_show(v, d) for v in values]}); "
                                 f"the claim says {spec['seeds']}"))
    return out


def documented_problems(claim: Claim) -> list[tuple[str, str]]:
    """The claim against its own stated per-seed values (the docs' evidence, rounded as printed): every statement
    must hold on them, and the stated mean and interval must be what they give, within the rounding of the printed
    per-seed values (half a unit each: one unit on the mean, 1 + t/√n units on an interval bound)."""
    spec, d = claim.spec, claim.decimals
    if "seeds" in spec and "per_seed" not in spec:
        return [("per_seed", "a 'seeds' statement needs the per-seed values it counts")]
    values = evidence(claim)
    out = problems(claim, values, exact=False)
    if claim.categorical:
        return out
    stats, unit = statistics_of(values), 10.0 ** -d
    if "mean" in spec and abs(stats["mean"] - spec["mean"]) > unit + 1e-9:
        out.append(("mean", f"the stated per-seed values give mean {fmt(stats['mean'], d + 1)}, not {spec['mean']}"))
    if "interval" in spec:
        interval = stats["interval"]
        slack = unit * (1 + 1.2 * _t_over_root_n(stats["n"])) + 1e-9
        if interval is None or any(abs(a - b) > slack for a, b in zip(interval, spec["interval"])):
            out.append(("interval", f"the stated per-seed values give {_show_interval(interval, d + 1)}, not "
                                    f"{spec['interval']}"))
    return out


def _t_over_root_n(n: int) -> float:
    interval = ci95(0.0, 1.0, n)
    return 0.0 if interval is None else interval[1]


def _is_nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _show(v, d: int):
    return v if isinstance(v, str) else fmt(float(v), d)


def _show_interval(interval, d: int) -> str:
    return "none (one seed)" if interval is None else f"[{fmt(interval[0], d)}, {fmt(interval[1], d)}]"


def check(claims: Iterable[Claim], load: Callable[[str], dict], machine_id: Callable[[str], Optional[str]]) -> dict:
    """{claim id: (mode, problems)} for the claims whose sets `load` can give (KeyError/FileNotFoundError: a set this
    run does not make, skipped); the mode is exact where every set's run was made on the machine its claims file
    records (`machine_id(set name)` is the run's fingerprint id)."""
    report = {}
    for claim in claims:
        try:
            values = claim_values(claim, load)
        except (KeyError, FileNotFoundError):
            continue
        if not applies_on(claim, machine_id(claim.set_names[0])):
            continue
        exact = all(recorded_on(claim.sets[s], machine_id(s)) for s in claim.set_names)
        report[claim.id] = ("exact" if exact else "claims", problems(claim, values, exact))
    return report


def applies_on(claim: Claim, machine: Optional[str]) -> bool:
    """A claim holds everywhere unless it names machines: `only_on` (what a rerun there showed, where it differs
    from the published run) or `except_on` (the published statement, which a rerun there contradicted)."""
    spec = claim.spec
    if "only_on" in spec:
        return machine in spec["only_on"]
    return machine not in spec.get("except_on", [])


def report_lines(report: dict) -> list[str]:
    return [f"{'held' if not p else 'FAILED'} [{mode}] {cid}" + ("" if not p else ": " + "; ".join(m for _, m in p))
            for cid, (mode, p) in report.items()]


# ---- falsifiers (the meta-test) ------------------------------------------------------------------------------------
def falsify(claim: Claim) -> dict[str, tuple[list, bool]]:
    """For each assertion of the claim: (per-seed values that break it, the mode it is asserted in). Built from the
    stated per-seed values, so each is "the documented run, changed just enough"."""
    spec, d = claim.spec, claim.decimals
    base = evidence(claim)
    out: dict[str, tuple[list, bool]] = {}
    unit = 10.0 ** -d
    if "per_seed" in spec:
        out["per_seed"] = ((["(another)"] if claim.categorical else [base[0] + 5 * unit]) + base[1:], True)
    if not claim.categorical:
        shift = lambda delta: [v + delta if not _is_nan(v) else v for v in base]  # noqa: E731
        if "mean" in spec:
            out["mean"] = (shift(5 * unit), True)
        if "interval" in spec:
            out["interval"] = (shift(5 * unit), True)
        interval = statistics_of(base)["interval"]
        if "excludes" in spec and interval:
            x = spec["excludes"]
            # the interval moved to straddle x by one unit
            out["excludes"] = (shift(x - interval[0] - unit if interval[0] > x else x - interval[1] + unit), False)
        if "includes" in spec and interval:
            x = spec["includes"]
            out["includes"] = (shift(x - interval[0] + unit), False)  # the whole interval one unit above x
        if "mean_is" in spec:
            op, than = _mean_rule(spec["mean_is"])
            target = than - unit if op.startswith(">") else than + unit
            out["mean_is"] = (shift(target - statistics_of(base)["mean"]), False)
    if "seeds" in spec:
        out["seeds"] = (_flip_one(base, spec["seeds"]), False)
    return out


def evidence(claim: Claim) -> list:
    """The per-seed values a claim is made of: as stated, or, for a claim that prints only a mean and an interval,
    the values over the set's seeds with exactly that mean and 95% t-interval (a fixed standardised pattern)."""
    spec = claim.spec
    if "per_seed" in spec:
        return list(spec["per_seed"])
    n = int(claim.sets[claim.set_names[0]].get("seeds", 0))
    if "mean" not in spec or "interval" not in spec or n < 2:
        raise ClaimsFileError(f"docs/claims/{claim.page}.yaml: claim {claim.id} states neither per-seed values nor a "
                              "mean, an interval and its set's `seeds:` count")
    std = (spec["interval"][1] - spec["mean"]) / _t_over_root_n(n)
    z = [i - (n - 1) / 2 for i in range(n)]
    z_std = math.sqrt(sum(x * x for x in z) / (n - 1))
    return [spec["mean"] + std * x / z_std for x in z]


def _flip_one(values: list, rule: str) -> list:
    """The values with one seed moved across the rule's threshold: one more hit where the count is exact and short
    of all, one fewer hit otherwise."""
    k, n, at_least, op, than = _seeds_rule(rule)
    holds = [not _is_nan(v) and OPS[op](v, than) for v in values]
    flip_to_hit = k is not None and not at_least and k < len(values)
    i = holds.index(not flip_to_hit) if (not flip_to_hit) in holds else 0
    out = list(values)
    if isinstance(than, str):
        out[i] = than if flip_to_hit else "(another)"
        if not flip_to_hit and op == "!=":
            out[i] = than
    else:
        step = 1.0 if op in (">", ">=", "==", "!=") else -1.0
        if op in ("==", "!="):
            out[i] = than if (flip_to_hit == (op == "==")) else than + 1.0
        else:
            out[i] = than + step if flip_to_hit else than - step
    return out


# ---- rendering into the pages --------------------------------------------------------------------------------------
SPAN = re.compile(r"<!-- claim: (?P<id>[\w.\-]+) -->(?P<body>.*?)<!-- /claim -->", re.S)


def signed(v: float, d: int) -> str:
    s = fmt(v, d)
    return ("+" + s if not s.startswith("-") else "−" + s[1:])


def render(claim: Claim) -> str:
    """The claim's text with its stated numbers: {mean} {lo} {hi} {interval} {per_seed} (signed, with the docs'
    minus sign, except for `unsigned` quantities: accuracies, shares)."""
    spec, d = claim.spec, claim.decimals
    show = (lambda v: fmt(float(v), d)) if _unsigned(claim) else (lambda v: signed(float(v), d))
    fields = {}
    if "mean" in spec:
        fields["mean"] = show(spec["mean"])
    if "interval" in spec:
        fields["lo"], fields["hi"] = (show(v) for v in spec["interval"])
        fields["interval"] = f"[{fields['lo']}, {fields['hi']}]"
    if "per_seed" in spec:
        fields["per_seed"] = ", ".join(str(v) if isinstance(v, str) else show(v) for v in spec["per_seed"])
    default = " ".join(p for p in (fields.get("mean"), fields.get("interval")) if p)
    text = spec.get("text", default)
    try:
        return text.format(**fields)
    except KeyError as e:
        raise ClaimsFileError(f"docs/claims/{claim.page}.yaml: claim {claim.id}: text names {e} that it does not state")


def _unsigned(claim: Claim) -> bool:
    q = claim.quantities[0]
    return "minus" not in q and (claim.set_names[0].startswith("mixture-") or str(q.get("key", "")).startswith("acc"))


def rendered_page(page: str, text: str, claims: list[Claim]) -> str:
    """The page with every claim span's body replaced by its claim's rendering."""
    by_id = {c.id: c for c in claims}

    def body(m: re.Match) -> str:
        if m["id"] not in by_id:
            raise ClaimsFileError(f"{PAGES[page]}: span <!-- claim: {m['id']} --> has no claim in docs/claims/{page}.yaml")
        return f"<!-- claim: {m['id']} -->{render(by_id[m['id']])}<!-- /claim -->"

    return SPAN.sub(body, text)


def render_pages() -> list[str]:
    """Rewrite every page's claim spans from its claims file; the pages changed."""
    changed = []
    for page, rel in PAGES.items():
        if not claims_files(page):
            continue
        path = os.path.join(ROOT, rel)
        text = open(path, encoding="utf-8").read()
        new = rendered_page(page, text, load_claims(page))
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            changed.append(rel)
    return changed


def record_line(results_json: str, stage: Optional[str] = None) -> str:
    """The `machine` and `numbers` of a set header for a run made here (paste into docs/claims/*.yaml when publishing
    its table): the fingerprint id and the digest of every number it measured."""
    import json

    with open(results_json, encoding="utf-8") as f:
        run = json.load(f)
    measured = run["stages"][stage] if stage else run
    return f"machine: {run_machine(run)}, numbers: {numbers_digest(measured)}"


if __name__ == "__main__":
    import sys

    try:
        if sys.argv[1:2] == ["record"]:  # python -m tests.claims record RESULTS_JSON [PART_B_STAGE]
            print(record_line(*sys.argv[2:4]))
        else:  # python -m tests.claims: render the claim spans of every page
            for rel in render_pages():
                print(f"rendered {rel}")
    except (ClaimsFileError, OSError, KeyError, TypeError) as err:  # a bad file or argument: one line, no page written
        sys.exit(f"error: python -m tests.claims {' '.join(sys.argv[1:])}: {type(err).__name__}: {err}")
