"""The ecosystem's reward-function convention (TRL, open-r1): ``fn(prompts, completions, completion_ids,
**columns)`` returns one ``float`` or ``None`` per completion, where ``None`` means "not applicable to this
sample". Names, the arguments a function receives, the checks of what it returns, and which functions are
correctness rewards. Runs nothing.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from lightning_grpo.types import Rollout

_WARNED_NAMES: set[tuple[str, ...]] = set()


RewardFunc = Callable[..., Sequence[float | None]]


def _unwrapped(fn: RewardFunc) -> RewardFunc:
    """The function under ``functools.partial`` layers (a partial has no ``__name__`` of its own)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def reward_name(fn: RewardFunc) -> str:
    """The name metrics use: ``rewards/<name>/mean``; a ``functools.partial`` has its function's name.

    >>> reward_name(functools.partial(reward_name))
    'reward_name'
    """
    fn = _unwrapped(fn)
    return getattr(fn, "__name__", None) or type(fn).__name__


def reward_names(reward_funcs: Sequence[RewardFunc]) -> list[str]:
    """One distinct name per function, in order: a repeated name gets ``_2``, ``_3`` ... and one warning, so
    two functions (two partials of one function, two presets sharing one) never share ``rewards/<name>/*``.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     reward_names([reward_name, functools.partial(reward_name), slow_reward])
    ['reward_name', 'reward_name_2', 'slow_reward']
    """
    names: list[str] = []
    for fn in reward_funcs:
        base, k = reward_name(fn), 1
        name = base
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.append(name)
    renamed = [n for n, fn in zip(names, reward_funcs) if n != reward_name(fn)]
    if renamed and tuple(names) not in _WARNED_NAMES:  # once per set of functions, not once per step
        _WARNED_NAMES.add(tuple(names))
        warnings.warn(
            f"reward functions share a name; their metrics are logged as {names} (renamed: {renamed}). "
            "Give each function its own __name__ to choose the names.",
            UserWarning,
            stacklevel=2,
        )
    return names


def check_reward_weights(reward_funcs: Sequence[RewardFunc], weights: Sequence[float] | None) -> list[float]:
    """One weight per function (default 1.0 each)."""
    if not reward_funcs:
        raise ValueError("reward_funcs is empty: give at least one reward function (callable or import path)")
    for fn in reward_funcs:
        if not callable(fn):
            raise TypeError(f"reward_funcs entries must be callables, got {fn!r} ({type(fn).__name__})")
    if weights is None:
        return [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"reward_weights has {len(weights)} values for {len(reward_funcs)} reward functions "
            f"{[reward_name(f) for f in reward_funcs]}: give one weight per function"
        )
    return [float(w) for w in weights]


def _check_values(name: str, values: Any, n: int) -> list[float]:
    if values is None or isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        raise TypeError(f"reward function {name!r} returned {values!r}: it must return a list of {n} floats or None")
    if len(values) != n:
        raise ValueError(
            f"reward function {name!r} returned {len(values)} values for {n} completions: "
            "it must return one float (or None) per completion"
        )
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
        elif isinstance(v, numbers.Real):  # bool too: True/False score 1/0, as in TRL
            out.append(float(v))
        else:
            raise TypeError(
                f"reward function {name!r} returned {v!r} ({type(v).__name__}) for completion {i}: "
                "each value must be a float or None"
            )
    return out


def slow_reward(fn: RewardFunc) -> RewardFunc:
    """Mark a sync reward function as slow, so scoring runs it on its own thread alongside the others.

    >>> @slow_reward
    ... def api_judge_reward(completions, **kwargs):
    ...     return [1.0 for _ in completions]
    >>> api_judge_reward.is_slow
    True
    """
    fn.is_slow = True
    return fn


