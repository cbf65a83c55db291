"""Per-token log-probs + advantages -> the GRPO-family loss (``grpo.py``), its settings (``config.py``), the policy
terms (``objectives.py``), the reductions and the table of loss types (``reduce.py``) and the entropy controls
(``entropy.py``). Pure functions: no model, no trainer, no logging."""

from lightning_grpo.loss.config import LossConfig
from lightning_grpo.loss.grpo import LossOutput, grpo_loss
from lightning_grpo.loss.reduce import LOSS_TYPES, LossNormalizer

__all__ = ["LOSS_TYPES", "LossConfig", "LossNormalizer", "LossOutput", "grpo_loss"]
