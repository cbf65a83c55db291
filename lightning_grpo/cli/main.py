"""``lightning-grpo fit --config config.yaml``: LightningCLI over GRPOModule and PromptDataModule.

``lightning-grpo fit --config tiny_cpu``: a ``--config`` that is not a file but names a template shipped with the
package (``lightning_grpo/templates/*.yaml``: tiny_cpu, lora_cpu, ddp_cpu ...) runs that template, so the embedded
default runs from any directory after ``pip install`` (``cli/argv.py``: the command line before LightningCLI reads it).
``lightning-grpo report RUN_DIR``: training curves as PNG and HTML.
``lightning-grpo selfcheck [--vllm-server URL] [--only KEYS]``: every training path (CPU, DDP, FSDP2, LoRA; on GPUs
bf16, FSDP1, QLoRA, vLLM colocate and server) for a few steps on a tiny local model, as one table.
``lightning-grpo export CHECKPOINT OUT``: a distributed checkpoint of an FSDP2 full fine-tuning run -> Hugging Face
format, a tensor at a time.
``python -m lightning_grpo`` runs the same CLI when the console script is not on PATH.

Every constructor argument is a config key with its docstring as ``--help``; a section's field (``model.loss.beta``)
has the docstring under it (``docstrings.field_help``). Always on, each with its own
config section: the run summary (``summary:``), the Hugging Face export (``export:``), the reward monitor
(``reward_monitor:``), the no-signal, mode-collapse, KL, sampler-mismatch, unscored-reward, tool-use and distillation
alerts (``alerts:``, each ``warn`` by default, no-signal ``stop``, or ``null`` for off: ``callbacks/alert_set.py``),
the sample logger (``samples:``), ``metrics.jsonl`` for ``report`` (``MetricsFile``, no settings),
the preemption checkpoint (``preemption:``: SIGTERM or Ctrl+C save ``checkpoints/last.ckpt`` and exit) and
torch's threads per process (``threads:``). All of them write into the run's own directory, whatever the logger.
Other callbacks go under ``trainer.callbacks``.

Import paths in a config (``class_path: my_rewards.MyReward``, ``reward_funcs: [my_rewards.f]``) also find
modules in the working directory and next to each ``--config`` file, as ``python script.py`` would; they come
after the installed packages, so they never shadow one. Options are never abbreviated: ``--model.num_generation``
is an error naming ``--model.num_generations``, not a silent match.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import Checkpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_warn

from lightning_grpo.callbacks import (
    Alerts,
    CompletionSampleLogger,
    HFExport,
    MetricsFile,
    PreemptionCheckpoint,
    RewardMonitor,
    RunSummary,
)
from lightning_grpo.callbacks.faults import FaultCheckpoint
from lightning_grpo.callbacks.final import ValidateAtEnd
from lightning_grpo.callbacks.progress import StepProgressBar
from lightning_grpo.callbacks.threads import TorchThreads
from lightning_grpo.checkpoints import AtomicCheckpointIO
from lightning_grpo.cli.argv import check_not_bare, check_yaml, importable_dirs, resolve_configs, section_off
from lightning_grpo.cli.failure import debugging, failure_message, print_refused_trace
from lightning_grpo.cli.help import DESCRIPTION, FIT_DESCRIPTION, GRPOArgumentParser
from lightning_grpo.cli.preflight import check_data_first, preflight
from lightning_grpo.cli.resume import (
    checkpoint_settings,
    continue_run_dir,
    flat,
    merge_settings,
    model_mismatch,
    refuse_meaningless,
    resume_path,
    setting_changes,
)
from lightning_grpo.cli.streams import guard_standard_streams
from lightning_grpo.data import PromptDataModule
from lightning_grpo.module import GRPOModule
from lightning_grpo.run import RUN_VERSION, own_version

TRAINER_DEFAULTS = {"log_every_n_steps": 1, "num_sanity_val_steps": -1}


def parser_kwargs() -> dict[str, Any]:
    fit = {"description": FIT_DESCRIPTION}
    return {"description": DESCRIPTION, "prog": "lightning-grpo", "usage": None, "fit": fit}  # None: subcommands


def given_settings(parser: LightningArgumentParser, args: Any, subcommand: str | None) -> set[str]:
    """The dotted ``model:`` keys a config file or the command line sets, at their default values too."""
    parse = parser.parse_object if isinstance(args, dict | Namespace) else parser.parse_args
    given = parse(args, defaults=False)
    return set(flat((given.get(subcommand) or given).get("model", {}).as_dict()))


class GRPOCLI(LightningCLI):
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """The arguments, with ``--ckpt_path`` resolved (``last``: the run's newest readable checkpoint) and checked
        before Lightning merges the checkpoint's settings in (``cli/resume.py``): what the config set, values given
        at their default included, is kept to name what differs and to win over the checkpoint's."""
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand) or self.config
        self.configured = config.model.clone().as_dict()  # before Lightning merges the checkpoint's settings in
        self.given = given_settings(parser, args, subcommand)
        self.configured_model = None
        if "ckpt_path" not in config:  # no subcommand (``run=False``): nothing resumes
            return
        try:
            ckpt_path = resume_path(config.get("ckpt_path"), config.get("trainer", {}).as_dict())
        except ValueError as err:
            parser.error(str(err))
        config.ckpt_path = ckpt_path
        if ckpt_path and Path(ckpt_path).exists():
            self.configured_model = config.get("model", {}).get("model")
        if ckpt_path and Path(ckpt_path).is_dir():  # Lightning merges a file's settings only: a folder's here
            self.config = merge_settings(parser, self.config, subcommand, checkpoint_settings(ckpt_path))

    def before_instantiate_classes(self) -> None:
        """A checkpoint of another model than the configured one is refused, naming both; ``distill: null`` is
        distillation off; the data is read and checked (``check_data_first``) before the model loads."""
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand) or self.config
        default = self.parser.get_defaults().get(subcommand or "model", {})
        default = default.get("model", {}).get("model") if subcommand else default.get("model")
        problem = model_mismatch(config.get("ckpt_path"), self.configured_model, default, config.model.model)
        if problem:
            self.parser.error(problem)
        if "distill" in config.model and config.model.distill is None:  # YAML's `distill: null`: no teacher, off
            config.model.distill = Namespace(teacher=None)
        self.resolve_changes(config)
        if subcommand == "fit":  # not for a CLI built with run=False: its caller fits later (preflight checks then)
            try:
                check_data_first(config.data.as_dict())
            except (ValueError, TypeError, FileNotFoundError) as err:
                self.parser.error(str(err))

    def resolve_changes(self, config: Any) -> None:
        """Each ``model:`` setting that differs from the checkpoint's, named with the value that wins
        (``cli/resume.py``); a change that makes the checkpoint's state meaningless, refused."""
        ckpt_path = config.get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).exists():
            return
        subcommand = self.config.get("subcommand")
        parser = self.parser._subcommands_action.choices[subcommand] if subcommand else self.parser
        defaults = parser.get_defaults().model.as_dict()
        changes = setting_changes(self.configured, config.model.as_dict(), defaults, self.given)
        try:
            refuse_meaningless(changes, ckpt_path)
        except ValueError as err:
            self.parser.error(str(err))
        for change in changes:
            if change.explicit:
                config.model[change.key] = change.configured
        if changes:
            lines = "\n".join(f"  - {c.line()}" for c in changes)
            rank_zero_warn(f"--ckpt_path {ckpt_path}: {len(changes)} setting(s) differ from the checkpoint's:\n{lines}")

    def instantiate_classes(self) -> None:
        """Bad settings end the program with their message, before any model is loaded or step taken."""
        try:
            super().instantiate_classes()
        except (ValueError, TypeError, FileNotFoundError) as err:
            self.parser.error(str(err))

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """The trainer, with ``MetricsFile`` and ``FaultCheckpoint`` (no settings), ``StepProgressBar`` unless the
        progress bar is off or another one is configured, and atomic checkpoint writes unless another
        ``CheckpointIO`` plugin is configured."""
        init = self.config_init[self.subcommand] if self.subcommand else self.config_init
        config = init["trainer"]
        callbacks = [*(config.get("callbacks") or []), *init["alerts"].callbacks(), MetricsFile(), FaultCheckpoint()]
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(StepProgressBar())
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(hasattr(p, "save_checkpoint") for p in plugins):
            plugins = [*plugins, AtomicCheckpointIO()]
        trainer = super().instantiate_trainer(**kwargs, callbacks=callbacks, plugins=plugins)
        trainer.callbacks = metrics_file_after_loggers(trainer.callbacks)
        return trainer

    def fit(self, model: Any, datamodule: Any = None, ckpt_path: str | None = None, **kwargs: Any) -> None:
        """``trainer.fit`` after the checks that need the model and the data (``cli/preflight.py``), with
        ``--ckpt_path`` as ``parse_arguments`` resolved it, and a resumed run continuing its own directory
        (``cli/resume.py``)."""
        try:
            preflight(self.trainer, model, datamodule)
        except (ValueError, TypeError, FileNotFoundError) as err:  # a user's data or reward: no traceback
            self.parser.error(str(err))
        continued = ckpt_path not in (None, "hpc", "best") and continue_run_dir(self.trainer, ckpt_path)
        config = self.config[self.subcommand] if self.subcommand else self.config
        taken = None if continued or config["trainer"].get("logger") not in (None, True) else own_version(self.trainer)
        try:
            self.trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, **kwargs)
        finally:
            if taken is not None:  # a later run in this process takes its own
                os.environ.pop(RUN_VERSION, None)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.add_lightning_class_args(HFExport, "export")
        parser.add_lightning_class_args(RewardMonitor, "reward_monitor")
        parser.add_class_arguments(Alerts, "alerts", sub_configs=True)
        parser.add_lightning_class_args(CompletionSampleLogger, "samples")
        parser.add_lightning_class_args(PreemptionCheckpoint, "preemption")
        parser.add_lightning_class_args(TorchThreads, "threads")
        parser.add_lightning_class_args(ValidateAtEnd, "validate_at_end")


