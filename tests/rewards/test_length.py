import math
import pickle
import random

import pytest
from trl.rewards import get_soft_overlong_punishment

from lightning_grpo.rewards.length import ideal_length_reward, length_bounds_reward, soft_overlong_punishment


def chat(text):
    return [{"role": "assistant", "content": text}]


def test_ideal_length_linear_hand_worked():
    reward = ideal_length_reward(target=10, width=4)
    ids = [[0] * n for n in (10, 8, 13, 14, 30)]
    # |10-10|/4 = 0 -> 1; 2/4 -> 0.5; 3/4 -> 0.25; 4/4 -> 0; beyond -> 0
    assert reward(["x"] * 5, completion_ids=ids) == [1.0, 0.5, 0.25, 0.0, 0.0]
    assert reward.__name__ == "ideal_length_reward"


def test_ideal_length_gaussian_words_and_chars():
    gaussian = ideal_length_reward(target=3, width=1, falloff="gaussian", unit="words")
    assert gaussian(["a b c", chat("a b c d"), "a b c d e"]) == [1.0, round(math.exp(-0.5), 4), round(math.exp(-2), 4)]
    assert ideal_length_reward(target=2, width=2, unit="chars")(["ab", "abc", "abcd"]) == [1.0, 0.5, 0.0]


def test_length_rewards_give_empty_and_malformed_completions_zero():
    ideal = ideal_length_reward(target=0, width=5, unit="chars")
    bounds = length_bounds_reward(min_length=0, unit="chars")
    malformed = ["", "   ", chat(None), [], None]
    assert ideal(malformed) == [0.0] * 5
    assert bounds(malformed) == [0.0] * 5


def test_length_bounds():
    reward = length_bounds_reward(min_length=2, max_length=4)
    ids = [[1], [1, 2], [1] * 4, [1] * 5]
    assert reward(["x"] * 4, completion_ids=ids) == [0.0, 1.0, 1.0, 0.0]
    assert length_bounds_reward(min_length=1, max_length=None, unit="words")(["a " * 1000]) == [1.0]


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (ideal_length_reward, {"target": 5, "width": 0}, "target must be >= 0 and width > 0, got target=5, width=0"),
        (ideal_length_reward, {"target": 5, "width": 1, "falloff": "cosine"}, "falloff must be one of"),
        (ideal_length_reward, {"target": 5, "width": 1, "unit": "lines"}, r"unit must be one of \['chars', 'tokens'"),
        (length_bounds_reward, {"min_length": 5, "max_length": 2}, "need 0 <= min_length <= max_length"),
        (soft_overlong_punishment, {"max_completion_len": 0, "soft_punish_cache": 0}, "max_completion_len must be"),
        (soft_overlong_punishment, {"max_completion_len": 10, "soft_punish_cache": 11}, "soft_punish_cache must be"),
    ],
)
def test_bad_settings_are_named(factory, kwargs, message):
    with pytest.raises(ValueError, match=message):
        factory(**kwargs)


def test_token_unit_needs_completion_ids():
    with pytest.raises(ValueError, match="unit='tokens' needs completion_ids"):
        ideal_length_reward(target=5, width=1)(["abc"])


def test_soft_overlong_punishment_hand_worked():
    punish = soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)
    lengths = [0, 6, 7, 8, 10, 11, 100]
    # safe up to 10 - 4 = 6; then (6 - L) / 4: 7 -> -0.25, 8 -> -0.5, 10 -> -1; beyond 10 -> -1
    assert punish(completion_ids=[[1] * n for n in lengths]) == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    assert punish.__name__ == "soft_overlong_punishment_reward"
    assert pickle.loads(pickle.dumps(punish))(completion_ids=[[1] * 8]) == [-0.5]


@pytest.mark.parametrize(("max_len", "cache"), [(100, 20), (50, 0), (64, 64), (7, 3), (1, 1)])
def test_soft_overlong_punishment_matches_trl(max_len, cache):
    rng = random.Random(max_len * 1000 + cache)
    completion_ids = [[1] * n for n in range(0, 2 * max_len + 2)] + [
        [1] * rng.randint(0, 3 * max_len) for _ in range(50)
    ]
    ours = soft_overlong_punishment(max_len, cache)
    theirs = get_soft_overlong_punishment(max_len, cache)
    assert ours(completions=["x"] * len(completion_ids), completion_ids=completion_ids) == theirs(completion_ids)
    assert ours.__name__ == theirs.__name__
