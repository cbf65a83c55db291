"""A scored rollout -> what the loss is computed against (``build.py``): loss mask, advantages, normaliser,
sampling-policy and reference log-probs, the sampler-correction weights (``correction.py``), the optimiser steps
and their micro-batches, all shaped by the ``update:`` settings (``config.py``)."""

from lightning_grpo.targets.build import (
    EntropyCut,
    OptimiserStep,
    Targets,
    TargetSettings,
    build_targets,
    entropy_cut,
    optimiser_steps,
    step_fault,
)
from lightning_grpo.targets.config import UpdateConfig
from lightning_grpo.targets.correction import SAMPLING_CORRECTIONS, sampling_correction

__all__ = [
    "SAMPLING_CORRECTIONS",
    "EntropyCut",
    "OptimiserStep",
    "TargetSettings",
    "Targets",
    "UpdateConfig",
    "build_targets",
    "entropy_cut",
    "optimiser_steps",
    "sampling_correction",
    "step_fault",
]
