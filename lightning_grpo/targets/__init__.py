"""A scored rollout -> what the loss is computed against (``build.py``): loss mask, advantages, normaliser,
sampling-policy and reference log-probs, the sampler-correction weights (``correction.py``) and the micro-batches
of the log-prob passes, all shaped by the ``update:`` settings (``config.py``); ``lightning_grpo.update`` makes the
optimiser steps from them."""

from lightning_grpo.targets.build import (
    EntropyCut,
    Targets,
    TargetSettings,
    build_targets,
)
from lightning_grpo.targets.config import UpdateConfig
from lightning_grpo.targets.correction import SAMPLING_CORRECTIONS, sampling_correction

__all__ = [
    "SAMPLING_CORRECTIONS",
    "EntropyCut",
    "TargetSettings",
    "Targets",
    "UpdateConfig",
    "build_targets",
    "sampling_correction",
]
