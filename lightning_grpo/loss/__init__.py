"""Per-token log-probs + advantages -> the GRPO-family loss (``grpo.py``), the policy terms it can use
(``objectives.py``) and the entropy controls (``entropy.py``). Pure functions: no model, no trainer, no logging."""

from lightning_grpo.loss.grpo import LOSS_TYPES, LossConfig, LossNormalizer, LossOutput, grpo_loss

__all__ = ["LOSS_TYPES", "LossConfig", "LossNormalizer", "LossOutput", "grpo_loss"]
