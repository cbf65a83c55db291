"""Rollout + rewards -> the typed statistics of a step (``RewardStats``, ``LengthStats``; the loss makes its own).

Pure functions over tensors already gathered from every rank; the module puts them in the step record and
logs ``StepStats.metrics()``, which names them as TRL does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_grpo.types import (
    LengthStats,
    RewardScores,
    RewardStats,
    Rollout,
    StepStats,
    UpdateStats,
    nanstd,
    to_host,
    without_signal,
)


@dataclass
class StepCounters:
    """What a run counts across steps, kept in checkpoints (``grpo_counters``) so a resume continues them."""

    num_tokens_seen: int | Tensor = 0  # prompt + completion tokens trained on, all ranks (on the device until read)
    skipped_steps: int = 0  # steps skipped for numbers that are not finite
    bad_steps_in_a_row: int = 0  # those since the last good step: ``max_bad_steps`` stop the run

    def state_dict(self) -> dict[str, int]:
        return {"num_tokens_seen": int(self.num_tokens_seen), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.num_tokens_seen = state.get("num_tokens_seen", 0)
        self.skipped_steps = state.get("skipped_steps", 0)

    def good_step(self, tokens: int | Tensor) -> None:
        """Count a step trained on ``tokens`` (a device tensor stays one: no host sync)."""
        self.num_tokens_seen = tokens + self.num_tokens_seen
        self.bad_steps_in_a_row = 0

    def bad_step(self) -> int:
        """Count a skipped step; how many in a row."""
        self.skipped_steps += 1
        self.bad_steps_in_a_row += 1
        return self.bad_steps_in_a_row


STAGES = ("generation", "scoring", "logprobs", "update", "sync")  # a step's stages, in order: ``time/<stage>_s``


class StageClock:
    """Wall seconds of a step's stages on this rank (``STAGES``), each lap the time since the previous one: the
    run's own split, which ``lightning-grpo report`` sets beside the step model's (``cli/step_model.py``). Host
    time: on GPUs a stage's kernels may still run after its lap, and are counted in the next stage that waits.
    Under ``AsyncRollouts`` ``generation`` is the trainer's wait for the producer."""

    def __init__(self) -> None:
        self.last, self.seconds = time.perf_counter(), dict.fromkeys(STAGES, 0.0)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] += now - self.last
        self.last = now

    def metrics(self) -> dict[str, float]:
        return {f"time/{stage}_s": seconds for stage, seconds in self.seconds.items()}


@dataclass(frozen=True)
class StepValues:
    """What a trained step's statistics are read from: ``rollout`` and ``scores`` this rank's, ``every_rank`` and
    ``lengths`` the global batch's (every rank's rows, in rank order)."""

    rollout: Rollout
    scores: RewardScores
    every_rank: Tensor  # [W*N, F] every rank's per-function rewards
    lengths: tuple[Tensor, Tensor]  # [W*N] completion lengths (up to and including EOS) and truncation flags
    update: UpdateStats  # the loss's statistics, every rank's
    learning_rate: float
    seconds: float  # the step's wall time
    extra: dict[str, float | Tensor] = field(default_factory=dict)  # more metrics: the filter's, the targets' ...


def step_stats(values: StepValues, counters: StepCounters, accuracy_reward: str | None = None) -> StepStats:
    """The step's record, with the run's ``counters`` and the share of full marks of ``accuracy_reward``. Every
    number is computed on the device and read to the host once, here (``to_host``)."""
    v, rollout, scores = values, values.rollout, values.scores
    return to_host(
        StepStats(
            rewards=reward_stats(v.every_rank, scores.weights, scores.names, rollout.group_size, accuracy_reward),
            lengths=length_stats(*v.lengths),
            update=v.update,
            num_tokens=counters.num_tokens_seen,
            learning_rate=v.learning_rate,
            skipped_steps=counters.skipped_steps,
            truncated_prompts=rollout.num_truncated_prompts,
            step_time=v.seconds,
            reward_errors=scores.errors,
            extra={**rollout.metrics, **scores.metrics, **v.extra},
        )
    )


def staleness_metrics(staleness: Tensor | None) -> dict[str, Tensor]:
    """``async/staleness/{mean,max}`` of the rows an update trains on ([N] updates since the weights that sampled
    each); none when the current weights sampled them all."""
    if staleness is None:
        return {}
    return {"async/staleness/mean": staleness.float().mean(), "async/staleness/max": staleness.max().float()}


