"""Reward functions + their arguments -> a [F][N] table of checked values, with the ``reward_calls:`` settings
(what a failing or overdue call does). Knows how to run user code safely enough; nothing about rollouts.

Plain functions run one after another on the calling thread, so those that time themselves with
``signal.alarm`` (math-verify: open-r1's and TRL's ``accuracy_reward``) keep their own timeouts. Functions that
wait on something (an API, a sandbox, a worker process) run concurrently: ``async def`` ones are gathered on one
event loop, and sync ones marked ``is_slow = True`` (``@slow_reward``) each get a thread. Results keep the order
of ``reward_funcs``. As in TRL, ``bool`` scores count as 0/1.

Every function sees the completions as sampled: each call gets its own copy of the per-row arguments
(``completions``, ``prompts``, ``completion_ids``, the dataset's columns), so a function that edits them in place
(``completions[i] = ...``, ``message["content"] += ...``) changes nothing for the functions after it; it is told
so once, by a warning naming it.
"""

from __future__ import annotations

import asyncio
import copy
import math
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_grpo.checks import raise_problems
from lightning_grpo.deadline import DeadlineExceeded, call_with_deadline
from lightning_grpo.docstrings import field_help
from lightning_grpo.rewards.convention import (
    SHARED_KWARGS,
    RewardFunc,
    _check_values,
    is_async_reward,
    reward_name,
)

ON_ERROR = ("raise", "skip", "zero")


@field_help
@dataclass(frozen=True)
class RewardCallConfig:
    """What a failing or overdue reward call does. ``reward_calls:`` in YAML."""

    on_error: Literal[ON_ERROR] = "raise"
    """What a reward function that raises does. ``raise``: the run stops with a checkpoint, naming the function and
    the sample; ``skip``: failing rows count as not applicable; ``zero``: they score 0. Counted in
    ``train/reward_errors/<fn>``."""
    timeout: float | None = None
    """Seconds one call of one reward function may take; ``None``: no limit. An overdue call fails all its rows,
    handled by ``on_error``. A sync function off the main thread is abandoned on a daemon thread, not killed."""

    def __post_init__(self) -> None:
        raise_problems(
            "reward_calls",
            [
                (
                    self.on_error in ON_ERROR,
                    f"reward_calls.on_error must be one of {list(ON_ERROR)}, got {self.on_error!r}",
                ),
                (
                    self.timeout is None or self.timeout > 0,
                    f"reward_calls.timeout must be a positive number of seconds or None, got {self.timeout!r}",
                ),
            ],
        )


@dataclass
class Calls:
    """One scoring's call settings and the failures it counted per function under ``skip`` / ``zero``."""

    config: RewardCallConfig
    errors: dict[str, int] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    """Functions already told that they modified their arguments (the run's ``RewardSet`` keeps the set)."""

    @property
    def on_error(self) -> str:
        return self.config.on_error

    @property
    def timeout(self) -> float | None:
        return self.config.timeout


class RewardTimeoutError(RuntimeError):
    """A reward call took longer than ``reward_calls.timeout``."""

    def __init__(self, fn: RewardFunc, timeout: float) -> None:
        super().__init__(f"reward function {reward_name(fn)!r} took longer than reward_calls.timeout={timeout}s")


