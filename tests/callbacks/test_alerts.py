"""Each monitor driven by a real run on the tiny model: alerts fire on degenerate runs, act, and persist."""

from __future__ import annotations

import csv
import json

import lightning as L
import pytest
import torch
from helpers import fit, logged, make_module
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import (
    CompletionSampleLogger,
    GRPOAlertError,
    KLAlert,
    ModeCollapseAlert,
    RewardMonitor,
    RunSummary,
    ValidateAtEnd,
)
from lightning_grpo.cli import main
from lightning_grpo.engines import HFGenerate
from lightning_grpo.types import step_record


def constant_reward(completions, **kwargs):
    """A reward that cannot tell completions apart: every group has zero std, GRPO learns nothing."""
    return [0.5] * len(completions)


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def test_collapse_is_caught_within_patience_and_stops(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=50, callbacks=[alert])
    assert trainer.global_step == 2 + 3  # warm-up steps, then patience steps of zero reward std
    signals = {f.signal for f in alert.firings}
    assert {"no_learning_signal", "reward_std", "frac_reward_zero_std"} <= signals
    written = [
        json.loads(line)
        for line in (tmp_path / "lightning_logs/version_0/alerts.jsonl").read_text().split("\n")
        if line
    ]
    assert written[0]["signal"] == "no_learning_signal" and "reward does not discriminate" in written[0]["message"]
    assert any("Try: check the reward functions can tell completions apart" in w["message"] for w in written[1:])
    assert logged(trainer)["train/alerts/reward_std"][-1] == 1.0
    last = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=False)
    assert last["global_step"] == 2 + 3  # the stopped run's last steps are kept


def test_near_zero_temperature_collapses_completions(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="raise")
    module = make_module(tiny_model_dir, sampling={"temperature": 1e-4})
    with pytest.raises(GRPOAlertError, match=r"distinct_completions = 0 < 0.05 for 2 consecutive steps"):
        fit(module, data(arith_jsonl), tmp_path, max_steps=20, callbacks=[alert])


def test_solved_groups_are_reported_as_solved_not_collapse(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="warn", reward_ceiling=0.5)
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=5, callbacks=[alert])
    assert trainer.global_step == 5  # every completion at the ceiling: solved, so only the zero signal is reported
    assert [f.signal for f in alert.firings] == ["no_learning_signal"]
    assert "at reward_ceiling: the task is solved for this data" in alert.firings[0].message


def test_a_constant_reward_at_the_ceiling_without_one_set_is_zero_signal(tiny_model_dir, arith_jsonl, tmp_path):
    """The same run without reward_ceiling: nothing tells solved from a reward that cannot discriminate."""
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="warn")
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    fit(module, data(arith_jsonl), tmp_path, max_steps=4, callbacks=[alert])
    zero = [f for f in alert.firings if f.signal == "no_learning_signal"]
    assert len(zero) == 1 and "the reward does not discriminate, or the task is solved" in zero[0].message
    assert "Try: check the reward function gives different completions different scores" in zero[0].message


