"""Reward functions in the ecosystem's signature and the scoring of a rollout."""

from lightning_grpo.rewards.correctness import exact_match_reward, numeric_match_reward
from lightning_grpo.rewards.scoring import RewardFunc, reward_name, score_rollout

__all__ = ["RewardFunc", "exact_match_reward", "numeric_match_reward", "reward_name", "score_rollout"]
