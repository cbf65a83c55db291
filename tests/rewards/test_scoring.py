import asyncio
import functools
import math
import time
import warnings

import pytest
from helpers import make_rollout

from lightning_grpo.rewards.calls import RewardCallConfig
from lightning_grpo.rewards.convention import check_reward_weights, reward_names, slow_reward
from lightning_grpo.rewards.scoring import RewardSet, default_accuracy_reward, score_rollout, trl_trainer_state


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_columns_are_repeated_per_completion_and_weighted():
    seen = {}

    def answer_reward(completions, answer, completion_ids, **kwargs):
        seen["answer"], seen["ids"] = answer, completion_ids
        return [1.0 if c == a else None for c, a in zip(completions, answer)]

    scores = score_rollout(
        [answer_reward, length_reward], [2.0, 0.5], make_rollout(["a", "b", "c", "c"]), {"answer": ["a", "c"]}
    )
    assert seen["answer"] == ["a", "a", "c", "c"]
    assert seen["ids"] == [[1, 1]] * 4
    assert scores.names == ["answer_reward", "length_reward"]
    assert math.isnan(scores.per_function[1, 0].item())
    assert scores.total.tolist() == [2.5, 0.5, 2.5, 2.5]


def test_all_none_row_has_nan_total():
    scores = score_rollout([lambda completions, **k: [None, 1.0]], [1.0], make_rollout(["a", "b"]), {})
    assert math.isnan(scores.total[0].item()) and scores.total[1].item() == 1.0


def test_raising_function_is_named():
    def broken_reward(completions, **kwargs):
        raise KeyError("solution")

    with pytest.raises(RuntimeError, match="reward function 'broken_reward' raised KeyError"):
        score_rollout([broken_reward], [1.0], make_rollout(["a", "b"]), {})


def test_wrong_count_and_non_numbers_are_named():
    with pytest.raises(ValueError, match="'short' returned 1 values for 2 completions"):

        def short(completions, **kwargs):
            return [1.0]

        score_rollout([short], [1.0], make_rollout(["a", "b"]), {})
    with pytest.raises(TypeError, match=r"'texty' returned 'good' \(str\) for completion 1"):

        def texty(completions, **kwargs):
            return [1.0, "good"]

        score_rollout([texty], [1.0], make_rollout(["a", "b"]), {})


def test_weights_must_match_functions():
    with pytest.raises(ValueError, match="reward_weights has 1 values for 2 reward functions"):
        check_reward_weights([length_reward, length_reward], [1.0])
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        check_reward_weights([], None)


def picky_reward(completions, **kwargs):
    """Fails on the completion "b" only."""
    if "b" in completions:
        raise ZeroDivisionError("division by zero")
    return [1.0] * len(completions)


def test_raise_names_the_offending_sample():
    with pytest.raises(
        RuntimeError, match=r"'picky_reward' raised ZeroDivisionError on sample 1 \(prompt 'p', completion 'b'\)"
    ):
        score_rollout([picky_reward], [1.0], make_rollout(["a", "b"]), {})


@pytest.mark.parametrize("policy,expected", [("skip", math.nan), ("zero", 0.0)])
def test_skip_and_zero_keep_training_and_count(policy, expected):
    scores = score_rollout([picky_reward], [1.0], make_rollout(["a", "b", "c", "b"]), {}, on_error=policy)
    values = scores.per_function[:, 0].tolist()
    assert values[0] == values[2] == 1.0
    assert all(math.isnan(v) if math.isnan(expected) else v == expected for v in (values[1], values[3]))
    assert scores.errors == {"picky_reward": 2}


def test_unknown_error_policy_is_named():
    expected = r"reward_calls.on_error must be one of \['raise', 'skip', 'zero'\], got 'ignore'"
    with pytest.raises(ValueError, match=expected):
        score_rollout([picky_reward], [1.0], make_rollout(["a", "b"]), {}, on_error="ignore")


def hanging_reward(completions, **kwargs):
    time.sleep(30)  # abandoned on a daemon thread: it cannot hold the test or the interpreter up
    return [1.0] * len(completions)


async def hanging_async_reward(completions, **kwargs):
    await asyncio.sleep(30)
    return [1.0] * len(completions)


def self_timing_out_reward(completions, **kwargs):
    raise TimeoutError("my own deadline")  # a failure of the function, not our timeout


@pytest.mark.parametrize("fn", [hanging_reward, hanging_async_reward])
def test_overdue_reward_call_raises_naming_the_function(fn):
    start = time.perf_counter()
    with pytest.raises(
        RuntimeError, match=rf"reward function '{fn.__name__}' took longer than reward_calls.timeout=0.2s"
    ):
        score_rollout([fn, length_reward], [1.0, 1.0], make_rollout(["a", "b"]), {}, timeout=0.2)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("policy,expected", [("skip", math.nan), ("zero", 0.0)])
