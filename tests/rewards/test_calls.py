"""Async and slow reward functions run concurrently in scoring, keep their order and their error messages."""

import asyncio
import math
import threading
import time

import pytest
from helpers import make_rollout

from lightning_grpo.rewards.convention import is_async_reward, slow_reward
from lightning_grpo.rewards.scoring import score_rollout


async def first_async_reward(completions, **kwargs):
    await asyncio.sleep(0.5)
    return [1.0] * len(completions)


async def second_async_reward(completions, answer, **kwargs):
    await asyncio.sleep(0.5)
    return [2.0 if c == a else None for c, a in zip(completions, answer)]


@slow_reward
def slow_sync_reward(completions, **kwargs):
    time.sleep(0.5)
    return [3.0] * len(completions)


def plain_reward(completions, **kwargs):
    return [4.0] * len(completions)


class AsyncJudge:
    """A configurable reward object whose ``__call__`` is async."""

    __name__ = "async_judge"

    async def __call__(self, completions, **kwargs):
        await asyncio.sleep(0.5)
        return [5.0] * len(completions)


def test_two_async_functions_overlap_and_keep_order():
    start = time.monotonic()
    scores = score_rollout(
        [first_async_reward, second_async_reward],
        [1.0, 1.0],
        make_rollout(["a", "b", "c", "c"]),
        {"answer": ["a", "c"]},
    )
    elapsed = time.monotonic() - start
    assert 0.45 < elapsed < 0.9  # ~0.5 s together, not 1 s one after the other
    assert scores.names == ["first_async_reward", "second_async_reward"]
    assert scores.per_function[:, 0].tolist() == [1.0] * 4
    assert scores.per_function[:, 1].tolist()[2:] == [2.0, 2.0] and math.isnan(scores.per_function[1, 1].item())


def test_async_slow_and_plain_functions_mixed():
    funcs = [plain_reward, first_async_reward, slow_sync_reward, AsyncJudge(), plain_reward]
    start = time.monotonic()
    with pytest.warns(UserWarning, match="share a name"):
        scores = score_rollout(funcs, [1.0] * 5, make_rollout(["a", "b"]), {})
    assert time.monotonic() - start < 0.9  # three 0.5 s functions at once
    assert scores.per_function[0].tolist() == [4.0, 1.0, 3.0, 5.0, 4.0]
    assert scores.names == ["plain_reward", "first_async_reward", "slow_sync_reward", "async_judge", "plain_reward_2"]


def test_works_when_the_caller_already_runs_an_event_loop():
    async def inside_a_loop():
        return score_rollout([first_async_reward], [1.0], make_rollout(["a", "b"]), {})

    assert asyncio.run(inside_a_loop()).total.tolist() == [1.0, 1.0]


def test_works_off_the_main_thread():
    out = {}
    thread = threading.Thread(
        target=lambda: out.update(s=score_rollout([first_async_reward], [1.0], make_rollout(["a", "b"]), {}))
    )
    thread.start()
    thread.join(timeout=10)
    assert out["s"].total.tolist() == [1.0, 1.0]


def test_async_errors_keep_the_existing_messages():
    async def broken_async_reward(completions, **kwargs):
        raise KeyError("solution")

    async def short_async_reward(completions, **kwargs):
        return [1.0]

    @slow_reward
    def texty_slow_reward(completions, **kwargs):
        return [1.0, "good"]

    with pytest.raises(RuntimeError, match="reward function 'broken_async_reward' raised KeyError"):
        score_rollout([plain_reward, broken_async_reward], [1.0, 1.0], make_rollout(["a", "b"]), {})
    with pytest.raises(ValueError, match="'short_async_reward' returned 1 values for 2 completions"):
        score_rollout([short_async_reward], [1.0], make_rollout(["a", "b"]), {})
    with pytest.raises(TypeError, match=r"'texty_slow_reward' returned 'good' \(str\) for completion 1"):
        score_rollout([texty_slow_reward], [1.0], make_rollout(["a", "b"]), {})


def test_detection():
    assert is_async_reward(first_async_reward) and is_async_reward(AsyncJudge())
    assert not is_async_reward(plain_reward) and not is_async_reward(slow_sync_reward)
    assert slow_sync_reward.is_slow and not hasattr(plain_reward, "is_slow")


def test_columns_may_not_shadow_the_rollout_arguments():
    with pytest.raises(ValueError, match=r"dataset columns \['completions'\] clash"):
        score_rollout([plain_reward], [1.0], make_rollout(["a", "b"]), {"completions": ["x"]})