@pytest.fixture
def one_thread():
    """The KL trajectories below were measured with one thread (the thread count changes the sums' rounding)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def kl_alert_of_a_run(model_dir, path, tmp_path, learning_rate, beta=0.04):
    alert = KLAlert()  # the defaults: kl > 0.5 for 3 steps in a row
    module = make_module(
        model_dir, loss={"beta": beta}, optim={"learning_rate": learning_rate}, rollout_engine=HFGenerate()
    )  # the trajectories below were measured with HFGenerate's samples
    trainer = fit(module, data(path), tmp_path, max_steps=30, callbacks=[alert])
    return alert, max(logged(trainer)["train/kl"])


def test_kl_alert_advice_halving_the_learning_rate_keeps_the_run_under_it(
    tiny_model_dir, arith_jsonl, tmp_path, one_thread
):
    # learning rate 1e-2 at beta 0.04: KL passes 0.5 from step 17 and the alert fires at 19 (0.64)
    fired, _ = kl_alert_of_a_run(tiny_model_dir, arith_jsonl, tmp_path, learning_rate=1e-2)
    assert fired.firings and fired.firings[0].signal == "kl"
    assert "Try: halve model.optim.learning_rate" in fired.firings[0].message
    halved, kl = kl_alert_of_a_run(tiny_model_dir, arith_jsonl, tmp_path, learning_rate=1e-2 / 2)
    assert not halved.firings and kl < 0.45  # 0.38 at most
    # the advice's second step alone is not enough here: the KL term pulls back slower than the step pushes out
    doubled_beta, _ = kl_alert_of_a_run(tiny_model_dir, arith_jsonl, tmp_path, learning_rate=1e-2, beta=0.08)
    assert doubled_beta.firings


def test_alert_state_round_trips_through_a_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=50, callbacks=[alert], enable_checkpointing=True)
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    restored = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    restored.load_state_dict(next(v for k, v in ckpt["callbacks"].items() if k.startswith("ModeCollapseAlert")))
    assert restored.counts == alert.counts and restored.early == alert.early
    assert [f.message for f in restored.firings] == [f.message for f in alert.firings]


def test_bad_alert_settings_are_named():
    with pytest.raises(ValueError, match=r"action must be one of \['warn', 'stop', 'raise'\], got 'panic'"):
        ModeCollapseAlert(action="panic")
    with pytest.raises(ValueError, match="patience must be >= 1, got 0"):
        KLAlert(patience=0)


def test_reward_monitor_and_sample_logger(tiny_model_dir, arith_jsonl, tmp_path):
    samples = CompletionSampleLogger(every_n_steps=1, max_rows=4)
    module = make_module(tiny_model_dir)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=3, callbacks=[RewardMonitor(window=2), samples])
    metrics = logged(trainer)
    for name in [
        "reward_window/mean",
        "reward_window/std",
        "rewards_window/length_reward/mean",
        "groups/best",
        "groups/worst",
        "groups/spread",
        "accuracy",
    ]:
        assert len(metrics[f"train/{name}"]) == 3, name
    assert all(b >= w for b, w in zip(metrics["train/groups/best"], metrics["train/groups/worst"]))
    rows = [json.loads(line) for line in (tmp_path / "lightning_logs/version_0/samples.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {"prompt", "completion", "exact_match_reward", "length_reward", "advantage"} <= set(
        rows[0]
    )
    with open(tmp_path / "lightning_logs/version_0/samples.csv", newline="") as f:
        assert len(list(csv.reader(f))) == 13  # a header, then 12 rows (a completion may hold a newline)
    assert {"train/reward", "train/reward_std"} <= set(trainer.progress_bar_metrics)  # live progress bar


def test_cli_run_then_report(tmp_path, capsys):
    root = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            "templates/tiny_cpu.yaml",
            "--trainer.max_steps",
            "12",
            "--trainer.log_every_n_steps",
            "4",
            "--trainer.val_check_interval",
            "6",
            "--trainer.default_root_dir",
            str(root),
            "--data.max_val_prompts",
            "16",
            "--samples.every_n_steps",
            "4",
        ]
    )
    run_dir = next(root.glob("lightning_logs/version_*"))
    assert (run_dir / "samples.jsonl").exists()
    main(["report", str(run_dir)])
    assert "report.png" in capsys.readouterr().out
    import matplotlib.image

    image = matplotlib.image.imread(run_dir / "report.png")
    assert image.shape[0] > 500 and image.shape[1] > 500
    page = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in page and "train/reward" in page

    from lightning_grpo.cli.report import write_report

    report = write_report(run_dir)
    assert len(report.series["train/reward"]) == 3  # log_every_n_steps: 4
    assert len(report.series["val/accuracy"]) >= 2


class Records(L.Callback):
    def __init__(self):
        self.records = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.records.append(step_record(outputs))


# The names users compare across tools (TRL's); a rename breaks this test, not an alert silently.
TRL_METRICS = {
    "loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
    "completions/mean_length", "completions/min_length", "completions/max_length",
    "completions/clipped_ratio", "completions/mean_terminated_length", "num_tokens", "step_time",
    "rewards/exact_match_reward/mean", "rewards/exact_match_reward/std",
    "rewards/length_reward/mean", "rewards/length_reward/std",
}  # fmt: skip


class Snapshots(Records):
    """The step records and the ``train/*`` callback metrics as each step ends."""

    def __init__(self):
        super().__init__()
        self.metrics = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})


def test_the_step_record_names_metrics_as_trl_and_any_one_can_be_monitored(tiny_model_dir, arith_jsonl, tmp_path):
    probe, watched = Snapshots(), "train/completions/mean_length"
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor=watched, mode="max", every_n_train_steps=1)
    module = make_module(tiny_model_dir, loss={"beta": 0.1})
    trainer = fit(
        module, data(arith_jsonl), tmp_path, max_steps=3, callbacks=[probe, best], log_every_n_steps=2,
        enable_checkpointing=True,
    )  # fmt: skip
    names = {f"train/{n}" for n in probe.records[-1].stats.metrics()}
    assert {f"train/{n}" for n in TRL_METRICS} <= names, sorted({f"train/{n}" for n in TRL_METRICS} - names)
    for record, seen in zip(probe.records, probe.metrics):
        # what ModelCheckpoint monitors is the step's own value on every step
        assert seen[watched] == pytest.approx(record.stats.lengths.mean)
    # the loggers' step (the 2nd) has every metric; the others only what something reads every step
    assert names <= set(probe.metrics[1])
    assert probe.metrics[1]["train/reward"] == pytest.approx(probe.records[1].stats.rewards.mean)
    assert set(probe.metrics[0]) == {watched}
    assert best.best_model_score == pytest.approx(max(r.stats.lengths.mean for r in probe.records))
    assert logged(trainer)["train/reward"] == [pytest.approx(probe.records[1].stats.rewards.mean)]
    record = probe.records[-1]
    assert record.advantages.shape == (len(record.rollout),) and record.scores.names == [
        "exact_match_reward",
        "length_reward",
    ]


def test_reward_monitor_windows_survive_a_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    monitor = RewardMonitor(window=3)
    module = make_module(tiny_model_dir)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=4, callbacks=[monitor], enable_checkpointing=True)
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    restored = RewardMonitor(window=3)
    restored.load_state_dict(ckpt["callbacks"]["RewardMonitor"])
    assert {k: list(v) for k, v in restored.windows.items()} == {k: list(v) for k, v in monitor.windows.items()}
    assert len(restored.windows["reward"]) == 3  # the last 3 of 4 steps


@pytest.mark.parametrize("at_end", [False, True])
def test_a_run_shorter_than_an_epoch_ends_validated_and_checkpointed(tiny_model_dir, arith_jsonl, tmp_path, at_end):
    """2 steps of a 3-batch epoch: Lightning alone would validate at the epoch's end, which never comes."""
    summary = RunSummary()
    callbacks = [summary, *([ValidateAtEnd()] if at_end else [])]
    data = PromptDataModule(arith_jsonl, batch_size=4, val_size=4)  # 12 training rows: 3 batches
    module = make_module(tiny_model_dir)
    trainer = fit(
        module, data, tmp_path, max_steps=2, callbacks=callbacks, enable_checkpointing=True, limit_val_batches=None
    )
    checkpoints = list((tmp_path / "lightning_logs/version_0/checkpoints").glob("*.ckpt"))
    assert trainer.global_step == 2 and [c.name for c in checkpoints] == ["epoch=0-step=2.ckpt"]
    assert ("val/accuracy" in summary.after) == at_end  # without: the summary's "after" reads n/a


@pytest.mark.parametrize(("max_steps", "max_epochs"), [(4, None), (-1, 2)])
def test_validate_at_end_stops_only_at_the_final_step(tiny_model_dir, arith_jsonl, tmp_path, max_steps, max_epochs):
    """Runs over more than one epoch (3 batches each) end where they are set to, not at an epoch's end."""
    data = PromptDataModule(arith_jsonl, batch_size=4, val_size=4)
    trainer = fit(
        make_module(tiny_model_dir), data, tmp_path, max_steps=max_steps, max_epochs=max_epochs,
        callbacks=[ValidateAtEnd()],
    )  # fmt: skip
    assert trainer.global_step == (4 if max_steps == 4 else 6)