def test_overdue_reward_call_is_skipped_or_zero_and_counted(policy, expected):
    scores = score_rollout(
        [hanging_async_reward, length_reward], [1.0, 1.0], make_rollout(["a", "bb"]), {}, policy, timeout=0.2
    )
    assert scores.errors == {"hanging_async_reward": 2}
    assert scores.per_function[:, 1].tolist() == [1.0, 2.0]  # the other function is unaffected
    assert all(math.isnan(v) if math.isnan(expected) else v == expected for v in scores.per_function[:, 0].tolist())


def test_fast_reward_within_timeout_and_own_timeouterror_is_not_ours():
    assert score_rollout([length_reward], [1.0], make_rollout(["ab"]), {}, timeout=5).total.tolist() == [2.0]
    with pytest.raises(RuntimeError, match="'self_timing_out_reward' raised TimeoutError on sample 0"):
        score_rollout([self_timing_out_reward], [1.0], make_rollout(["a"]), {}, timeout=5)


def test_bad_timeout_is_named():
    with pytest.raises(ValueError, match=r"reward_calls.timeout must be a positive number of seconds or None, got 0"):
        score_rollout([length_reward], [1.0], make_rollout(["a"]), {}, timeout=0)


def open_r1_accuracy_reward(completions, solution, **kwargs):
    """open-r1's accuracy reward, shortened: math-verify with its default ``signal.alarm`` timeouts."""
    from math_verify import parse, verify

    return [float(verify(parse(s), parse(c))) for c, s in zip(completions, solution)]


def test_signal_timed_math_verify_reward_works_under_reward_timeout():
    # Before: with reward_timeout set, the call ran on a worker thread where signal.alarm raises ValueError.
    scores = score_rollout(
        [open_r1_accuracy_reward], [1.0], make_rollout(["$\\frac{1}{2}$", "$3$"]), {"solution": ["$0.5$"]}, timeout=30
    )
    assert scores.per_function[:, 0].tolist() == [1.0, 0.0]


def test_timeout_still_stops_a_function_that_swallows_exceptions():
    def stubborn_reward(completions, **kwargs):
        try:
            time.sleep(30)
        except Exception:  # noqa: BLE001 - user code like this must not hide the timeout
            pass
        return [1.0] * len(completions)

    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="'stubborn_reward' took longer than reward_calls.timeout=0.2s"):
        score_rollout([stubborn_reward], [1.0], make_rollout(["a", "b"]), {}, timeout=0.2)
    assert time.perf_counter() - start < 5


def test_bool_scores_count_as_one_and_zero():  # as in TRL
    def is_a_reward(completions, **kwargs):
        return [c == "a" for c in completions]

    scores = score_rollout([is_a_reward], [1.0], make_rollout(["a", "b"]), {})
    assert scores.per_function[:, 0].tolist() == [1.0, 0.0]


def test_trainer_state_is_passed_when_given():
    seen = []

    def scheduled_reward(completions, trainer_state, **kwargs):
        seen.append(trainer_state.global_step)
        return [1.0] * len(completions)

    state = trl_trainer_state(global_step=7, max_steps=10, epoch=0.0)
    score_rollout([scheduled_reward], [1.0], make_rollout(["a", "b"]), {}, trainer_state=state)
    assert seen == [7]
    with pytest.raises(ValueError, match=r"dataset columns \['trainer_state'\] clash"):
        score_rollout([scheduled_reward], [1.0], make_rollout(["a", "b"]), {"trainer_state": [1]})


def test_functions_sharing_a_name_get_distinct_metric_names_and_one_warning():
    def scaled_reward(completions, scale=1.0, **kwargs):
        return [scale] * len(completions)

    funcs = [functools.partial(scaled_reward, scale=1.0), functools.partial(scaled_reward, scale=2.0)]
    with pytest.warns(UserWarning, match=r"logged as \['scaled_reward', 'scaled_reward_2'\]") as caught:
        scores = score_rollout(funcs, [1.0, 1.0], make_rollout(["a", "b"]), {})
        score_rollout(funcs, [1.0, 1.0], make_rollout(["a", "b"]), {})  # a second step does not warn again
    assert scores.names == ["scaled_reward", "scaled_reward_2"]
    assert len([w for w in caught if "share a name" in str(w.message)]) == 1
    assert reward_names([length_reward, scaled_reward]) == ["length_reward", "scaled_reward"]