def metrics_file_after_loggers(callbacks: list) -> list:
    """``MetricsFile`` after every callback that logs (reward monitor, alerts: LightningCLI adds those after the
    trainer's own), so ``metrics.jsonl`` holds each step's own values, from the first step of a run or resume;
    checkpoint callbacks stay last, where Lightning puts them."""
    files = [c for c in callbacks if isinstance(c, MetricsFile)]
    checkpoints = [c for c in callbacks if isinstance(c, Checkpoint)]
    return [c for c in callbacks if c not in files and c not in checkpoints] + files + checkpoints


def report_main(args: list[str]) -> None:
    """``lightning-grpo report RUN_DIR``: training curves as PNG and HTML from a run's logs."""
    from lightning_grpo.cli.report import write_report

    if len(args) != 1 or args[0].startswith("-"):
        raise SystemExit("usage: lightning-grpo report RUN_DIR   (a lightning_logs/version_N directory)")
    report = write_report(args[0])
    if report.split:
        print(report.split_table())
    print(f"wrote {report.png} and {report.html}")


def selfcheck_main(args: list[str]) -> None:
    """``lightning-grpo selfcheck``: imported here, the check imports the whole training stack."""
    from lightning_grpo.cli.selfcheck import main as selfcheck

    selfcheck(args)


