"""The CLI's ``alerts:`` section: the seven run alerts on by default, each settable, ``null`` turns one off, and the
sections each alert had of its own named with their new place."""

import pytest
import yaml
from helpers import ROOT

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks import (
    Alerts,
    DistillAlert,
    KLAlert,
    MismatchAlert,
    ModeCollapseAlert,
    NoSignalAlert,
    ToolUseAlert,
    UnscoredRewardAlert,
)
from lightning_grpo.callbacks.alerts import Alert
from lightning_grpo.callbacks.metricsfile import MetricsFile
from lightning_grpo.cli import main
from lightning_grpo.cli.help import GRPOArgumentParser
from lightning_grpo.cli.main import GRPOCLI

TINY = ROOT / "templates" / "tiny_cpu.yaml"


def trainer_callbacks(model_dir: str, *args: str) -> list:
    settings = ["--model.model", model_dir, "--model.reward_funcs", "[lightning_grpo.rewards.exact_match_reward]",
                "--data.dataset", "x", "--trainer.logger", "false", *args]  # fmt: skip
    cli = GRPOCLI(GRPOModule, PromptDataModule, args=settings, run=False, parser_class=GRPOArgumentParser,
                  auto_configure_optimizers=False)  # fmt: skip
    return cli.trainer.callbacks


def test_every_alert_is_on_by_default_and_logs_before_the_metrics_file(tiny_model_dir):
    callbacks = trainer_callbacks(tiny_model_dir)
    alerts = [type(c) for c in callbacks if isinstance(c, Alert)]
    every = (NoSignalAlert, ModeCollapseAlert, KLAlert, MismatchAlert, UnscoredRewardAlert, ToolUseAlert, DistillAlert)
    assert sorted(a.__name__ for a in alerts) == sorted(a.__name__ for a in every)
    last_alert = max(i for i, c in enumerate(callbacks) if isinstance(c, Alert))
    assert last_alert < next(
        i for i, c in enumerate(callbacks) if isinstance(c, MetricsFile)
    )  # metrics.jsonl sees them


def test_an_alert_s_setting_reaches_it_and_null_turns_one_off(tiny_model_dir):
    callbacks = trainer_callbacks(
        tiny_model_dir, "--alerts.kl.max_kl", "1.5", "--alerts.kl.action", "stop", "--alerts.tools", "null"
    )
    (kl,) = [c for c in callbacks if isinstance(c, KLAlert)]
    assert (kl.max_kl, kl.action, kl.max_kl_growth) == (1.5, "stop", 4.0)  # the others keep their defaults
    assert not any(isinstance(c, ToolUseAlert) for c in callbacks)
    assert sum(isinstance(c, Alert) for c in callbacks) == 6


def test_a_config_s_alerts_reach_them_with_print_config_showing_every_setting(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("alerts:\n  collapse: {patience: 7}\n  unscored: null\n")
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(TINY), "--config", str(config), "--print_config"])
    alerts = yaml.safe_load(capsys.readouterr().out)["alerts"]
    assert alerts["collapse"]["init_args"]["patience"] == 7
    assert alerts["collapse"]["init_args"]["reward_ceiling"] == 1.0  # the template's, kept
    assert alerts["unscored"] is None and alerts["kl"]["init_args"]["max_kl"] == 3.0


def test_an_old_alert_section_in_a_config_names_every_new_place_at_once(tmp_path):
    config = tmp_path / "old.yaml"
    config.write_text("kl_alert:\n  max_kl: 2.0\ntool_alert: {patience: 3}\n")
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(TINY), "--config", str(config), "--print_config"])
    assert "`kl_alert:` moved to `alerts.kl:`, `tool_alert:` moved to `alerts.tools:`" in str(done.value.code)


def test_an_old_alert_option_names_its_new_place(capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(TINY), "--collapse_alert.patience", "3", "--print_config"])
    assert done.value.code == 2
    assert "--collapse_alert.patience moved to --alerts.collapse.patience" in capsys.readouterr().err


def test_an_unknown_alert_setting_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(TINY), "--alerts.kl.max_kll", "3", "--print_config"])
    assert done.value.code == 2 and "max_kll" in capsys.readouterr().err


def test_in_python_each_alerts_has_alerts_of_its_own_and_keeps_those_given():
    """The signature's defaults are one object each (what ``--print_config`` shows): two runs in one process must not
    share an alert's counters."""
    first, second = Alerts(), Alerts(tools=None)
    assert [type(a) for a in first.callbacks()] == [NoSignalAlert, ModeCollapseAlert, KLAlert, MismatchAlert,
                                                    UnscoredRewardAlert, ToolUseAlert, DistillAlert]  # fmt: skip
    assert not any(a is b for a in first.callbacks() for b in second.callbacks()) and len(second.callbacks()) == 6
    first.callbacks()[2].counts["kl"] = 2
    assert second.callbacks()[2].counts == {}
    mine = KLAlert(max_kl=2.0)
    assert Alerts(kl=mine).callbacks()[2] is mine


def test_the_distill_alert_is_set_in_alerts_and_lists_its_settings(tiny_model_dir, capsys):
    callbacks = trainer_callbacks(tiny_model_dir, "--alerts.distill.window", "5", "--alerts.distill.action", "stop")
    (distill,) = [c for c in callbacks if isinstance(c, DistillAlert)]
    assert (distill.window, distill.action, distill.min_delta) == (5, "stop", 0.0)
    assert not any(isinstance(c, DistillAlert) for c in trainer_callbacks(tiny_model_dir, "--alerts.distill", "null"))
    with pytest.raises(SystemExit):
        main(["fit", "--alerts.distill.help", "DistillAlert"])
    assert "--alerts.distill.min_delta [0.0]  nats" in capsys.readouterr().out


def test_no_learning_signal_stops_by_default_while_the_collapse_alert_warns(tiny_model_dir, tmp_path, capsys):
    callbacks = trainer_callbacks(tiny_model_dir)
    (signal,) = [c for c in callbacks if isinstance(c, NoSignalAlert)]
    (collapse,) = [c for c in callbacks if isinstance(c, ModeCollapseAlert)]
    assert (signal.action, signal.patience) == ("stop", 20) and collapse.action == "warn"
    callbacks = trainer_callbacks(tiny_model_dir, "--alerts.signal.action", "warn", "--alerts.signal.patience", "5")
    (signal,) = [c for c in callbacks if isinstance(c, NoSignalAlert)]
    assert (signal.action, signal.patience) == ("warn", 5)
    assert not any(isinstance(c, NoSignalAlert) for c in trainer_callbacks(tiny_model_dir, "--alerts.signal", "null"))
    with pytest.raises(SystemExit):
        main(["fit", "--alerts.signal.help", "NoSignalAlert"])
    assert "--alerts.signal.action [stop]" in capsys.readouterr().out
