import asyncio
import math
import pickle

import pytest

from lightning_grpo.rewards import PRESETS, combine, preset, weighted
from lightning_grpo.rewards.convention import check_reward_weights, is_async_reward, reward_name, slow_reward
from lightning_grpo.rewards.correctness import exact_match_reward
from lightning_grpo.rewards.format import soft_think_format_reward


async def async_half_reward(completions, **kwargs):
    await asyncio.sleep(0)
    return [0.5] * len(completions)


def test_weighted_scales_keeps_none_and_name():
    doubled = weighted(exact_match_reward, 2.0)
    assert doubled(completions=["7", "8", "7"], answer=["7", "7", None]) == [2.0, 0.0, None]
    assert reward_name(doubled) == "exact_match_reward"
    assert pickle.loads(pickle.dumps(doubled))(["7"], answer=["7"]) == [2.0]


def test_weighted_keeps_async_and_slow_markers():
    halved_async = weighted(async_half_reward, 2.0)
    assert is_async_reward(halved_async) and asyncio.run(halved_async(["a"])) == [1.0]
    assert weighted(slow_reward(lambda completions, **k: [1.0]), 3.0).is_slow
    with pytest.raises(ValueError, match="weight must be a finite number, got nan"):
        weighted(exact_match_reward, math.nan)
    with pytest.raises(TypeError, match="fn must be a reward function"):
        weighted("exact_match_reward", 1.0)


def test_combine_sums_weights_and_skips_none():
    both = combine([(exact_match_reward, 1.0), (soft_think_format_reward, 0.5), (async_half_reward, -1.0)], "mix")
    scores = both(
        completions=["<think>a</think>7", "8", [{"role": "assistant", "content": None}]], answer=["7", None, None]
    )
    # 1 + 0.5 - 0.5; None + 0 - 0.5; None + 0 - 0.5
    assert scores == [1.0, -0.5, -0.5]
    assert both.__name__ == "mix" and both.is_slow  # it holds an async member
    only_none = combine([(exact_match_reward, 1.0)])
    assert only_none(["x"], answer=[None]) == [None] and only_none.__name__ == "combined_reward"
    with pytest.raises(ValueError, match="pairs is empty"):
        combine([])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_trainer_inputs_with_distinct_names(name):
    funcs, weights = preset(name)
    assert check_reward_weights(funcs, weights) == weights
    names = [reward_name(f) for f in funcs]
    assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)
    assert weights[0] == 1.0  # correctness leads, shaping rewards are smaller


def test_preset_names_and_unknown_name():
    assert sorted(PRESETS) == ["code_generation", "math_reasoning", "qa", "summarization"]
    with pytest.raises(ValueError, match=r"preset must be one of \['code_generation', .*\], got 'maths'"):
        preset("maths")


def test_presets_score_realistic_samples():
    math_reward = combine(PRESETS["math_reasoning"])
    [good, bad] = math_reward(
        completions=["<think>\nStep 1: add 2 and 2.\n</think>\nThe answer is \\boxed{4}", "5 5 5 5 5 5"],
        answer=["4", "4"],
    )
    assert good > 1.0 and bad < 0.0
    qa = combine(PRESETS["qa"])
    assert qa(completions=["Paris", "London"], answer=["paris", "Paris"]) == [1.0 + 0.5 + 0.1, 0.1]
    code = combine(PRESETS["code_generation"])
    program = "```python\ndef sq(x):\n    return x * x\n```"
    assert code(completions=[program, "no code"], test_cases=[["assert sq(3) == 9"]] * 2) == [1.1, 0.0]
    summary = combine(PRESETS["summarization"])
    reference = "the cat sat on the mat all day long while the dog slept"
    [same, empty] = summary(completions=[reference, ""], answer=[reference, reference])
    assert same == pytest.approx(1.0 + 0.2) and empty == 0.0
