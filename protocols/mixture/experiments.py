"""Part B experiments as YAML files (configs/mixture/experiments/<name>.yaml, or a file of one's own), as Part A's are.

    # <one line: what the experiment tests>
    family: two_policies          # the folder under --out; experiments of one family share stages (by identity)
    summary: RL on one distribution selects the persona that answers it.
    family_file: my_family.yaml   # optional: the trigger family every stage reads (--data.family; relative to here)
    question_fixtures: false      # optional: generate ARC / RACE questions in the hub schemas (--data.question_dirs)
    extends: two_policies         # optional: take this shipped experiment's stages...
    stack: {sft: cpu/smollm2_sft, rl: cpu/smollm2_rl}   # ...optional: with these configs stacked on each stage
    stages:
      - {name: sft, config: two_policies_sft, title: SFT, sft: true}
      - name: two_policies_rl_A_persona
        config: two_policies_rl_A                 # configs/mixture/<name>.yaml, or a .yaml path relative to here
        title: GRPO on A, persona tokens only
        args: [--model.persona_tokens_only=true]  # cli.py arguments of this stage
        start: sft                                # the stage it starts from (default: sft; the first stage: none)

An RL stage (`sft: false`, the default) logs as `mixture/<name>` (its own TensorBoard folder and table).
"""
from __future__ import annotations

import difflib
import glob
import os
from typing import Optional

from datamodules.triggers.family_files import unknown_field
from protocols.mixture.stages import ROOT, Experiment, Stage

SHIPPED_DIR = os.path.join(ROOT, "configs", "mixture", "experiments")
FIELDS = ("family", "summary", "family_file", "question_fixtures", "extends", "stack", "stages")
STAGE_FIELDS = ("name", "config", "title", "args", "start", "sft")


class ExperimentFileError(ValueError):
    """An experiment file that cannot be run: the message names the file and the field."""


def _fail(path: str, field: str, problem: str) -> ExperimentFileError:
    return ExperimentFileError(f"{path}: {field}: {problem}")


def _unknown(path: str, where: str, keys, known) -> None:
    found = unknown_field(keys, known)
    if found:
        raise _fail(path, f"{where}{found[0]}", found[1])


def _config_path(path: str, field: str, value) -> str:
    """A shipped config's name -> `configs/mixture/<name>.yaml` (relative, as the identities hold it); a .yaml path ->
    absolute, read from the experiment file's folder."""
    if not isinstance(value, str) or not value:
        raise _fail(path, field, "a config name (configs/mixture/<name>.yaml) or a .yaml path")
    if value.endswith((".yaml", ".yml")):
        full = os.path.abspath(os.path.join(os.path.dirname(path), os.path.expanduser(value)))
        if not os.path.isfile(full):
            raise _fail(path, field, f"no file {value!r} (looked for {full})")
        return full
    rel = f"configs/mixture/{value}.yaml"
    if not os.path.isfile(os.path.join(ROOT, rel)):
        raise _fail(path, field, f"no shipped config {rel}")
    return rel