def is_async_reward(fn: RewardFunc) -> bool:
    """``async def`` functions, and objects whose ``__call__`` is ``async def``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


SHARED_KWARGS = ("trainer_state",)  # one value for the whole batch, not one per completion


def reward_kwargs(rollout: Rollout, columns: dict[str, list[Any]]) -> dict[str, Any]:
    """The keyword arguments every reward function receives: N of each."""
    clash = sorted({"prompts", "completions", "completion_ids", *SHARED_KWARGS} & columns.keys())
    if clash:
        raise ValueError(f"dataset columns {clash} clash with the arguments reward functions receive: rename them")
    completion_ids = [list(ids) for ids in rollout.host.completion_ids]  # the rows as read once; a copy to keep
    return {"prompts": rollout.prompts, "completions": rollout.completions, "completion_ids": completion_ids, **columns}


def check_reward_range(name: str, values: Sequence[float | None], reward_range: tuple[float, float]) -> None:
    """Raise naming the function if a value falls outside its declared ``reward_range`` (None is allowed).

    >>> check_reward_range("code_execution_reward", [0.0, None, 1.5], (0.0, 1.0))
    Traceback (most recent call last):
    ...
    ValueError: reward function 'code_execution_reward' returned 1.5 at index 2, outside its declared range [0.0, 1.0]
    """
    low, high = reward_range
    for i, value in enumerate(values):
        if value is not None and value == value and not low <= value <= high:  # None / NaN: not applicable
            raise ValueError(
                f"reward function {name!r} returned {value} at index {i}, outside its declared range [{low}, {high}]"
            )


# Correctness rewards we did not write, known by name: TRL's (trl.rewards) and open-r1's.
KNOWN_CORRECTNESS = frozenset({"accuracy_reward", "reasoning_accuracy_reward", "code_reward", "code_execution_reward"})


def is_correctness_reward(fn: RewardFunc) -> bool:
    """Whether ``fn`` scores correctness with full marks 1.0: its ``is_correctness`` attribute (set on ours,
    e.g. ``exact_match_reward``, ``math_verify_reward``), else a name in ``KNOWN_CORRECTNESS``."""
    flag = getattr(fn, "is_correctness", getattr(_unwrapped(fn), "is_correctness", None))
    return bool(flag) if flag is not None else reward_name(fn) in KNOWN_CORRECTNESS


PASSED = ("prompts", "completions", "completion_ids")  # and SHARED_KWARGS, and the dataset's other columns


def check_signatures(
    reward_funcs: Sequence[RewardFunc],
    columns: list[str],
    complete: bool = True,
    engine_columns: Sequence[str] = (),
) -> None:
    """Before any compute: every function accepts the keyword arguments scoring passes (``prompts``,
    ``completions``, ``completion_ids``, ``trainer_state``, the dataset's ``columns`` and the rollout engine's
    ``engine_columns``) and needs no other (unless the columns are not ``complete``: a ``rollout_func`` adds its
    own).

    >>> def needs_label(completions, label, **kwargs): ...
    >>> check_signatures([needs_label], ["answer"])
    Traceback (most recent call last):
    ...
    TypeError: reward function 'needs_label' needs argument 'label', which is not passed: reward functions \
receive prompts, completions, completion_ids, trainer_state and the dataset columns ['answer']
    """
    given = [*PASSED, *SHARED_KWARGS, *columns, *engine_columns]
    for fn in reward_funcs:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature: judged at its first call
            continue
        named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        needed = [n for n, p in named.items() if p.default is p.empty and n not in given]
        receives = f"reward functions receive {', '.join(given[:4])} and the dataset columns {columns}"
        if engine_columns:
            receives += f" and the rollout engine's {list(engine_columns)}"
        if needed and complete:
            raise TypeError(
                f"reward function {reward_name(fn)!r} needs argument {needed[0]!r}, which is not passed: {receives}"
            )
        if not any(p.kind == p.VAR_KEYWORD for p in params) and set(given) - named.keys():
            refused = sorted(set(given) - named.keys())
            raise TypeError(
                f"reward function {reward_name(fn)!r} does not accept {refused}: add **kwargs to its signature "
                f"({receives})"
            )
