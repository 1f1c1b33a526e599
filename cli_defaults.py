"""Defaults of `cli.py` that do what a user expects (docs/reward_model.md, "Command line"), used by `cli.ShiftCLI`.

- Short class names: `--data PreferenceDataModule`, `--model RewardModelModule` (jsonargparse finds a subclass by
  its name among the classes imported, so the project's modules are imported here).
- No `--data` class given: the preference pairs' data module, so that `--data.source local:DIR` works alone. A
  config that names its data class (every shipped one, every protocol stage) is parsed as before.
- Two run options that are no part of a run's configuration (they change where it writes and what it prints, not
  what it computes): `--name` and `--verbose`. They are taken out of the parsed config at once, so they reach
  neither the run's `config.yaml` nor a protocol stage's identity (`protocols.engine.stage_identity`).
- Where a run writes: `--trainer.default_root_dir` moves the logger's folder with it (the default logger's
  `save_dir: runs` would otherwise win silently), `--name` names it, and `test` / `validate` of a checkpoint write
  beside that checkpoint (`.../version_0/test/<checkpoint>/`), not into a new version of the fits' folder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from jsonargparse import Namespace

# Imported for their classes' short names (jsonargparse resolves `--data PreferenceDataModule` among the
# subclasses it can see); every one of them is loaded anyway when a run builds it.
import datamodules.preference.datamodule  # noqa: F401
import datamodules.triggers.datamodule  # noqa: F401
import lightning_modules.policy.rl  # noqa: F401
import lightning_modules.policy.sft  # noqa: F401
import lightning_modules.reward.ensemble  # noqa: F401
import lightning_modules.reward.reward_model  # noqa: F401

DEFAULT_DATA_CLASS = "datamodules.preference.datamodule.PreferenceDataModule"
RUN_OPTIONS = ("name", "verbose")
DEFAULT_SAVE_DIR, DEFAULT_NAME = "runs", "default"  # the logger of `cli.main`'s trainer_defaults


@dataclass
class RunOptions:
    name: Optional[str] = None
    verbose: Optional[bool] = None  # None: not given (quiet; `validate` still prints its metrics, its only output)

    @property
    def loud(self) -> bool:
        return bool(self.verbose)


def add_run_options(parser) -> None:
    """`--name` and `--verbose` on a parser of `cli.py` (each subcommand's, and the protocols' parse-only one)."""
    parser.add_argument("--name", type=Optional[str], default=None,
                        help="Name of the run: its folder is <save_dir>/<name>/version_<k> (default: "
                             f"{DEFAULT_SAVE_DIR}/{DEFAULT_NAME}/version_<k>). Same as "
                             "--trainer.logger.init_args.name. Not part of the run's config.")
    parser.add_argument("--verbose", type=Optional[bool], nargs="?", const=True, default=None,
                        help="Show Lightning's own output too: its metric table after test (validate prints it "
                             "unless --verbose=false), tips, "
                             "deprecation warnings, the datasets / transformers progress bars. Not part of the run's "
                             "config.")


def pop_run_options(config: Namespace) -> RunOptions:
    """The run options, removed from `config` (a subcommand's, or the parse-only parser's). Called again before the
    classes are built: parsing a checkpoint's hyperparameters onto the config puts their defaults back."""
    sub = config.get("subcommand")
    where = config[sub] if sub else config
    found = {key: where.pop(key) for key in RUN_OPTIONS if key in where}
    return RunOptions(**found)


def place_run(config: Namespace, trainer_defaults: dict, options: RunOptions, subcommand: str) -> list[str]:
    """Set where the run writes, in `config` (the subcommand's); returns one-line notes for the user.

    A logger location counts as given when it differs from its default (`trainer_defaults`' logger, or the logger
    class's own defaults for another logger): that is what a flag or a --config file set. Then:
    - `--name N`: the logger's name (a given, different `--trainer.logger.init_args.name`: ValueError);
    - `--trainer.default_root_dir D` and no `save_dir` given: the logger writes under D;
    - `test` / `validate --ckpt_path X` with no location given: the run writes beside X, in
      `<X's version folder>/<subcommand>/<X's stem>/` (or `<X's folder>/<subcommand>/<stem>/` for a checkpoint
      outside a `checkpoints/` folder): a test of a fit's checkpoint takes no version number of the fits' folder.
    """
    trainer = config.get("trainer")
    logger = trainer.get("logger") if trainer is not None else None
    init = logger.get("init_args") if isinstance(logger, Namespace) else None
    if not isinstance(init, Namespace) or "save_dir" not in init or "name" not in init:
        if options.name:  # `--trainer.logger false`, or a logger without a folder of its own
            raise ValueError(f"--name {options.name}: this run's logger has no name to set (--trainer.logger "
                             f"{getattr(logger, 'class_path', logger)!r}); give --trainer.default_root_dir instead")
        return []
    defaults = _logger_defaults(logger.class_path, trainer_defaults)
    given = {k for k in ("save_dir", "name", "version") if k in init and init[k] != defaults.get(k)}
    root = trainer.get("default_root_dir")
    notes = []
    if options.name:
        if "name" in given and init.name != options.name:
            raise ValueError(f"--name {options.name} and --trainer.logger.init_args.name {init.name} disagree: "
                             "give one of them")
        init.name = options.name
    if root is not None:
        if "save_dir" not in given:
            init.save_dir = root
        elif os.path.abspath(str(init.save_dir)) != os.path.abspath(str(root)):
            notes.append(f"--trainer.default_root_dir {root}: the logs and checkpoints go to "
                         f"--trainer.logger.init_args.save_dir {init.save_dir} (given too); give that flag to move "
                         "them")
    ckpt = config.get("ckpt_path")
    if subcommand in ("test", "validate") and ckpt and os.path.isfile(ckpt) and not (root or options.name or given):
        init.save_dir, init.name, init.version = beside_checkpoint(ckpt, subcommand)
    return notes


