"""A rollout + the run's reward functions -> ``RewardScores`` ([N, F], their weights, failures and counters).
Knows the reward-function convention (``convention.py``) and how calls run (``calls.py``), not the model.

``trainer_state`` (the step) is passed to every function when given, as TRL does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_grpo.rewards.calls import Calls, RewardCallConfig, call_rewards
from lightning_grpo.rewards.convention import (
    RewardFunc,
    check_reward_range,
    is_correctness_reward,
    reward_kwargs,
    reward_names,
)
from lightning_grpo.types import RewardScores, Rollout


def score_rollout(
    reward_funcs: Sequence[RewardFunc],
    weights: Sequence[float],
    rollout: Rollout,
    columns: dict[str, list[Any]],
    on_error: str = "raise",
    timeout: float | None = None,
    trainer_state: Any = None,
    warned: set[str] | None = None,
) -> RewardScores:
    """Score N completions; ``columns`` hold B values each and are repeated G times to line up; the rollout's own
    ``columns`` (an engine's, e.g. an environment's reward) hold N already.

    Args:
        reward_funcs: the functions; metrics name them by ``reward_names`` (distinct, suffixed ``_2`` ...).
        on_error: a reward function that raises: ``raise`` (naming the function and the offending sample),
            ``skip`` (its failing rows count as "not applicable") or ``zero`` (they score 0.0); both of the
            latter are counted in ``RewardScores.errors``.
        timeout: seconds one call of one reward function may take; an overdue call fails every row, handled
            by ``on_error``. ``None``: no limit. On the main thread a plain function runs there and is
            interrupted by a signal (not SIGALRM, so math-verify's own ``signal.alarm`` timeouts still work).
        trainer_state: passed to every function as ``trainer_state`` when not ``None``, as TRL does, for
            rewards shaped by training progress (``trainer_state.global_step``); see ``trl_trainer_state``.
        warned: names of the functions already warned that they modify their arguments in place (each function
            gets its own copy of them: ``calls.own_view``); updated here, so a run warns once per function.
    """
    calls = Calls(RewardCallConfig(on_error, timeout), warned=set() if warned is None else warned)
    repeated = {k: [v for v in values for _ in range(rollout.group_size)] for k, values in columns.items()}
    repeated |= rollout.columns
    kwargs = reward_kwargs(rollout, repeated)
    if trainer_state is not None:
        kwargs["trainer_state"] = trainer_state
    table = call_rewards(reward_funcs, kwargs, len(rollout), calls)  # [F][N]
    names = reward_names(reward_funcs)
    for name, fn, values in zip(names, reward_funcs, table):
        if getattr(fn, "reward_range", None) is not None:  # a declared range: a value outside it is a bug
            check_reward_range(name, values, fn.reward_range)
    device = rollout.completion_ids.device
    return RewardScores(
        per_function=torch.tensor(table, dtype=torch.float32, device=device).T.reshape(len(rollout), -1),
        names=names,
        weights=torch.tensor(list(weights), dtype=torch.float32, device=device),
        errors=calls.errors,
        metrics=function_metrics(reward_funcs),
    )


def function_metrics(reward_funcs: Sequence[RewardFunc]) -> dict[str, float]:
    """The counters reward functions keep themselves (``metrics()``: e.g. the code sandbox's ``sandbox/timeouts``),
    read and reset once per scoring."""
    out: dict[str, float] = {}
    for fn in reward_funcs:
        read = getattr(fn, "metrics", None)
        if callable(read):
            out.update(read())
    return out


def trl_trainer_state(global_step: int, max_steps: int, epoch: float) -> Any:
    """The ``trainer_state`` TRL's reward functions receive (``transformers.TrainerState``), for ``score_rollout``.

    >>> trl_trainer_state(global_step=3, max_steps=10, epoch=0.5).global_step
    3
    """
    from transformers import TrainerState

    return TrainerState(global_step=global_step, max_steps=max_steps, epoch=epoch)


def default_accuracy_reward(reward_funcs: Sequence[RewardFunc], requested: str | None) -> str | None:
    """The reward whose full marks count as ``accuracy``: ``requested`` when given (it must name one of the
    functions), else the correctness reward when exactly one of ``reward_funcs`` is one, else ``None``.

    >>> from lightning_grpo.rewards.correctness import exact_match_reward
    >>> default_accuracy_reward([exact_match_reward, trl_trainer_state], None)
    'exact_match_reward'
    """
    names = reward_names(reward_funcs)
    correctness = [n for n, fn in zip(names, reward_funcs) if is_correctness_reward(fn)]
    if requested is None:
        return correctness[0] if len(correctness) == 1 else None
    if requested not in names:
        hint = f"set it to {correctness[0]!r}, the correctness reward, " if len(correctness) == 1 else "set it to one "
        raise ValueError(
            f"accuracy_reward must name one of the reward functions {names}, got {requested!r}: {hint}"
            "or leave it unset to use the correctness reward when there is exactly one "
            f"(correctness rewards here: {correctness})"
        )
    return requested


@dataclass
class RewardSet:
    """The run's reward functions with their weights, the one whose full marks count as ``accuracy``, and what a
    failing or overdue call does: everything ``GRPOModule`` needs to score a rollout.

    Args:
        funcs: callables or import paths (``trl.rewards.accuracy_reward``); a ``preset``'s are added after them.
        weights: one per function in ``funcs`` (default 1.0 each).
        preset: a named set of weighted functions (``lightning_grpo.rewards.PRESETS``).
        accuracy: the function whose full marks (>= 1.0) count as ``accuracy``; ``None``: the correctness
            reward when exactly one of the functions is one.
        calls: the ``reward_calls:`` settings.
    """

    funcs: list[RewardFunc]
    weights: list[float]
    accuracy: str | None
    calls: RewardCallConfig
    warned: set[str] = field(default_factory=set)
    """The functions told that they modified their arguments in place: each is told once a run."""

    @classmethod
    def build(
        cls,
        funcs: Sequence[RewardFunc | str] | None,
        weights: Sequence[float] | None,
        preset: str | None,
        accuracy: str | None,
        calls: RewardCallConfig,
    ) -> RewardSet:
        from lightning_grpo.rewards.combine import reward_set  # the presets import every reward function

        funcs, weights = reward_set(funcs, weights, preset)
        return cls(funcs, weights, default_accuracy_reward(funcs, accuracy), calls)

    def score(self, rollout: Rollout, columns: dict[str, list[Any]], trainer_state: Any = None) -> RewardScores:
        """``score_rollout`` with this set's functions, weights and call settings."""
        c = self.calls
        return score_rollout(
            self.funcs, self.weights, rollout, columns, c.on_error, c.timeout, trainer_state, self.warned
        )
