"""lightning_grpo: GRPO fine-tuning of language models as a PyTorch Lightning module, callbacks and CLI."""

from lightning_grpo.advantages import compute_advantages, group_advantages
from lightning_grpo.data import PromptDataModule
from lightning_grpo.loss import LossConfig, LossNormalizer, grpo_loss
from lightning_grpo.module import GRPOModule
from lightning_grpo.types import PromptBatch, RewardScores, Rollout

__all__ = [
    "GRPOModule",
    "LossConfig",
    "LossNormalizer",
    "PromptBatch",
    "PromptDataModule",
    "RewardScores",
    "Rollout",
    "compute_advantages",
    "grpo_loss",
    "group_advantages",
]
__version__ = "0.1.0"
