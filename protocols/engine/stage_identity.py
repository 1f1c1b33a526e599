"""A protocol stage's identity: its resolved `cli.py` configuration, its checkpoint choice and its upstream inputs.

Comparing argument strings misses edits inside a config file (a model file changed to 2 layers keeps the same
`--config` path), so a stage is identified by every value after parsing all its config files and overrides
with the parser of `cli.py`, without instantiating anything. Keys that only say where a run writes (log and
checkpoint folders, the tokenization cache) are left out; the paths of upstream outputs (teacher checkpoint,
ceiling results) are replaced by the identity of the stage that produced them.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import re
import warnings
from typing import Any, Optional

# Run-location keys (dotted, as in `flatten`): the same run written elsewhere is the same stage.
LOCATION_KEYS = {
    "trainer.default_root_dir", "trainer.logger.init_args.save_dir", "trainer.logger.init_args.name",
    "trainer.logger.init_args.version", "data.init_args.cache_dir",
    "trainer.logger.init_args.default_hp_metric",  # logging only: Lightning's placeholder HPARAMS session
    # upstream outputs: their producing stage's identity stands for them (see `stage_identity`)
    "data.init_args.teacher_checkpoint", "model.init_args.ceiling_results",
}


class _Parsed(Exception):
    def __init__(self, parser, config):
        super().__init__("parsed")
        self.parser, self.config = parser, config


def resolve_cli_config(args: list[str]) -> dict:
    """Every value of `python cli.py fit <args>` as a plain dict, without instantiating the model or data.

    Raises ValueError with the parser's message when cli.py would refuse the arguments. The parser is built once per
    process (about 0.2 s each time otherwise: a protocol validates hundreds of stages) and parses each call afresh.
    """
    from argparse import ArgumentError

    cli, parser = _parse_only_cli()
    try:
        with warnings.catch_warnings():  # "args and sys.argv both given": on purpose here
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            cli.parse_arguments(parser, args)
    except _Parsed as parsed:
        dumped = parsed.parser.dump(parsed.config, format="json", skip_unset=False, skip_link_targets=False)
        return json.loads(dumped)
    except ArgumentError as err:
        raise ValueError(str(err)) from None
    raise AssertionError("ParseOnlyCLI returned without parsing")


@functools.lru_cache(maxsize=1)
def _parse_only_cli():
    """A ShiftCLI (its parser, links and guards) whose `parse_arguments` stops right after parsing, raising
    `_Parsed`; built once: its constructor's own parse only captures it and its parser."""
    from lightning.pytorch import LightningDataModule, LightningModule  # here: the engine imports this module

    from cli import ShiftCLI

    class ParseOnlyCLI(ShiftCLI):
        def parse_arguments(self, parser, args):
            if args is _CAPTURE:
                raise _Capture(self, parser)
            super().parse_arguments(parser, args)
            raise _Parsed(parser, self.config)

    try:  # the classes and subclass modes of `cli.main`
        ParseOnlyCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                     parser_kwargs={"exit_on_error": False}, args=_CAPTURE, run=False)
    except _Capture as captured:
        return captured.cli, captured.parser
    raise AssertionError("ParseOnlyCLI was built without parsing")


_CAPTURE = ["--capture-the-parser"]  # a sentinel list (compared by identity), never parsed


class _Capture(Exception):
    def __init__(self, cli, parser):
        super().__init__("captured")
        self.cli, self.parser = cli, parser


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": [1, 2]}} -> {"a.b.0": 1, "a.b.1": 2}; empty containers stay as values."""
    if isinstance(tree, dict) and tree:
        return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}{key}.").items()}
    if isinstance(tree, list) and tree:
        return {k: v for i, sub in enumerate(tree) for k, v in flatten(sub, f"{prefix}{i}.").items()}
    return {prefix[:-1]: tree}


def without_location(config: dict) -> dict[str, Any]:
    """The resolved config in the spelling finished runs recorded (`legacy_spelling`), flattened, minus run-location
    keys (and any callback's `dirpath`)."""
    flat = flatten(legacy_spelling(config))
    return {k: v for k, v in flat.items() if k not in LOCATION_KEYS and not k.endswith(".dirpath")}