def test_accuracy_reward_defaults_to_the_one_correctness_reward():
    from trl.rewards import accuracy_reward

    from lightning_grpo.rewards import (
        exact_match_reward,
        math_verify_reward,
        preset,
        soft_think_format_reward,
        weighted,
    )

    assert default_accuracy_reward([soft_think_format_reward, exact_match_reward], None) == "exact_match_reward"
    assert default_accuracy_reward([accuracy_reward, length_reward], None) == "accuracy_reward"
    assert default_accuracy_reward(preset("qa")[0], None) == "normalized_match_reward"
    assert default_accuracy_reward(preset("math_reasoning")[0], None) == "math_verify_reward"
    assert default_accuracy_reward([length_reward], None) is None  # none: no accuracy reported
    assert default_accuracy_reward([exact_match_reward, math_verify_reward], None) is None  # two: ambiguous
    assert default_accuracy_reward([exact_match_reward, length_reward], "length_reward") == "length_reward"
    assert default_accuracy_reward([weighted(exact_match_reward, 0.5)], None) is None  # full marks are 0.5 now


def test_missing_accuracy_reward_names_the_fix():
    from lightning_grpo.rewards import exact_match_reward

    with pytest.raises(ValueError, match=r"got 'accuracy_reward': set it to 'exact_match_reward', the correctness"):
        default_accuracy_reward([exact_match_reward, length_reward], "accuracy_reward")


def self_timed_reward(completions, **kwargs):
    """Times itself as math-verify does (``signal.alarm``): 0.0 for a computation that runs too long."""
    from math_verify.errors import TimeoutException
    from math_verify.utils import timeout

    @timeout(timeout_seconds=1)
    def forever():
        while True:
            pass

    try:
        forever()
    except TimeoutException:
        return [0.0] * len(completions)
    return [1.0] * len(completions)


def test_a_functions_own_signal_alarm_still_fires_under_reward_timeout():
    start = time.perf_counter()
    scores = score_rollout([self_timed_reward], [1.0], make_rollout(["a", "b"]), {}, timeout=20)
    assert scores.per_function[:, 0].tolist() == [0.0, 0.0] and time.perf_counter() - start < 5


def test_trls_accuracy_reward_keeps_its_timeouts_under_reward_timeout():
    import threading

    from trl.rewards import accuracy_reward

    threads = []

    def trl_accuracy_reward(**kwargs):  # TRL turns math-verify's timeouts off when it is not on the main thread
        threads.append(threading.current_thread())
        return accuracy_reward(**kwargs)

    completions = [[{"role": "assistant", "content": text}] for text in ("\\boxed{\\frac{1}{2}}", "$3$")]
    solution = {"solution": ["$\\frac{1}{2}$"]}
    scores = score_rollout([trl_accuracy_reward], [1.0], make_rollout(completions), solution, timeout=30)
    assert scores.per_function[:, 0].tolist() == [1.0, 0.0]
    assert threads == [threading.main_thread()]


class BoundedCounter:
    """A reward declaring its range and keeping a counter of its own, as the code sandbox does."""

    __name__ = "bounded_reward"
    reward_range = (0.0, 1.0)

    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self, completions, **kwargs):
        self.calls += 1
        return [self.value] * len(completions)

    def metrics(self):
        return {"bounded/calls": float(self.calls)}


def test_a_reward_outside_its_declared_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"reward function 'bounded_reward' returned 1.5 at index 0, outside its"):
        score_rollout([BoundedCounter(1.5)], [1.0], make_rollout(["a", "b"]), {})


def test_a_functions_own_counters_reach_the_scores():
    scores = score_rollout([BoundedCounter(1.0)], [1.0], make_rollout(["a", "b"]), {})
    assert scores.metrics == {"bounded/calls": 1.0} and scores.per_function.tolist() == [[1.0], [1.0]]


def rewriting_reward(completions, **kwargs):
    """Rewrites what it is given, as a careless reward function does: a message's text and a whole completion."""
    completions[0][0]["content"] = "rewritten"
    completions[1] = [{"role": "assistant", "content": "replaced"}]
    return [0.0] * len(completions)


@pytest.mark.parametrize("slow", [False, True], ids=["plain", "slow_reward"])
def test_a_function_that_modifies_completions_changes_nothing_for_the_next_and_is_told_once(slow):
    seen = []

    def reading_reward(completions, **kwargs):
        seen.append([c[0]["content"] for c in completions])
        return [1.0] * len(completions)

    first = slow_reward(rewriting_reward) if slow else rewriting_reward
    rollout = make_rollout(["a", "b"])
    rollout.completions = [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]]
    rewards = RewardSet([first, reading_reward], [1.0, 1.0], None, RewardCallConfig())
    with pytest.warns(UserWarning, match=r"reward function 'rewriting_reward' modified its completions argument"):
        rewards.score(rollout, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told once a run, not at every step
        rewards.score(rollout, {})
    assert seen == [["a", "b"], ["a", "b"]]  # the completions as sampled, both times
    assert [c[0]["content"] for c in rollout.completions] == ["a", "b"]  # and the rollout's own, for the loggers