def _logger_defaults(class_path: str, trainer_defaults: dict) -> dict:
    """The init args a logger of `class_path` gets when nothing is given: `cli.main`'s trainer_defaults for its
    logger class, else the class's own signature defaults."""
    import importlib
    import inspect

    default = trainer_defaults.get("logger")
    if isinstance(default, dict) and default.get("class_path") == class_path:
        return {"version": None, **default.get("init_args", {})}
    module, _, name = class_path.rpartition(".")
    try:
        signature = inspect.signature(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError, ValueError, TypeError):
        return {}
    return {p.name: p.default for p in signature.parameters.values() if p.default is not inspect.Parameter.empty}


def beside_checkpoint(ckpt: str, subcommand: str) -> tuple[str, str, str]:
    """(save_dir, name, version) of a `subcommand` run of the checkpoint `ckpt`: `<run>/<subcommand>/<stem>`, where
    <run> is the folder holding `checkpoints/` (Lightning's layout), else the checkpoint's own folder."""
    folder = os.path.dirname(os.path.abspath(ckpt))
    if os.path.basename(folder) == "checkpoints":
        folder = os.path.dirname(folder)
    stem = os.path.splitext(os.path.basename(ckpt))[0]
    return os.path.join(_relative(folder), subcommand), "", stem


def _relative(path: str) -> str:
    """`path` relative to the working directory when it lies under it (shorter lines in the logs)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel




# ---- the console: Lightning's and the libraries' noise, unless --verbose ------------------------------------------
# (category, message regex) of warnings a user can do nothing about: the libraries' own deprecations, and Lightning
# telling a test of a checkpoint that its ModelCheckpoint would write elsewhere (a test writes no checkpoint).
QUIET_WARNINGS = (
    (FutureWarning, r"Specifying null_placement in SortOptions is deprecated"),  # pyarrow, in `datasets.sort`
    (Warning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),  # torch's pytree, inside Lightning
    (Warning, r"The dirpath has changed from"),
    # on a machine with SLURM's client installed (as CI's, for the launcher tests): a plain run is not a SLURM run
    (Warning, r"The `srun` command is available on your system but is not used"),
)
# Lightning's advertisement for its cloud logger, and its start-up lines (which accelerators exist, the seed: the
# seed is in config.yaml, the device in the Trainer's own flags), printed on every Trainer before any error line.
QUIET_INFO_PREFIXES = ("💡 Tip:", "GPU available:", "TPU available:", "HPU available:", "Seed set to ")
_INFO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.fabric.utilities.seed")


class _DropInfo:
    """A logging filter: drops the records whose message starts with one of QUIET_INFO_PREFIXES."""

    def filter(self, record) -> bool:
        return not str(record.getMessage()).startswith(QUIET_INFO_PREFIXES)


_DROP_INFO = _DropInfo()


def quiet_console(verbose: bool) -> None:
    """Without `--verbose`: no `datasets` / `transformers` progress bars, none of QUIET_WARNINGS, no Lightning tip or
    start-up lines (QUIET_INFO_PREFIXES).
    With it, all of them again (a process that runs several commands, as a protocol does, gets what each asks for)."""
    import logging
    import warnings

    import datasets
    from transformers.utils import logging as transformers_logging

    ours = {(message, category) for category, message in QUIET_WARNINGS}
    warnings.filters[:] = [f for f in warnings.filters
                           if not (f[0] == "ignore" and (getattr(f[1], "pattern", None), f[2]) in ours)]
    getattr(warnings, "_filters_mutated", lambda: None)()  # the modules' "already warned" caches follow the list
    for category, message in QUIET_WARNINGS if not verbose else ():
        warnings.filterwarnings("ignore", message, category)
    for name in _INFO_LOGGERS:
        logger = logging.getLogger(name)
        logger.removeFilter(_DROP_INFO)
        if not verbose:
            logger.addFilter(_DROP_INFO)
    if verbose:
        datasets.enable_progress_bars()
        transformers_logging.enable_progress_bar()
    else:
        datasets.disable_progress_bars()
        transformers_logging.disable_progress_bar()  # "Loading weights" of a pretrained backbone