def legacy_spelling(config: dict) -> dict:
    """The model's init args as the identities of finished runs spelt them, when its class says how: a static
    `legacy_init_args(init_args) -> init_args` on the model class. A class whose options moved (the reward model's
    regularisers became `--model.regularisers` plug-ins) maps an equivalent new spelling back to the old keys, so a
    run finished before the move is still the same stage, and both spellings of one run are one stage."""
    model = config.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("init_args"), dict):
        return config
    spell = getattr(_model_class(model.get("class_path")), "legacy_init_args", None)
    if spell is None:
        return config
    return {**config, "model": {**model, "init_args": spell(model["init_args"])}}


@functools.lru_cache(maxsize=None)
def _model_class(class_path: Any) -> Any:
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module, _, attr = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


def stage_identity(config: dict, checkpoint: str, upstream: dict[str, dict], model: str | None = None,
                   data: dict | None = None, search: dict | None = None) -> dict:
    """What a finished stage's result depends on. `upstream`: producing stage name -> {"identity", "run"}.
    `model`: for an outside model tested as is, the state of its files (`weak_labels.checkpoint_key`: path, sizes,
    mtimes; a hub id's commit), which its path in the config does not show; absent for stages that fit.
    `data`: the contents behind the data options (`protocols.engine.data_identity`). `search`: the teacher search's
    settings (`protocols.w2s.teacher_search`), when the stage fits one teacher per candidate and keeps one."""
    identity = {"config": without_location(config), "checkpoint": checkpoint, "upstream": upstream}
    if model is not None:
        identity["model"] = model
    if data is not None:
        identity["data"] = data
    if search is not None:
        identity["search"] = search
    return identity


class StageChangedError(ValueError):
    """A finished stage ran with another identity than the current configuration and data give it."""


def identity_changes(finished: dict | None, identity: dict) -> list[str]:
    """How a finished stage's recorded identity differs from `identity` (only the keys `identity` has), as
    'dotted.key: old → new' lines; [] when it is the same stage.

    Two differences are no change: a config key made a location key since (logging only), and an option added to
    the code since the stage ran, at its declared default (the convention for a new option keeps the old behaviour).
    """
    if not isinstance(finished, dict) or not isinstance(finished.get("identity"), dict):
        return ["identity: not recorded (a result of an older protocol version)"]
    old = {k: finished["identity"].get(k) for k in identity}
    if isinstance(old.get("config"), dict) and isinstance(identity.get("config"), dict):
        old["config"] = {k: v for k, v in old["config"].items() if k not in LOCATION_KEYS}
        new_at_default = added_at_default(old["config"], identity["config"])
        identity = {**identity, "config": {k: v for k, v in identity["config"].items() if k not in new_at_default}}
    return identity_diff(old, identity)


def only_upstream_changed(diff: list[str]) -> bool:
    """The stage differs only by the run of a stage it reads: it follows its upstream without being asked."""
    return bool(diff) and all(line.startswith("upstream.") for line in diff if not line.startswith("... and"))


def refusal(changed: list[tuple[str, list[str]]]) -> StageChangedError:
    """The error for finished stages (named by their folder) whose identity changed, each with its differences."""
    lines = "\n".join(f"  {where}: " + "; ".join(diff) for where, diff in changed)
    return StageChangedError(
        "finished stage(s) ran with another configuration or data than the current one (a stage is reused only "
        "when its resolved configuration, checkpoint choice, upstream stages and data files are the same):\n"
        f"{lines}\nRerun with --force to rerun every stage, or --force <stage> ... to rerun the named ones (their "
        "old outputs are deleted), or use another output folder.")


