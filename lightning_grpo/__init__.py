"""lightning_grpo: GRPO fine-tuning of language models as a PyTorch Lightning module, callbacks and CLI."""

from lightning_grpo.advantages import AdvantageConfig, compute_advantages, group_advantages
from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.loss import LossConfig, LossNormalizer, grpo_loss
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.module import GRPOModule
from lightning_grpo.optim import OptimConfig
from lightning_grpo.rewards.calls import RewardCallConfig
from lightning_grpo.targets import UpdateConfig
from lightning_grpo.types import PromptBatch, RewardScores, Rollout

__all__ = [
    "AdvantageConfig",
    "GRPOModule",
    "LossConfig",
    "LossNormalizer",
    "OptimConfig",
    "PolicyConfig",
    "PromptBatch",
    "PromptDataModule",
    "RewardCallConfig",
    "RewardScores",
    "Rollout",
    "SamplingConfig",
    "UpdateConfig",
    "compute_advantages",
    "grpo_loss",
    "group_advantages",
]
__version__ = "0.2.0"
