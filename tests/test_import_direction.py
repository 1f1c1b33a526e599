"""The import direction of STYLE.md, measured on the source: no circle among the project's modules, no arrow
running up a floor, and the stage engine blind to the protocols that use it.

Every `.py` of the project's rooms is parsed with `ast`; each import -- absolute or relative, at module level or
inside a function, and `importlib.import_module("a.constant")` -- is resolved to the project module it names (the
longest dotted prefix that is one of ours: `from pkg import name` is an edge to `pkg`, `from pkg import submodule`
an edge to the submodule). A package's `__init__` that Python runs before a submodule is not counted: only the
imports written down are.
"""
from __future__ import annotations

import ast
import os
from collections import defaultdict
from functools import lru_cache
from typing import Iterable, NamedTuple, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Floors, from the ground up (STYLE.md "Import direction"); a module imports only from its own floor or below.
# `analysis/` is pure math (the Prop. 2.1 simulator): a ground-floor room that imports nothing of the project.
FLOORS = {
    "analysis": 0,
    "command_errors": 0,  # one line per failure of any command: the standard library only
    "datamodules": 0,
    "lightning_modules": 1,
    "callbacks": 2,
    "cli": 3,
    "cli_guards": 3,
    "cli_defaults": 3,
    "protocols": 4,
    "benchmarks": 5,
}
# Rooms that import nothing of the project outside themselves.
SELF_CONTAINED = {"analysis", "command_errors"}

ENGINE = "protocols.engine"
# protocols/ in three wings: the protocol-blind engine, and one package per protocol; the engine imports neither
# protocol, and the protocols do not import each other.
WINGS = ("protocols.w2s", "protocols.mixture")


class Edge(NamedTuple):
    src: str  # importing module
    dst: str  # imported project module
    where: str  # "path:line"

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst} ({self.where})"