def export_main(args: list[str]) -> None:
    """``lightning-grpo export CHECKPOINT OUT``: a distributed (FSDP2) checkpoint -> Hugging Face format."""
    from lightning_grpo.model.export import export_distributed_checkpoint

    if len(args) != 2 or any(a.startswith("-") for a in args):
        raise SystemExit(
            "usage: lightning-grpo export CHECKPOINT OUT   (a distributed checkpoint directory of a full "
            "fine-tuning FSDP2 run, e.g. .../checkpoints/last.ckpt/, and the Hugging Face directory to write)"
        )
    print(f"wrote {export_distributed_checkpoint(args[0], args[1])}")


SUBCOMMANDS = {"report": report_main, "selfcheck": selfcheck_main, "export": export_main}


def main(args: list[str] | None = None) -> None:
    """The console script. Returns None: ``sys.exit(main())`` must exit 0 after a successful run. Every error
    ends in one message; ``LIGHTNING_GRPO_DEBUG=1`` adds the traceback of each (``cli/failure.py``)."""
    try:
        run_main(args)
    except SystemExit as exit:
        print_refused_trace(exit)
        raise


def run_main(args: list[str] | None) -> None:
    if args is None:  # the process's own command line: a terminal that goes away must not end the run
        guard_standard_streams()
    argv = sys.argv[1:] if args is None else args
    if argv[:1] and argv[0] in SUBCOMMANDS:
        SUBCOMMANDS[argv[0]](argv[1:])
        return
    check_not_bare(argv)
    given, argv = argv, resolve_configs(section_off(argv))
    check_yaml(argv)
    if args is None:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (given both, it warns)
    importable_dirs(argv)
    # Lightning 2.6 with torch >= 2.10 warns about its own pytree call on every run; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # ModelCheckpoint(every_n_train_steps) under manual optimisation warns, with a code listing, that it saves the
    # weights after the step: for GRPO that is what a checkpoint of step N should hold (resume is exact).
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")
    try:
        GRPOCLI(
            GRPOModule,
            PromptDataModule,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_kwargs={"overwrite": True},
            parser_class=GRPOArgumentParser,
            parser_kwargs=parser_kwargs(),
            auto_configure_optimizers=False,  # the module builds its own: see model.optimizer
            args=None if args is None else argv,
        )
    except Exception as err:  # inside fit: one message, the trace in the run directory's error.log
        if debugging():
            raise
        print(failure_message(err, given), file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
