"""RewardMonitor: reward statistics beyond the per-step numbers: windows, groups, accuracy.

Logs ``reward_window/mean|std`` and ``rewards_window/<fn>/mean`` over the last ``window`` steps (their windows
are saved in checkpoints, so a resumed run goes on with the same windows), per-group
``groups/best|worst|spread`` (means over groups of the group's max, min and max - min reward: a spread near 0
means no learning signal). The step's ``accuracy`` comes with the module's own metrics.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import lightning as L
from typing_extensions import override

from lightning_grpo.steplog import log_train_metrics
from lightning_grpo.types import step_record


class RewardMonitor(L.Callback):
    """Windowed and per-group reward statistics, to any Lightning logger.

    Args:
        window: steps in the running mean and std.
    """

    def __init__(self, window: int = 20) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.windows: dict[str, deque[float]] = {}

    def _running(self, name: str, value: float) -> list[float]:
        values = self.windows.setdefault(name, deque(maxlen=self.window))
        values.append(value)
        return [v for v in values if not math.isnan(v)]

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        record = step_record(outputs)
        if record is None:  # a skipped step
            return
        rewards, scores = record.stats.rewards, record.scores
        recent = self._running("reward", rewards.mean)
        mean = _mean(recent)
        logged = {
            "reward_window/mean": mean,
            "reward_window/std": math.sqrt(max(_mean([r * r for r in recent]) - mean**2, 0.0)),
        }
        for name, value in rewards.function_means.items():
            logged[f"rewards_window/{name}/mean"] = _mean(self._running(name, value))
        total = scores.total.nan_to_num(0.0).view(-1, record.rollout.group_size)  # [B, G]
        best, worst = total.max(dim=1).values, total.min(dim=1).values  # [B]
        logged |= {
            "groups/best": best.mean().item(),
            "groups/worst": worst.mean().item(),
            "groups/spread": (best - worst).mean().item(),
        }
        log_train_metrics(pl_module, {f"train/{k}": v for k, v in logged.items()})

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"windows": {name: list(values) for name, values in self.windows.items()}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.windows = {k: deque(v, maxlen=self.window) for k, v in state_dict.get("windows", {}).items()}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