def project_modules(root: str, rooms: Iterable[str]) -> dict[str, str]:
    """Module name -> file, for every .py of the rooms (a package directory or a top-level module name)."""
    modules = {}
    for room in rooms:
        single = os.path.join(root, room + ".py")
        if os.path.isfile(single):
            modules[room] = single
            continue
        for folder, dirs, names in os.walk(os.path.join(root, room)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            for name in sorted(names):
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                modules[".".join(rel)] = os.path.join(folder, name)
    return modules


def _resolve(name: str, modules: dict[str, str]) -> Optional[str]:
    """The project module a dotted name denotes: its longest prefix that is one of ours, or None."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import node (or an `importlib.import_module("x")` call) brings in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        return [f"{base}.{alias.name}" for alias in node.names]  # resolved to `base` when the name is no module
    if isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def import_graph(root: str, rooms: Iterable[str]) -> tuple[set[str], list[Edge]]:
    """The project's modules and every import edge between two of them (a module importing itself is left out)."""
    modules = project_modules(root, rooms)
    edges = set()  # one edge per import line (not per imported name)
    for module, path in sorted(modules.items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = os.path.basename(path) == "__init__.py"
        for node in ast.walk(tree):
            for name in _imported_names(node, module, is_package):
                target = _resolve(name, modules)
                if target is not None and target != module:
                    edges.add(Edge(module, target, f"{os.path.relpath(path, root)}:{node.lineno}"))
    return set(modules), sorted(edges)


def cycles(modules: set[str], edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    succ = defaultdict(set)
    for e in edges:
        succ[e.src].add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(succ[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def floor_of(module: str, floors: dict[str, int]) -> int:
    return floors[module.split(".", 1)[0]]


def upward_edges(edges: list[Edge], floors: dict[str, int]) -> list[Edge]:
    return [e for e in edges if floor_of(e.dst, floors) > floor_of(e.src, floors)]


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def engine_protocol_edges(edges: list[Edge], engine: str = ENGINE) -> list[Edge]:
    """Edges from the stage engine to a protocol module (anything under protocols/ outside the engine)."""
    outside = engine.rsplit(".", 1)[0]
    return [e for e in edges if _in_package(e.src, engine) and _in_package(e.dst, outside)
            and not _in_package(e.dst, engine)]


def cross_wing_edges(edges: list[Edge], wings: Iterable[str] = WINGS) -> list[Edge]:
    """Edges from one protocol's package into another's."""
    return [e for e in edges for a in wings for b in wings
            if a != b and _in_package(e.src, a) and _in_package(e.dst, b)]


def _listing(edges: Iterable[Edge]) -> str:
    return "\n  ".join(str(e) for e in sorted(edges))


def _cycle_report(found: list[list[str]], edges: list[Edge]) -> str:
    lines = []
    for component in found:
        members = set(component)
        inner = [e for e in edges if e.src in members and e.dst in members]
        lines.append(f"circle of {len(component)} modules: {', '.join(component)}\n    "
                     + "\n    ".join(str(e) for e in sorted(inner)))
    return "\n  ".join(lines)


@lru_cache(maxsize=1)
def _project() -> tuple[frozenset, tuple]:
    modules, edges = import_graph(ROOT, FLOORS)
    return frozenset(modules), tuple(edges)


def _edges_from(room: str) -> list[Edge]:
    return [e for e in _project()[1] if _in_package(e.src, room)]


# ---- the project ---------------------------------------------------------------------------------------------
def test_the_graph_sees_the_project():
    # guards every test below against passing on an empty or half-read graph
    modules, edges = _project()
    for known in ("datamodules.preference.datamodule", "lightning_modules.reward.reward_model", "cli",
                  "protocols.w2s", "analysis.mixture_flows"):
        assert known in modules
    assert ("cli", "cli_guards") in {(e.src, e.dst) for e in edges}
    assert len(edges) > 200, len(edges)


def test_no_import_circle_in_the_data_layer():
    modules, edges = _project()
    found = [c for c in cycles(set(modules), list(edges)) if any(_in_package(m, "datamodules") for m in c)]
    assert not found, "import circles through datamodules/:\n  " + _cycle_report(found, list(edges))


def test_no_import_circle():
    modules, edges = _project()
    found = cycles(set(modules), list(edges))
    assert not found, "import circles (strongly connected components):\n  " + _cycle_report(found, list(edges))


def test_the_data_layer_imports_no_model():
    up = [e for e in _edges_from("datamodules") if _in_package(e.dst, "lightning_modules")]
    assert not up, "datamodules/ imports lightning_modules/ (weak labels reach the data as a file):\n  " + _listing(up)


def test_no_import_runs_up_a_floor():
    up = upward_edges(list(_project()[1]), FLOORS)
    assert not up, ("imports from a higher floor (floors: " + ", ".join(f"{k} {v}" for k, v in FLOORS.items())
                    + "):\n  " + _listing(up))


def test_self_contained_rooms_import_nothing_of_the_project():
    bad = [e for room in SELF_CONTAINED for e in _edges_from(room) if not _in_package(e.dst, room)]
    assert not bad, "a self-contained room imports the project:\n  " + _listing(bad)


def test_the_engine_imports_no_protocol():
    modules, edges = _project()
    if not any(_in_package(m, ENGINE) for m in modules):
        pytest.skip(f"{ENGINE} does not exist yet")
    bad = engine_protocol_edges(list(edges))
    assert not bad, f"{ENGINE} imports protocol modules:\n  " + _listing(bad)


def test_the_protocols_do_not_import_each_other():
    bad = cross_wing_edges(list(_project()[1]))
    assert not bad, "a protocol imports another protocol's package:\n  " + _listing(bad)


# ---- the seam that replaces the data layer's arrow up: the labeller is handed to the data module --------------------
def test_a_data_module_without_a_labeller_names_the_flag_and_the_fix(word_tokenizer_dir, cache_dir, tmp_path):
    import zipfile

    from datamodules.preference.datamodule import PreferenceDataModule
    from lightning_modules.reward.weak_labeller import attach_weak_labeller, compute_weak_labels
    from tests.helpers import SOURCE, TARGETS, synth_options

    teacher = str(tmp_path / "teacher.ckpt")
    with zipfile.ZipFile(teacher, "w") as archive:  # an intact archive: passes the constructor's file check
        archive.writestr("teacher/data.pkl", b"not read before the labeller is asked for")
    dm = PreferenceDataModule(source=SOURCE, ood_targets=TARGETS, tokenizer=word_tokenizer_dir, max_length=96,
                              source_options=synth_options(n_train=40, n_validation=8, n_test=9),
                              train_subset="student", teacher_checkpoint=teacher, cache_dir=cache_dir)
    assert dm.weak_labeller is None
    with pytest.raises(RuntimeError, match=rf"--data.teacher_checkpoint {teacher}: its weak labels are not cached "
                                           r".*attach_weak_labeller\(dm\).*--data.weak_labels"):
        dm.prepare_data()
    attach_weak_labeller(dm)
    assert dm.weak_labeller is compute_weak_labels

    def mine(*args, **kwargs):
        return {}

    dm.weak_labeller = mine
    attach_weak_labeller(dm)  # one handed in already stays
    assert dm.weak_labeller is mine
    attach_weak_labeller(None)  # no data module (a bare `cli.py` call) / one that labels nothing: untouched
    other = type("Other", (), {})()
    attach_weak_labeller(other)
    assert not hasattr(other, "weak_labeller")


# ---- the resolver itself, on a hand-made tree -------------------------------------------------------------------
def _write(root, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_resolver_finds_circles_and_upward_imports(tmp_path):
    _write(tmp_path, "low/__init__.py", "")
    _write(tmp_path, "low/base.py", "import os\n\ndef plugins():\n    from . import plugin  # noqa\n")
    _write(tmp_path, "low/plugin.py", "from low.base import thing\n")
    _write(tmp_path, "low/data.py", "def f():\n    from high.model import Model\n    from ..high import other\n")
    _write(tmp_path, "low/clean.py", "from low import base\nimport numpy\n")
    _write(tmp_path, "high/__init__.py", "from .model import Model\n")
    _write(tmp_path, "high/model.py", "import low.clean\nimport importlib\nimportlib.import_module('high.engine.run')\n")
    _write(tmp_path, "high/engine/__init__.py", "")
    _write(tmp_path, "high/engine/run.py", "from high import shared, model\nfrom . import step\n")
    _write(tmp_path, "high/engine/step.py", "")
    _write(tmp_path, "high/shared.py", "")
    _write(tmp_path, "top.py", "import high.model\n")

    modules, edges = import_graph(str(tmp_path), ["low", "high", "top"])
    assert {"low", "low.base", "low.plugin", "high", "high.model", "high.engine.run", "top"} <= modules
    pairs = {(e.src, e.dst) for e in edges}
    assert pairs == {
        ("low.base", "low.plugin"), ("low.plugin", "low.base"),  # relative, inside a function
        ("low.data", "high.model"), ("low.data", "high"),  # `from ..high import other`: no module `other`
        ("low.clean", "low.base"),
        ("high", "high.model"), ("high.model", "low.clean"), ("high.model", "high.engine.run"),
        ("high.engine.run", "high.shared"), ("high.engine.run", "high.model"), ("high.engine.run", "high.engine.step"),
        ("top", "high.model"),
    }
    assert cycles(modules, edges) == [["high.engine.run", "high.model"], ["low.base", "low.plugin"]]
    up = upward_edges(edges, {"low": 0, "high": 1, "top": 2})
    assert {(e.src, e.dst) for e in up} == {("low.data", "high.model"), ("low.data", "high")}
    assert all(e.where.startswith("low/data.py:") for e in up)
    bad = engine_protocol_edges(edges, "high.engine")
    assert sorted((e.src, e.dst) for e in bad) == [("high.engine.run", "high.model"), ("high.engine.run", "high.shared")]
    crossing = cross_wing_edges(edges, ("low", "high"))
    assert sorted((e.src, e.dst) for e in crossing) == [("high.model", "low.clean"), ("low.data", "high"),
                                                        ("low.data", "high.model")]
    assert "low.base -> low.plugin (low/base.py:4)" in _cycle_report(cycles(modules, edges), edges)


def test_no_file_of_protocols_is_over_450_lines():
    """A file a reader can hold in mind (issue 51): a longer one is split where its concerns part."""
    folder = os.path.join(ROOT, "protocols")
    long = {os.path.relpath(os.path.join(d, f), ROOT): n for d, _, files in os.walk(folder) for f in files
            if f.endswith(".py") and (n := sum(1 for _ in open(os.path.join(d, f)))) > 450}
    assert not long, f"files of protocols/ over 450 lines: {long}"
