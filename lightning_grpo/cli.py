"""``lightning-grpo fit --config config.yaml``: LightningCLI over GRPOModule and PromptDataModule.

Every constructor argument is a config key with its docstring as ``--help``. A run summary and a Hugging
Face export are always on (``summary:`` and ``export:`` sections); other callbacks go under
``trainer.callbacks``.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_grpo.callbacks import HFExport, RunSummary
from lightning_grpo.data import PromptDataModule
from lightning_grpo.module import GRPOModule

TRAINER_DEFAULTS = {"log_every_n_steps": 1, "num_sanity_val_steps": -1}


class GRPOCLI(LightningCLI):
    def instantiate_classes(self) -> None:
        """Bad settings end the program with their message, before any model is loaded or step taken."""
        try:
            super().instantiate_classes()
        except (ValueError, TypeError, FileNotFoundError) as err:
            self.parser.error(str(err))

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.add_lightning_class_args(HFExport, "export")


def main(args: list[str] | None = None) -> GRPOCLI:
    return GRPOCLI(
        GRPOModule,
        PromptDataModule,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
