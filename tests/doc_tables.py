"""Documented tables as tests: a docs page embeds a run's Markdown table between two markers, and a slow test
regenerates the run and compares the numbers cell by cell.

    <!-- table: NAME -->
    | method | ID acc | ... |
    |---|---|---|
    | naive | 89.0 | ... |
    <!-- /table: NAME -->
"""
from __future__ import annotations

import math
import os
import re
from typing import NamedTuple, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The exponent is part of the number: the drift cells print 8.02e-05, which read as 8.02 would let a 100x change pass.
_NUMBER = r"[+\-−]?\d+(?:\.\d+)?(?:[eE][+\-−]?\d+)?"
NUMBER = re.compile(_NUMBER)


def to_float(text: str) -> float:
    """A number as the reports print it (a typographic minus, an exponent)."""
    return float(text.replace("−", "-"))


def documented_table(page: str, name: str) -> str:
    """The Markdown between `<!-- table: name -->` and `<!-- /table: name -->` in docs/<page>."""
    text = open(os.path.join(ROOT, "docs", page), encoding="utf-8").read()
    match = re.search(rf"<!-- table: {re.escape(name)} -->\n(.*?)<!-- /table: {re.escape(name)} -->", text, re.S)
    if match is None:
        raise AssertionError(f"docs/{page} has no table marked {name!r}")
    return match.group(1)


def first_table(markdown: str) -> str:
    """The first Markdown table of a page (its first run of consecutive `|` lines): a run's report may hold more
    tables after its headline one."""
    lines = markdown.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip().startswith("|")), None)
    if start is None:
        raise AssertionError(f"no Markdown table in:\n{markdown[:500]}")
    end = next((i for i in range(start, len(lines)) if not lines[i].strip().startswith("|")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def table_after(markdown: str, heading: str) -> str:
    """The first Markdown table after the first line that starts with `heading`: a report's later tables (the
    `weak_val` table below the `id_val` one) compared as the headline one is."""
    lines = markdown.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith(heading)), None)
    if start is None:
        raise AssertionError(f"no line starting with {heading!r} in:\n{markdown[:500]}")
    return first_table("\n".join(lines[start + 1:]))


def parse_table(markdown: str) -> dict[str, dict[str, float]]:
    """{row label: {column header: first number in the cell}}; cells without a number (–, 0 rows) are skipped
    except a bare 0. The first column is the row label."""
    lines = [l.strip() for l in markdown.splitlines() if l.strip().startswith("|")]
    if len(lines) < 3:
        raise AssertionError(f"not a Markdown table:\n{markdown}")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        values = {}
        for col, cell in zip(header[1:], cells[1:]):
            m = NUMBER.search(cell.replace("**", ""))
            if m:
                values[col] = to_float(m.group(0))
        rows[cells[0]] = values
    return rows


def table_differences(documented: dict, measured: dict, tolerance) -> list[str]:
    """Every cell of the documented table that the measured one lacks or misses by more than `tolerance`: a number,
    or a function (column, documented value) -> allowed absolute deviation, for tables mixing units."""
    allowed = tolerance if callable(tolerance) else (lambda col, value: tolerance)
    problems = []
    for row, cols in documented.items():
        if row not in measured:
            problems.append(f"row {row!r} missing from the run")
            continue
        for col, value in cols.items():
            got = measured[row].get(col)
            if got is None or not math.isclose(got, value, rel_tol=0.0, abs_tol=allowed(col, value)):
                problems.append(f"{row} / {col}: documented {value}, measured {got}")
    return problems


def documented_columns(measured: dict, documented: dict) -> dict:
    """`measured` cut to the cells a documented table has: a run's report may print columns that a table published
    before them lacks (the absolute OOD accuracies beside the gains, issue 47); those are not compared."""
    return {row: {col: value for col, value in cols.items() if col in documented.get(row, {})}
            for row, cols in measured.items()}


MEAN_STD = re.compile(rf"^\s*({_NUMBER})\s*±\s*({_NUMBER})")


def parse_mean_std_table(markdown: str) -> dict[str, dict[str, tuple[float, float]]]:
    """{row label: {column header: (mean, std)}} for the cells written `mean ± std (per-seed values)` (the multi-seed
    tables of protocols.mixture.report); other cells are skipped."""
    lines = [l.strip() for l in markdown.splitlines() if l.strip().startswith("|")]
    if len(lines) < 3:
        raise AssertionError(f"not a Markdown table:\n{markdown}")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = {col: (to_float(m.group(1)), to_float(m.group(2)))
                          for col, cell in zip(header[1:], cells[1:]) if (m := MEAN_STD.match(cell))}
    return rows


# A Part B "dominant after" cell (protocols.mixture.report._dominant_cell): one or more `name (k/n seeds)` parts, comma
# separated ("no tag" counts the seeds whose completions mostly carry no persona tag), then optionally `; shares: name`
# when the share columns follow a persona other than the first listed.
DOMINANT_PART = re.compile(r"^(.+?) \((\d+)/(\d+) seeds\)$")


class Dominant(NamedTuple):
    parts: tuple  # ((persona, k, n), ...) in the cell's order
    shares: Optional[str]  # the persona the share columns follow, when the cell names it


def parse_dominant_cell(cell: str) -> Dominant:
    """'Alice (3/3 seeds)' -> Dominant((("Alice", 3, 3),), None); '2026 (1/3 seeds), no tag (2/3 seeds); shares: 2024'
    -> Dominant((("2026", 1, 3), ("no tag", 2, 3)), "2024"). Anything else raises: a cell the test cannot read is not
    silently skipped."""
    text, _, shares = cell.replace("**", "").strip().partition("; shares: ")
    parts = []
    for part in text.split(", "):
        m = DOMINANT_PART.match(part.strip())
        if m is None:
            raise AssertionError(f"not a 'dominant after' cell: {cell!r}")
        parts.append((m.group(1), int(m.group(2)), int(m.group(3))))
    return Dominant(tuple(parts), shares.strip() or None)


def parse_dominant(markdown: str, column: str = "dominant after") -> dict[str, Dominant]:
    """{row label: Dominant} from a Part B before/after table's `dominant after` column."""
    lines = [l.strip() for l in markdown.splitlines() if l.strip().startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    if column not in header:
        raise AssertionError(f"no {column!r} column in {header}")
    at = header.index(column)
    return {cells[0]: parse_dominant_cell(cells[at])
            for cells in ([c.strip() for c in l.strip("|").split("|")] for l in lines[2:])}
