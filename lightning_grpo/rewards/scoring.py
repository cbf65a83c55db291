"""Completions + reward functions -> a [N, F] score table. Knows the reward-function convention, not the model.

The ecosystem's convention (TRL, open-r1): ``fn(prompts, completions, completion_ids, **columns)`` returns
one ``float`` or ``None`` per completion, where ``None`` means "not applicable to this sample".

Plain functions run one after another on the calling thread, so those that time themselves with
``signal.alarm`` (math-verify: open-r1's and TRL's ``accuracy_reward``) keep their own timeouts. Functions that
wait on something (an API, a sandbox, a worker process) run concurrently: ``async def`` ones are gathered on one
event loop, and sync ones marked ``is_slow = True`` (``@slow_reward``) each get a thread. Results keep the order
of ``reward_funcs``. As in TRL, ``bool`` scores count as 0/1 and ``trainer_state`` (the step) is passed when given.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from lightning_grpo.checks import raise_problems
from lightning_grpo.deadline import DeadlineExceeded, call_with_deadline
from lightning_grpo.types import RewardScores, Rollout

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


_WARNED_NAMES: set[tuple[str, ...]] = set()


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
    completion_ids = [ids[mask.bool()].tolist() for ids, mask in zip(rollout.completion_ids, rollout.completion_mask)]
    return {"prompts": rollout.prompts, "completions": rollout.completions, "completion_ids": completion_ids, **columns}


ON_ERROR = ("raise", "skip", "zero")


@dataclass(frozen=True)
class RewardCallConfig:
    """What a failing or overdue reward call does. ``reward_calls:`` in YAML.

    Attributes:
        on_error: a reward function that raises: ``raise`` (naming the function and the sample; the run stops
            with a checkpoint), ``skip`` (failing rows count as not applicable) or ``zero`` (they score 0);
            counted in ``train/reward_errors/<fn>``.
        timeout: seconds one call of one reward function may take; an overdue call fails all its rows, handled
            by ``on_error``. ``None``: no limit. A sync function off the main thread is abandoned on a daemon
            thread, not killed.
    """

    on_error: Literal[ON_ERROR] = "raise"
    timeout: float | None = None

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
            row = call({k: v if k in SHARED_KWARGS else v[i : i + 1] for k, v in kwargs.items()})
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
    try:
        values = _run_with_timeout(fn, kwargs, calls.timeout)
    except RewardTimeoutError as err:
        return _timed_out(fn, n, err, calls)
    except Exception as err:
        return _recover(fn, kwargs, n, err, calls)
    return _check_values(reward_name(fn), values, n)


async def _call_async(fn: RewardFunc, kwargs: dict[str, Any], n: int, calls: Calls) -> list[float]:
    try:
        values = await _await_with_timeout(fn, kwargs, calls.timeout)
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


def score_rollout(
    reward_funcs: Sequence[RewardFunc],
    weights: Sequence[float],
    rollout: Rollout,
    columns: dict[str, list[Any]],
    on_error: str = "raise",
    timeout: float | None = None,
    trainer_state: Any = None,
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
    """
    calls = Calls(RewardCallConfig(on_error, timeout))
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


# Correctness rewards we did not write, known by name: TRL's (trl.rewards) and open-r1's.
KNOWN_CORRECTNESS = frozenset({"accuracy_reward", "reasoning_accuracy_reward", "code_reward", "code_execution_reward"})


def is_correctness_reward(fn: RewardFunc) -> bool:
    """Whether ``fn`` scores correctness with full marks 1.0: its ``is_correctness`` attribute (set on ours,
    e.g. ``exact_match_reward``, ``math_verify_reward``), else a name in ``KNOWN_CORRECTNESS``."""
    flag = getattr(fn, "is_correctness", getattr(_unwrapped(fn), "is_correctness", None))
    return bool(flag) if flag is not None else reward_name(fn) in KNOWN_CORRECTNESS


def default_accuracy_reward(reward_funcs: Sequence[RewardFunc], requested: str | None) -> str | None:
    """The reward whose full marks count as ``accuracy``: ``requested`` when given (it must name one of the
    functions), else the correctness reward when exactly one of ``reward_funcs`` is one, else ``None``.

    >>> from lightning_grpo.rewards.correctness import exact_match_reward
    >>> default_accuracy_reward([exact_match_reward, reward_name], None)
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
