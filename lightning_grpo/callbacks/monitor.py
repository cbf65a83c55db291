"""RewardMonitor: reward statistics beyond the per-step numbers: windows, groups, accuracy.

Logs ``reward_window/mean|std`` and ``rewards_window/<fn>/mean`` over the last ``window`` steps (torchmetrics
running aggregates), per-group ``groups/best|worst|spread`` (means over groups of the group's max, min and
max - min reward: a spread near 0 means no learning signal), and ``accuracy`` where a correctness reward is named.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torchmetrics.aggregation import RunningMean

from lightning_grpo.metrics import accuracy


class RewardMonitor(L.Callback):
    """Windowed and per-group reward statistics, to any Lightning logger.

    Args:
        window: steps in the running mean and std.
        accuracy_reward: name of the correctness reward function; defaults to the module's ``accuracy_reward``.
    """

    def __init__(self, window: int = 20, accuracy_reward: str | None = None) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.accuracy_reward = accuracy_reward
        self.means: dict[str, RunningMean] = {}
        self.squares = RunningMean(window=window)

    def _running(self, name: str, value: float) -> float:
        metric = self.means.setdefault(name, RunningMean(window=self.window))
        metric.update(torch.tensor(value))
        return metric.compute().item()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not outputs:  # a skipped step
            return
        m, scores, group = outputs["metrics"], outputs["scores"], outputs["rollout"].group_size
        logged = {"reward_window/mean": self._running("reward", m["reward"])}
        self.squares.update(torch.tensor(m["reward"] ** 2))
        logged["reward_window/std"] = max(self.squares.compute().item() - logged["reward_window/mean"] ** 2, 0) ** 0.5
        for name in scores.names:
            logged[f"rewards_window/{name}/mean"] = self._running(name, m[f"rewards/{name}/mean"])
        total = scores.total.nan_to_num(0.0).view(-1, group)  # [B, G]
        best, worst = total.max(dim=1).values, total.min(dim=1).values  # [B]
        logged |= {
            "groups/best": best.mean().item(),
            "groups/worst": worst.mean().item(),
            "groups/spread": (best - worst).mean().item(),
        }
        name = self.accuracy_reward or getattr(pl_module.hparams, "accuracy_reward", None)
        if name in scores.names:
            logged["accuracy"] = accuracy(scores.per_function, scores.names, name)
        for key, value in logged.items():
            pl_module.log(f"train/{key}", value, on_step=True, batch_size=1)