class ForceSpec:
    """`--force` (every stage), `--force NAME ...` (those stages, every seed; `seed<k>/NAME`: one seed), or absent.

    A forced stage runs again even when its identity is unchanged; a stage that reads it follows (its upstream run
    changed). A changed stage that is not forced is refused, naming its differences.
    """

    def __init__(self, names: list[str] | None):
        self.all = names is not None and len(names) == 0
        self.names: set[tuple[int | None, str]] = set()
        self._given: dict[tuple[int | None, str], str] = {}  # as typed, for a refusal
        for name in names or []:
            m = re.fullmatch(r"seed_?(\d+)/(.+)", name)
            key = (int(m.group(1)), m.group(2)) if m else (None, name)
            self.names.add(key)
            self._given[key] = name

    def __bool__(self) -> bool:
        return self.all or bool(self.names)

    def check(self, stage_names: set[str], flag: str = "--force", seeds: Optional[list[int]] = None) -> None:
        """Every name is a stage of the plan and, with `seeds`, every `seed<k>/` one of its seeds (a name that
        matches nothing would rerun nothing and exit 0 as if it had)."""
        known = stage_names | {n.partition("@")[0] for n in stage_names}  # a swept method names its variants
        unknown = sorted({n for _, n in self.names} - known)
        if unknown:
            raise ValueError(f"{flag} names unknown stage(s) {unknown}; the stages are {sorted(stage_names)}")
        other = sorted({s for s, _ in self.names if s is not None} - set(seeds)) if seeds is not None else []
        if other:
            named = sorted(self._given[(s, n)] for s, n in self.names if s in other)
            raise ValueError(f"{flag} {' '.join(named)}: seed(s) {other} are not among this run's seeds {seeds}")

    def forces(self, name: str, seed: int) -> bool:
        """`name` is a stage; a swept method's stage `<method>@<flag>=<value>` is also forced by `<method>`."""
        names = {name, name.partition("@")[0]}
        return self.all or any((None, n) in self.names or (seed, n) in self.names for n in names)


def check_seeds(seeds: list, flag: str = "--seeds") -> None:
    """Seeds are distinct non-negative integers, refused before any folder is made: a negative one made a
    `seed-1/` folder and then failed in numpy ("-1 is not in bounds"), a repeated one would count one run twice."""
    if not seeds:
        raise ValueError(f"{flag} must list at least one seed")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise ValueError(f"{flag} {seeds}: {bad} {'is' if len(bad) == 1 else 'are'} not a non-negative integer; "
                         "a seed is 0, 1, 2, ...")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:  # the table would say "over N seeds" of fewer runs
        raise ValueError(f"{flag} repeats {repeated}: {seeds}; each seed is one run of every stage, list it once")


def digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity_diff(old: dict, new: dict, limit: int = 5) -> list[str]:
    """'dotted.key: old → new' for the differing keys (at most `limit`, then a count of the rest)."""
    a, b = flatten(old), flatten(new)
    missing = "(absent)"
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, missing) != b.get(k, missing))
    lines = [f"{k}: {a.get(k, missing)!r} → {b.get(k, missing)!r}" for k in keys[:limit]]
    if len(keys) > limit:
        lines.append(f"... and {len(keys) - limit} more")
    return lines


_NO_DEFAULT = object()


def declared_default(key: str, config: dict[str, Any]) -> Any:
    """The default that the code declares for a flattened config key ("data.init_args.num_proc": the data class's
    `num_proc` parameter, "trainer.max_epochs": Trainer's), or `_NO_DEFAULT` when it cannot be told."""
    parts = key.split(".")
    if parts[0] == "trainer" and len(parts) == 2:
        from lightning.pytorch import Trainer

        cls, name = Trainer, parts[1]
    elif len(parts) >= 3 and parts[-2] == "init_args":
        cls_path = config.get(".".join(parts[:-2] + ["class_path"]))
        if not isinstance(cls_path, str) or "." not in cls_path:
            return _NO_DEFAULT
        module, _, attr = cls_path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            return _NO_DEFAULT
        name = parts[-1]
    else:
        return _NO_DEFAULT
    try:
        param = inspect.signature(cls).parameters.get(name)
    except (TypeError, ValueError):
        return _NO_DEFAULT
    return _NO_DEFAULT if param is None or param.default is inspect.Parameter.empty else param.default


def added_at_default(old_config: dict[str, Any], new_config: dict[str, Any]) -> set[str]:
    """Keys of `new_config` that `old_config` lacks and that hold the code's declared default: an option added to
    the code since the stage ran, whose default keeps the old behaviour (the convention for a new option), is no
    change of the stage."""
    added = {k: v for k, v in new_config.items() if k not in old_config}
    defaults = {k: declared_default(k, new_config) for k in added}  # imports and inspects: once per key
    return {k for k, v in added.items() if defaults[k] is not _NO_DEFAULT and _same(defaults[k], v)}


def _same(default: Any, value: Any) -> bool:
    try:
        return json.loads(json.dumps(default, default=str)) == value
    except (TypeError, ValueError):
        return False
