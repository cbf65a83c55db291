"""``lightning-grpo fit --config config.yaml``: LightningCLI over GRPOModule and PromptDataModule.

``lightning-grpo report RUN_DIR``: training curves as PNG and HTML.

Every constructor argument is a config key with its docstring as ``--help``. Always on, each with its own
config section: the run summary (``summary:``), the Hugging Face export (``export:``), the reward monitor
(``reward_monitor:``), the mode-collapse and KL alerts (``collapse_alert:``, ``kl_alert:``, action ``warn``),
the sample logger (``samples:``) and the preemption checkpoint (``preemption:``: SIGTERM or Ctrl+C save
``checkpoints/last.ckpt`` and exit). Other callbacks go under ``trainer.callbacks``.
"""

from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_grpo.callbacks import (
    CompletionSampleLogger,
    HFExport,
    KLAlert,
    ModeCollapseAlert,
    PreemptionCheckpoint,
    RewardMonitor,
    RunSummary,
)
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
        parser.add_lightning_class_args(RewardMonitor, "reward_monitor")
        parser.add_lightning_class_args(ModeCollapseAlert, "collapse_alert")
        parser.add_lightning_class_args(KLAlert, "kl_alert")
        parser.add_lightning_class_args(CompletionSampleLogger, "samples")
        parser.add_lightning_class_args(PreemptionCheckpoint, "preemption")


def report_main(args: list[str]) -> None:
    """``lightning-grpo report RUN_DIR``: training curves as PNG and HTML from a run's logs."""
    from lightning_grpo.report import write_report

    if len(args) != 1 or args[0].startswith("-"):
        raise SystemExit("usage: lightning-grpo report RUN_DIR   (a lightning_logs/version_N directory)")
    report = write_report(args[0])
    print(f"wrote {report.png} and {report.html}")


def main(args: list[str] | None = None) -> None:
    """The console script. Returns None: ``sys.exit(main())`` must exit 0 after a successful run."""
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["report"]:
        report_main(argv[1:])
        return
    GRPOCLI(
        GRPOModule,
        PromptDataModule,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        args=args,  # None: LightningCLI reads sys.argv itself
    )


if __name__ == "__main__":
    main()
