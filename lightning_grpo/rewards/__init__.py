"""Reward functions in the ecosystem's signature, presets of them, and the scoring of a rollout.

Every function takes ``(prompts, completions, completion_ids, **columns)`` (all by keyword, unknown keywords
ignored), accepts plain-text and chat completions, and returns one ``float`` or ``None`` per completion.
"""

from lightning_grpo.rewards.code_execution import CodeExecutionReward, code_execution_reward
from lightning_grpo.rewards.combine import (
    CODE_GENERATION_REWARDS,
    MATH_REASONING_REWARDS,
    PRESETS,
    QA_REWARDS,
    SUMMARIZATION_REWARDS,
    AsyncWeighted,
    Combined,
    Weighted,
    combine,
    preset,
    weighted,
)
from lightning_grpo.rewards.convention import RewardFunc, is_async_reward, reward_name, slow_reward
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
from lightning_grpo.rewards.scoring import score_rollout
from lightning_grpo.rewards.style import RepetitionPenalty, citation_reward, reasoning_steps_reward, repetition_penalty
from lightning_grpo.rewards.text import answer_text, completion_text, extract_code
from lightning_grpo.sandbox.runner import Sandbox, SandboxResult

__all__ = [
    "AsyncWeighted",
    "CODE_GENERATION_REWARDS",
    "CodeExecutionReward",
    "Combined",
    "FuzzyMatchReward",
    "IdealLengthReward",
    "JsonSchemaReward",
    "LengthBoundsReward",
    "MATH_REASONING_REWARDS",
    "MathVerifyReward",
    "PRESETS",
    "PartialFormatReward",
    "QA_REWARDS",
    "RepetitionPenalty",
    "RewardFunc",
    "RewardModel",
    "SUMMARIZATION_REWARDS",
    "Sandbox",
    "SandboxResult",
    "SoftOverlongPunishment",
    "Weighted",
    "answer_text",
    "citation_reward",
    "code_execution_reward",
    "combine",
    "completion_text",
    "exact_match_reward",
    "extract_code",
    "fuzzy_match_reward",
    "ideal_length_reward",
    "is_async_reward",
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
    "score_rollout",
    "slow_reward",
    "soft_overlong_punishment",
    "soft_reasoning_format_reward",
    "soft_think_format_reward",
    "strict_reasoning_format_reward",
    "strict_think_format_reward",
    "weighted",
]