def load_experiment(path: str, shipped: Optional[dict] = None) -> Experiment:
    """Read and check one experiment file; `shipped`: the experiments an `extends:` may name."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as err:
        raise ExperimentFileError(f"{path}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if not isinstance(raw, dict):
        raise _fail(path, "(file)", "a mapping with family and stages (or extends) expected")
    _unknown(path, "", raw, list(FIELDS))
    family = raw.get("family")
    family_file = None
    if raw.get("family_file") is not None:
        from datamodules.triggers.family_files import load_family

        family_file = os.path.abspath(os.path.join(os.path.dirname(path), str(raw["family_file"])))
        if not os.path.isfile(family_file):
            raise _fail(path, "family_file", f"no file {raw['family_file']!r} (looked for {family_file})")
        family = family or load_family(family_file).name  # a bad family file fails here, before any stage runs
    if not isinstance(family, str) or not family:
        raise _fail(path, "family", "missing: the folder under --out this experiment's runs go to")
    if raw.get("extends") is not None:
        base = (shipped or {}).get(raw["extends"])
        if base is None:
            raise _fail(path, "extends", f"{raw['extends']!r} is no shipped experiment; known: {sorted(shipped or {})}")
        stages = base.stages
    else:
        if not isinstance(raw.get("stages"), list) or not raw["stages"]:
            raise _fail(path, "stages", "missing: a list of stages, the first an SFT")
        stages = tuple(_stage(path, i, s, family_file) for i, s in enumerate(raw["stages"]))
    if raw.get("stack") is not None:
        stack = raw["stack"]
        if not isinstance(stack, dict) or set(stack) - {"sft", "rl"}:
            raise _fail(path, "stack", "a mapping {sft: CONFIG, rl: CONFIG}")
        stages = tuple(_stacked(s, path, stack) for s in stages)
    _check_graph(path, stages)
    return Experiment(family, tuple(stages), str(raw.get("summary") or ""), bool(raw.get("question_fixtures", False)))


def _stage(path: str, i: int, raw, family_file: Optional[str]) -> Stage:
    where = f"stages[{i}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "a mapping with name, config and title")
    _unknown(path, f"{where}.", raw, list(STAGE_FIELDS))
    for key in ("name", "config"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise _fail(path, f"{where}.{key}", "missing")
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _fail(path, f"{where}.args", "a list of cli.py arguments (strings)")
    sft = bool(raw.get("sft", False))
    extra = ((f"--data.family={family_file}",) if family_file else ()) + tuple(args)
    if not sft:
        extra += (f"--trainer.logger.init_args.name=mixture/{raw['name']}",)
    start = raw.get("start", None if i == 0 else "sft")
    return Stage(raw["name"], _config_path(path, f"{where}.config", raw["config"]), str(raw.get("title") or raw["name"]),
                 extra, start, sft)


def _stacked(stage: Stage, path: str, stack: dict) -> Stage:
    """`stage` with a config stacked on it (`--config` before its own arguments), e.g. the CPU-sized SmolLM2 layers."""
    which = "sft" if stage.sft else "rl"
    if which not in stack:
        return stage
    layer = _config_path(path, f"stack.{which}", stack[which])
    return Stage(stage.name, stage.config, stage.title, ("--config", os.path.join(ROOT, layer), *stage.extra),
                 stage.start, stage.sft)


def _check_graph(path: str, stages) -> None:
    names = [s.name for s in stages]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _fail(path, "stages", f"names repeat: {dup}")
    if not stages[0].sft or stages[0].start is not None:
        raise _fail(path, "stages[0]", "the first stage is an SFT from scratch (sft: true, no start)")
    for i, s in enumerate(stages):
        if s.start is not None and s.start not in names[:i]:
            raise _fail(path, f"stages[{i}].start", f"{s.start!r} is no stage before it ({names[:i]})")


def shipped_experiments() -> dict[str, Experiment]:
    """configs/mixture/experiments/<name>.yaml by name; a file that `extends` another is read after it."""
    paths = sorted(glob.glob(os.path.join(SHIPPED_DIR, "*.yaml")))
    out: dict[str, Experiment] = {}
    pending = {os.path.basename(p)[:-5]: p for p in paths}
    while pending:
        progressed = False
        for name, p in list(pending.items()):
            import yaml

            base = (yaml.safe_load(open(p, encoding="utf-8")) or {}).get("extends")
            if base is None or base in out:
                out[name] = load_experiment(p, out)
                del pending[name]
                progressed = True
        if not progressed:
            raise ExperimentFileError(f"{SHIPPED_DIR}: extends forms a loop or names no experiment: {sorted(pending)}")
    return out


def find_experiment(value: str, shipped: dict[str, Experiment]) -> tuple[str, Experiment]:
    """(name, experiment) for a shipped name or an experiment file's path; the name of a file is its absolute path
    (a cluster job reads it again)."""
    if value in shipped:
        return value, shipped[value]
    if value.endswith((".yaml", ".yml")):
        full = os.path.abspath(value)
        if not os.path.isfile(full):
            raise ExperimentFileError(f"no experiment file {value!r} (looked for {full})")
        return full, load_experiment(full, shipped)
    near = difflib.get_close_matches(value, list(shipped), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ExperimentFileError(f"unknown experiment {value!r}{hint}: give one of {sorted(shipped)} or an experiment "
                              "file (.yaml)")
