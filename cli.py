"""Command line: `python cli.py fit|validate|test --config configs/...` (LightningCLI, subclass mode).

Any LightningModule / LightningDataModule is chosen by `class_path` in the config. Links keep values that must
agree in one place: the data module tokenizes with the model's tokenizer (`--model.tokenizer`). The frozen
reference model's callback is always present (`--reference.*`) and does nothing unless the model asks for it.

Defaults that do what a user expects live in `cli_defaults.py` (no `--data` class: the preference pairs' one; short
class names; `--name`, `--verbose`; `--trainer.default_root_dir` honoured; `test` writes beside its checkpoint) and
`callbacks/run_summary.py` (the end of `fit`). Three guards live in `cli_guards.py`: `--model.objective naive`
(registry names), `--ckpt_path` never silently overriding explicit `--model.*` values, and a mistyped key named first
with the closest valid one.
Checkpoints are written through `lightning_modules.checkpoint_io.AtomicCheckpointIO` (complete or absent, never
half-written under their final name); `--ckpt_path` is checked (intact archive, this model's kind) before use.
`python cli.py export --ckpt_path X --out_dir D` writes a checkpoint as a transformers directory instead
(`lightning_modules/export/`, docs/export.md).
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from callbacks.reference_model import ReferenceModelCallback
from callbacks.run_summary import RunSummary
from cli_defaults import (DEFAULT_DATA_CLASS, RunOptions, add_run_options, place_run, pop_run_options,
                          quiet_console)
from cli_guards import (ShiftArgumentParser, check_ckpt_path, checkpoint_disagreements, cli_error_line, inner_cause,
                        run_log_of)
from command_errors import TRACEBACK_ENV, exit_with, run_command, split_traceback_flag
from lightning_modules.checkpoint_checks import CheckpointError
from lightning_modules.checkpoint_io import install_atomic_checkpoint_io
from lightning_modules.reward.weak_labeller import attach_weak_labeller


class ShiftCLI(LightningCLI):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parser_class", ShiftArgumentParser)
        self.run_options = RunOptions()
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # `--verbose` is ours on every subcommand (cli_defaults.add_run_options): Trainer.test/validate's own is skipped
        return {sub: skip | ({"verbose"} if sub in ("test", "validate") else set())
                for sub, skip in LightningCLI.subcommands().items()}

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        parser = super().init_parser(**kwargs)
        parser.lead_errors = True  # errors of the class parsers nested in it arrive here, as one long message
        return parser

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ReferenceModelCallback, "reference")
        parser.link_arguments("model.init_args.tokenizer", "data.init_args.tokenizer")
        parser.set_defaults({"data": {"class_path": DEFAULT_DATA_CLASS}})  # `--data.source local:DIR` alone works
        add_run_options(parser)  # --name, --verbose: taken out of the config once parsed (no part of an identity)

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        self.run_options = pop_run_options(self.config)
        try:  # before LightningCLI reads its hyperparameters: a truncated file would fail there, naming nothing
            check_ckpt_path(self.config)
        except CheckpointError as err:
            parser.error(str(err))
        differing = checkpoint_disagreements(parser, args, self.config)
        if differing:
            sub = self.config.subcommand
            parser.error(f"--ckpt_path {self.config[sub].ckpt_path}: the model is built from the checkpoint's "
                         "hyperparameters, and these values given explicitly (flags or --config files) differ:\n  "
                         + "\n  ".join(differing) + "\nDrop them to use the checkpoint's values.")
        sub = self.config.get("subcommand")
        if sub:  # a run (not the protocols' parse-only parser): what it prints, where it writes
            quiet_console(self.run_options.loud)
            try:
                notes = place_run(self.config[sub], self.trainer_defaults, self.run_options, sub)
            except ValueError as err:
                parser.error(str(err))
            for note in notes:
                rank_zero_info(note)

    def before_instantiate_classes(self) -> None:
        pop_run_options(self.config)  # parsing the checkpoint's hyperparameters onto the config adds their defaults

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:  # a model/data class refused its arguments: its own message first, not the wrapper's
            cause = inner_cause(str(err))
            if cause is None:
                raise
            raise ValueError(cause) from err
        # the data layer loads no model: a `--data.teacher_checkpoint`'s labels are computed by what it is handed here
        attach_weak_labeller(self.datamodule)

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        install_atomic_checkpoint_io(trainer, chosen_by="--trainer.default_root_dir (or the logger's save_dir, "
                                                        "or ModelCheckpoint's dirpath)")
        if self.subcommand == "fit":  # after ModelCheckpoint: it reads the paths that callback has just written
            trainer.callbacks.append(RunSummary())
        return trainer

    def test(self, **kwargs):  # LightningCLI runs these instead of the Trainer's methods
        return self.trainer.test(**kwargs, verbose=self.run_options.loud)  # the model prints its own table

    def validate(self, **kwargs):  # Lightning's table is validate's only output: shown unless --verbose=false
        return self.trainer.validate(**kwargs, verbose=self.run_options.verbose is not False)


def main(args=None, run: bool = True, exit_on_error: bool = True) -> ShiftCLI:
    """The command as a library call (the protocols, the tests): returns the CLI object (its trainer, model, data)
    and raises what the run raised. `exit_on_error=False`: a parser error raises `ArgumentError` (its lead line:
    the mistyped key and the closest valid one) instead of printing jsonargparse's usage text and exiting."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if args is None else args
    if isinstance(argv, list) and argv[:1] == ["export"]:  # not a Trainer subcommand: no LightningCLI
        from lightning_modules.export.__main__ import main as export

        return export(argv[1:])
    return ShiftCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": "runs", "name": "default"}},
        },
        parser_kwargs={"exit_on_error": exit_on_error},
        args=args,
        run=run,
    )


def run(argv: Optional[list[str]] = None) -> int:
    """`python cli.py ...` as a function: the exit code, after one `error:` line on stderr when the command fails
    (the traceback with --traceback or SHIFTGEN_TRACEBACK=1, and in the run's log folder when it has one:
    command_errors.py, docs/reward_model.md "Command line"). None: sys.argv, which keeps the arguments that DDP's
    re-executed ranks read, less --traceback."""
    if argv is None:
        show, sys.argv[1:] = split_traceback_flag(sys.argv[1:])
        if show:  # for run_command below, and for the ranks DDP re-executes from sys.argv
            os.environ[TRACEBACK_ENV] = "1"
    given = sys.argv[1:] if argv is None else argv
    return run_command(lambda args: main(None if argv is None else args, exit_on_error=False), given,
                       prog=f"cli.py {_subcommand(given)}".strip(),
                       describe=cli_error_line, log_of=run_log_of,
                       interrupted="the run did not finish; its checkpoints so far are in its folder "
                                   "(--ckpt_path <file> resumes a fit)")


def _subcommand(argv: list[str]) -> str:
    return next((a for a in argv if a in ("fit", "validate", "test", "predict", "export")), "")


if __name__ == "__main__":
    exit_with(run())
