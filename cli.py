"""Command line: `python cli.py fit|validate|test --config configs/...` (LightningCLI, subclass mode).

Any LightningModule / LightningDataModule is chosen by `class_path` in the config. Links keep values that must
agree in one place: the data module tokenizes with the model's tokenizer (`--model.tokenizer`). The frozen
reference model's callback is always present (`--reference.*`) and does nothing unless the model asks for it.
"""
from __future__ import annotations

import os

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from callbacks.reference_model import ReferenceModelCallback


class ShiftCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ReferenceModelCallback, "reference")
        parser.link_arguments("model.init_args.tokenizer", "data.init_args.tokenizer")


def main(args=None, run: bool = True) -> ShiftCLI:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
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
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