def own_view(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A copy of the per-row arguments for one function, so what it does to them stays its own.

    >>> kwargs = {"completions": [[{"role": "assistant", "content": "4"}]], "trainer_state": None}
    >>> view = own_view(kwargs)
    >>> view["completions"][0][0]["content"] = "rewritten"
    >>> kwargs["completions"][0][0]["content"]
    '4'
    """
    return {k: v if k in SHARED_KWARGS else copy.deepcopy(v) for k, v in kwargs.items()}


def _tell_if_modified(fn: RewardFunc, view: dict[str, Any], kwargs: dict[str, Any], calls: Calls) -> None:
    """One warning per function that changed its arguments in place: the change reached no other function."""
    changed = [k for k in kwargs if k not in SHARED_KWARGS and view[k] != kwargs[k]]
    name = reward_name(fn)
    if not changed or name in calls.warned:
        return
    calls.warned.add(name)
    warnings.warn(
        f"reward function {name!r} modified its {', '.join(changed)} argument(s) in place: each reward function "
        "gets its own copy of the completions as sampled, so the change reaches no other function. Return "
        "scores only; to score a cleaned-up text, clean a copy inside the function",
        UserWarning,
        stacklevel=2,
    )


def _run_with_timeout(fn: RewardFunc, kwargs: dict[str, Any], timeout: float | None) -> Any:
    """``fn(**kwargs)``, stopped after ``timeout`` seconds (``lightning_grpo.deadline``)."""
    try:
        return call_with_deadline(lambda: fn(**kwargs), timeout, f"reward-{reward_name(fn)}")
    except DeadlineExceeded as err:
        raise RewardTimeoutError(fn, timeout) from err


async def _await_with_timeout(fn: RewardFunc, kwargs: dict[str, Any], timeout: float | None) -> Any:
    """``await fn(**kwargs)``, cancelled after ``timeout`` seconds (a TimeoutError the function itself raises
    stays a failure of the function, not a timeout)."""
    task = asyncio.ensure_future(fn(**kwargs))
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        raise RewardTimeoutError(fn, timeout)
    return task.result()


def _timed_out(fn: RewardFunc, n: int, err: RewardTimeoutError, calls: Calls) -> list[float]:
    """Every row of an overdue call failed: raise (default), or all rows skipped or zero, counted."""
    if calls.on_error == "raise":
        raise err
    calls.errors[reward_name(fn)] = calls.errors.get(reward_name(fn), 0) + n
    return [math.nan if calls.on_error == "skip" else 0.0] * n


def _sample_text(kwargs: dict[str, Any], i: int) -> str:
    from lightning_grpo.rewards.text import completion_text

    prompt, completion = kwargs["prompts"][i], completion_text(kwargs["completions"][i])
    return f"prompt {str(prompt)[:120]!r}, completion {completion[:200]!r}"


def _recover(fn: RewardFunc, kwargs: dict[str, Any], n: int, err: Exception, calls: Calls) -> list[float]:
    """After a failure on the whole batch, score row by row: find the offending samples, then raise naming
    the first (``raise``), or give failing rows ``None`` (``skip``) or 0.0 (``zero``)."""
    call = (lambda kw: asyncio.run(fn(**kw))) if is_async_reward(fn) else (lambda kw: fn(**kw))
    values, failed = [], []
    for i in range(n):
        try:
            row = call(own_view({k: v if k in SHARED_KWARGS else v[i : i + 1] for k, v in kwargs.items()}))
        except Exception as row_err:  # noqa: BLE001 - any failure of user code is this row's failure
            failed.append((i, row_err))
            values.append(math.nan if calls.on_error == "skip" else 0.0)
            continue
        values += _check_values(reward_name(fn), row, 1)
    if calls.on_error == "raise" or not failed:  # not failed: only the whole batch fails (e.g. a batch-size bug)
        i, row_err = failed[0] if failed else (None, err)
        where = f" on sample {i} ({_sample_text(kwargs, i)})" if i is not None else ""
        raise RuntimeError(
            f"reward function {reward_name(fn)!r} raised {type(row_err).__name__}{where}: {row_err}"
        ) from err
    calls.errors[reward_name(fn)] = calls.errors.get(reward_name(fn), 0) + len(failed)
    return values


def _call(fn: RewardFunc, kwargs: dict[str, Any], n: int, calls: Calls) -> list[float]:
    view = own_view(kwargs)
    try:
        values = _run_with_timeout(fn, view, calls.timeout)
    except RewardTimeoutError as err:
        return _timed_out(fn, n, err, calls)
    except Exception as err:
        return _recover(fn, kwargs, n, err, calls)
    _tell_if_modified(fn, view, kwargs, calls)
    return _check_values(reward_name(fn), values, n)


async def _call_async(fn: RewardFunc, kwargs: dict[str, Any], n: int, calls: Calls) -> list[float]:
    view = own_view(kwargs)
    try:
        values = await _await_with_timeout(fn, view, calls.timeout)
        _tell_if_modified(fn, view, kwargs, calls)
    except RewardTimeoutError as err:
        return _timed_out(fn, n, err, calls)
    except Exception as err:
        return await asyncio.to_thread(_recover, fn, kwargs, n, err, calls)  # a thread may start its own loop
    return _check_values(reward_name(fn), values, n)


def _gather(fns: list[RewardFunc], kwargs: dict[str, Any], n: int, calls: Calls) -> list[list[float]]:
    """Run async reward functions concurrently on a fresh event loop (run on a worker thread: that thread has
    no loop yet, so this works whether or not the caller's thread is already running one)."""

    async def gather() -> list[list[float]]:
        return await asyncio.gather(*(_call_async(fn, kwargs, n, calls) for fn in fns))

    return asyncio.run(gather())


def call_rewards(reward_funcs: Sequence[RewardFunc], kwargs: dict[str, Any], n: int, calls: Calls) -> list[list[float]]:
    """[F][N] checked values: async and slow functions run concurrently while the plain ones run here."""
    async_ids = [i for i, fn in enumerate(reward_funcs) if is_async_reward(fn)]
    slow_ids = [i for i, fn in enumerate(reward_funcs) if i not in async_ids and getattr(fn, "is_slow", False)]
    if not async_ids and not slow_ids:
        return [_call(fn, kwargs, n, calls) for fn in reward_funcs]
    table: list[list[float] | None] = [None] * len(reward_funcs)
    with ThreadPoolExecutor(max_workers=len(slow_ids) + 1, thread_name_prefix="reward") as pool:
        slow = {i: pool.submit(_call, reward_funcs[i], kwargs, n, calls) for i in slow_ids}
        gathered = pool.submit(_gather, [reward_funcs[i] for i in async_ids], kwargs, n, calls) if async_ids else None
        for i, fn in enumerate(reward_funcs):
            if i not in slow and i not in async_ids:
                table[i] = _call(fn, kwargs, n, calls)
        for i, future in slow.items():
            table[i] = future.result()
        for i, values in zip(async_ids, gathered.result() if gathered else []):
            table[i] = values
    return table
