"""RewardMonitor and CompletionSampleLogger on real runs of the tiny model: metrics named as TRL names them, any
one monitorable, windows that survive a checkpoint."""

from __future__ import annotations

import csv
import json

import lightning as L
import pytest
import torch
from helpers import fit, logged, make_module
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo.callbacks import (
    CompletionSampleLogger,
    RewardMonitor,
)
from lightning_grpo.types import step_record
from tests.callbacks.test_alerts import data


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


class Records(L.Callback):
    def __init__(self):
        self.records = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.records.append(step_record(outputs))


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