def reward_stats(
    per_function: Tensor, weights: Tensor, names: list[str], group_size: int, accuracy_reward: str | None = None
) -> RewardStats:
    """Statistics of [N, F] scores, as 0-d tensors on their device (``to_host`` reads them). A function that
    returned None for every row has NaN mean and std, as in TRL, so that it shows instead of passing for a 0.
    ``accuracy``: the share of full marks of ``accuracy_reward``."""
    total = RewardScores(per_function, names, weights).total  # [N]
    return RewardStats(
        mean=total.nanmean(),
        std=nanstd(total).nan_to_num(0.0),
        frac_zero_std=without_signal(total.view(-1, group_size)).double().mean(),
        function_means={name: per_function[:, i].nanmean() for i, name in enumerate(names)},
        function_stds={name: _function_std(per_function[:, i]) for i, name in enumerate(names)},
        accuracy=accuracy(per_function, names, accuracy_reward) if accuracy_reward else None,
    )


def _function_std(column: Tensor) -> Tensor:
    """Std of one function's [N] scores; NaN when it said None for every row, as in TRL."""
    return torch.where(column.isnan().all(), torch.nan, nanstd(column).nan_to_num(0.0))


def length_stats(lengths: Tensor, is_truncated: Tensor) -> LengthStats:
    """Statistics of [N] completion lengths (tokens up to and including EOS), as 0-d tensors on their device;
    terminated = ended with EOS (0 when none did, as TRL)."""
    lengths, ended = lengths.float(), ~is_truncated
    any_ended = ended.any()
    return LengthStats(
        mean=lengths.mean(),
        min=lengths.min(),
        max=lengths.max(),
        clipped_ratio=is_truncated.float().mean(),
        mean_terminated=(lengths * ended).sum() / ended.sum().clamp(min=1),
        min_terminated=torch.where(any_ended, lengths.masked_fill(~ended, torch.inf).min(), 0.0),
        max_terminated=torch.where(any_ended, lengths.masked_fill(~ended, -torch.inf).max(), 0.0),
    )


def accuracy(per_function: Tensor, names: list[str], accuracy_reward: str) -> Tensor:
    """Fraction of scored completions the correctness function gave its full mark (>= 1.0); 0 when none was
    scored."""
    column = per_function[:, names.index(accuracy_reward)]
    scored = ~column.isnan()
    return ((column >= 1.0) & scored).float().sum() / scored.sum().clamp(min=1)


def pass_at_k(correct: Tensor, k: int) -> float:
    """The unbiased pass@k (Chen et al. 2021, arXiv:2107.03374) over prompts: [B, n] full marks of n samples
    per prompt -> the mean over prompts of ``1 - C(n - c, k) / C(n, k)``, c the prompt's correct samples.

    >>> import torch
    >>> one_of_four = torch.tensor([[True, False, False, False], [False, False, False, False]])
    >>> pass_at_k(one_of_four, 1), pass_at_k(one_of_four, 4)
    (0.125, 0.5)
    """
    n = correct.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n = {n} samples per prompt, got k={k}")
    wrong = (~correct).sum(dim=1).tolist()  # [B]
    return sum(1.0 - math.comb(w, k) / math.comb(n, k) for w in wrong) / len(wrong)


def eval_metrics(
    scores: RewardScores, rollout: Rollout, accuracy_reward: str | None, k: int | None
) -> dict[str, float]:
    """Held-out metrics of one batch: mean reward, per-function means, accuracy (the share of full marks of
    ``accuracy_reward``), with ``k`` samples per prompt pass@k and mean@k, and the mean completion length."""
    metrics = {"reward": scores.total.nanmean().nan_to_num(0.0).item()}
    for i, name in enumerate(scores.names):
        metrics[f"rewards/{name}/mean"] = scores.per_function[:, i].nanmean().item()  # NaN: never applied
    if accuracy_reward:
        metrics["accuracy"] = accuracy(scores.per_function, scores.names, accuracy_reward)
        if k:
            full_marks = scores.per_function[:, scores.names.index(accuracy_reward)] >= 1.0  # [B*k]
            metrics[f"pass@{k}"] = pass_at_k(full_marks.view(-1, k).cpu(), k)
            metrics[f"mean@{k}"] = metrics["accuracy"]
    metrics["completions/mean_length"] = rollout.completion_mask.sum(1).float().mean().item()
    return metrics
