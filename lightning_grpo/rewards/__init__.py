"""Reward functions in the ecosystem's signature, presets of them, and the scoring of a rollout.

Every function takes ``(prompts, completions, completion_ids, **columns)`` (all by keyword, unknown keywords
ignored), accepts plain-text and chat completions, and returns one ``float`` or ``None`` per completion.

Exported here is what a user names: the functions and their classes, ``combine`` / ``weighted`` / ``preset``
(``PRESETS``), ``slow_reward``, ``reward_name`` (what a reward is logged as), ``RewardModel``, and the text
helpers for writing one's own reward (``completion_text``, ``answer_text``, ``extract_code``). The machinery
(scoring, the convention's checks, the sandbox) is imported from its own module.
"""

from lightning_grpo.rewards.code_execution import CodeExecutionReward, code_execution_reward
from lightning_grpo.rewards.combine import (
    PRESETS,
    combine,
    preset,
    weighted,
)
from lightning_grpo.rewards.convention import reward_name, slow_reward
from lightning_grpo.rewards.correctness import (
    FuzzyMatchReward,
    exact_match_reward,
    fuzzy_match_reward,
    multiple_choice_reward,
    normalized_match_reward,
    numeric_match_reward,
    rouge_l_reward,
)
from lightning_grpo.rewards.format import (
    JsonSchemaReward,
    PartialFormatReward,
    json_schema_reward,
    json_valid_reward,
    partial_format_reward,
    python_syntax_reward,
    soft_reasoning_format_reward,
    soft_think_format_reward,
    strict_reasoning_format_reward,
    strict_think_format_reward,
)
from lightning_grpo.rewards.length import (
    IdealLengthReward,
    LengthBoundsReward,
    SoftOverlongPunishment,
    ideal_length_reward,
    length_bounds_reward,
    soft_overlong_punishment,
)
from lightning_grpo.rewards.math_equivalence import MathVerifyReward, math_verify_reward
from lightning_grpo.rewards.model import RewardModel
from lightning_grpo.rewards.style import RepetitionPenalty, citation_reward, reasoning_steps_reward, repetition_penalty
from lightning_grpo.rewards.text import answer_text, completion_text, extract_code

__all__ = [
    "CodeExecutionReward",
    "FuzzyMatchReward",
    "IdealLengthReward",
    "JsonSchemaReward",
    "LengthBoundsReward",
    "MathVerifyReward",
    "PRESETS",
    "PartialFormatReward",
    "RepetitionPenalty",
    "RewardModel",
    "SoftOverlongPunishment",
    "answer_text",
    "citation_reward",
    "code_execution_reward",
    "combine",
    "completion_text",
    "exact_match_reward",
    "extract_code",
    "fuzzy_match_reward",
    "ideal_length_reward",
    "json_schema_reward",
    "json_valid_reward",
    "length_bounds_reward",
    "math_verify_reward",
    "multiple_choice_reward",
    "normalized_match_reward",
    "numeric_match_reward",
    "partial_format_reward",
    "preset",
    "python_syntax_reward",
    "reasoning_steps_reward",
    "repetition_penalty",
    "reward_name",
    "rouge_l_reward",
    "slow_reward",
    "soft_overlong_punishment",
    "soft_reasoning_format_reward",
    "soft_think_format_reward",
    "strict_reasoning_format_reward",
    "strict_think_format_reward",
    "weighted",
]
