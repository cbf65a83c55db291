"""Every reward function keeps the ecosystem's contract: both formats, malformed input, extra columns, None gold."""

import inspect
import math

import pytest

import lightning_grpo.rewards as rewards
from lightning_grpo.rewards.code_execution import CodeExecutionReward
from lightning_grpo.rewards.convention import reward_name

TEXTS = [
    "<think>\nStep 1: add.\n</think>\n<answer>7</answer>",
    "The answer is 7 [1]",
    '{"answer": 7}',
    "```python\nx = 7\n```",
    "7 7 7 7 7",
]
MALFORMED = ["", "   ", [{"role": "assistant", "content": None}], [{"role": "assistant"}], [], None, 7, [{}]]
# Rewards whose every row depends on a gold column: a None there means "not applicable".
GOLD_READERS = {
    "exact_match_reward",
    "normalized_match_reward",
    "fuzzy_match_reward",
    "numeric_match_reward",
    "multiple_choice_reward",
    "rouge_l_reward",
    "math_verify_reward",
    "code_execution_reward",
}

REWARDS = [
    rewards.exact_match_reward,
    rewards.normalized_match_reward,
    rewards.fuzzy_match_reward(),
    rewards.numeric_match_reward,
    rewards.multiple_choice_reward,
    rewards.rouge_l_reward,
    rewards.math_verify_reward,
    CodeExecutionReward(timeout_seconds=2.0),
    rewards.strict_reasoning_format_reward,
    rewards.soft_reasoning_format_reward,
    rewards.strict_think_format_reward,
    rewards.soft_think_format_reward,
    rewards.partial_format_reward(),
    rewards.json_valid_reward,
    rewards.json_schema_reward({"type": "object"}),
    rewards.python_syntax_reward,
    rewards.ideal_length_reward(target=10, width=5),
    rewards.length_bounds_reward(max_length=20),
    rewards.soft_overlong_punishment(max_completion_len=20, soft_punish_cache=5),
    rewards.repetition_penalty(),
    rewards.reasoning_steps_reward,
    rewards.citation_reward,
    rewards.weighted(rewards.exact_match_reward, 2.0),
    *[rewards.combine(pairs, name=f"{name}_preset") for name, pairs in rewards.PRESETS.items()],
]
IDS = [reward_name(fn) for fn in REWARDS]


def call(fn, completions, has_gold=True):
    """Called as scoring calls it: every argument by keyword, plus columns the function does not know."""
    n = len(completions)
    gold = ("B" if reward_name(fn) == "multiple_choice_reward" else "7") if has_gold else None
    return fn(
        prompts=["What is 3 + 4?"] * n,
        completions=completions,
        completion_ids=[[1] * len(rewards.completion_text(c)) for c in completions],
        answer=[gold] * n,
        solution=[gold] * n,
        test_cases=[None if gold is None else ["assert x == 7"]] * n,
        schema=[None] * n,
        difficulty=["easy"] * n,
        unrelated_column=[{"nested": [1, 2]}] * n,
    )


def check_values(values, n):
    assert isinstance(values, list) and len(values) == n
    for v in values:
        assert v is None or (isinstance(v, float) and math.isfinite(v)), values


@pytest.mark.parametrize("fn", REWARDS, ids=IDS)
def test_plain_and_chat_completions_score_the_same(fn):
    plain = call(fn, TEXTS)
    check_values(plain, len(TEXTS))
    assert call(fn, [[{"role": "assistant", "content": t}] for t in TEXTS]) == plain


@pytest.mark.parametrize("fn", REWARDS, ids=IDS)
def test_malformed_and_empty_completions_score_zero(fn):
    values = call(fn, MALFORMED)
    check_values(values, len(MALFORMED))
    assert set(values) <= {0.0}, values


@pytest.mark.parametrize("fn", [f for f in REWARDS if reward_name(f) in GOLD_READERS], ids=reward_name)
def test_none_gold_is_not_applicable(fn):
    assert call(fn, TEXTS + MALFORMED, has_gold=False) == [None] * (len(TEXTS) + len(MALFORMED))


def test_every_exported_reward_function_is_covered():
    helpers = {"combine", "preset", "reward_name", "score_rollout", "slow_reward", "weighted", "is_async_reward"}
    helpers |= {"answer_text", "completion_text", "extract_code"}
    factories = {"fuzzy_match_reward", "partial_format_reward", "json_schema_reward", "ideal_length_reward"}
    factories |= {"length_bounds_reward", "soft_overlong_punishment", "repetition_penalty"}
    exported = {
        name
        for name in rewards.__all__
        if callable(getattr(rewards, name)) and not inspect.isclass(getattr(rewards, name))
    }
    covered = set(IDS) | factories | {"RewardFunc"}
    # A factory's product is named after the function it builds (soft_overlong_punishment_reward ...).
    assert exported - helpers - covered == set()


def test_names_are_stable_and_distinct():
    names = [reward_name(fn) for fn in REWARDS[:22]]  # the 22 distinct text rewards
    assert len(set(names)) == len(names)
    assert reward_name(rewards.soft_overlong_punishment(10, 2)) == "soft_overlong_punishment_reward"
    assert reward_name(rewards.repetition_penalty(n=5)) == "repetition_penalty_reward"
