"""Trainable parameters -> AdamW parameter groups, and the learning-rate schedule over the run's optimiser steps.
Knows module types and parameter names; nothing about GRPO.

Weight decay shrinks weights towards 0: right for matrices, wrong for biases and norm gains (a norm weight of 0
switches its channel off) and for embeddings (rare tokens' rows would decay between their rare gradients).
Which parameters decay follows Hugging Face ``Trainer.get_decay_parameter_names`` (biases, ``nn.LayerNorm`` and
any parameter whose name says norm: RMSNorm classes of every family), plus, unlike HF and as nanoGPT does,
``nn.Embedding`` weights (so also an LM head tied to them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
from transformers.trainer_pt_utils import get_parameter_names

from lightning_grpo.checks import raise_problems
from lightning_grpo.docstrings import field_help

if TYPE_CHECKING:
    import lightning as L

# transformers.get_scheduler's schedules, less the two that step on a monitored metric (reduce_lr_on_plateau, greedy)
LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
)


@field_help
@dataclass(frozen=True)
class OptimConfig:
    """The optimiser and its schedule, Hugging Face ``TrainingArguments``' names. ``optim:`` in YAML."""

    learning_rate: float = 1e-6
    """AdamW learning rate. TRL's default 1e-6 suits pretrained models; tiny ones want 1e-3."""
    weight_decay: float = 0.0
    """AdamW weight decay of weight matrices; biases, norm weights and embeddings take none."""
    warmup_ratio: float = 0.0
    """Fraction of optimiser steps with linear warm-up."""
    warmup_steps: int = 0
    """Optimiser steps of linear warm-up; > 0 overrides warmup_ratio."""
    lr_scheduler_type: Literal[LR_SCHEDULERS] = "cosine"
    """A ``transformers.get_scheduler`` schedule (cosine here; linear in TRL)."""
    lr_scheduler_kwargs: dict[str, Any] | None = None
    """The schedule's own arguments. ``{min_lr_rate: 0.1}`` for cosine_with_min_lr, ``{num_decay_steps: 100}`` for
    warmup_stable_decay."""
    max_grad_norm: float | None = 1.0
    """Clip of the global gradient norm; ``None``: none. Logged before clipping as ``train/grad_norm``."""

    def __post_init__(self) -> None:
        raise_problems(
            "optim",
            [
                (self.learning_rate > 0, f"optim.learning_rate must be > 0, got {self.learning_rate!r}"),
                (self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay!r}"),
                (0 <= self.warmup_ratio < 1, f"optim.warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}"),
                (self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps!r}"),
                (
                    self.lr_scheduler_type in LR_SCHEDULERS,
                    f"optim.lr_scheduler_type must be one of {list(LR_SCHEDULERS)}, got {self.lr_scheduler_type!r}",
                ),
                (
                    self.max_grad_norm is None or self.max_grad_norm > 0,
                    f"optim.max_grad_norm must be None or > 0, got {self.max_grad_norm!r}",
                ),
            ],
        )


# Hugging Face Trainer's patterns (transformers 5.x ``get_decay_parameter_names``)
NO_DECAY_NAME_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def decay_parameter_names(model: nn.Module, decay_embeddings: bool = False) -> set[str]:
    """Names (as ``named_parameters`` gives them) of the parameters weight decay applies to."""
    no_decay_layers = [*ALL_LAYERNORM_LAYERS, *([] if decay_embeddings else [nn.Embedding])]
    return set(get_parameter_names(model, no_decay_layers, NO_DECAY_NAME_PATTERNS))


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict[str, Any]]:
    """AdamW groups of the trainable parameters: ``weight_decay`` on weight matrices, 0 on the rest.

    A tied LM head is the embedding's parameter: ``named_parameters`` lists it once, under the embedding.
    Empty groups are left out.
    """
    decay = decay_parameter_names(model, decay_embeddings)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for name, p in trainable if name in decay], "weight_decay": weight_decay},
        {"params": [p for name, p in trainable if name not in decay], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module, config: OptimConfig, factory: Callable[[Any], torch.optim.Optimizer] | None, amp_scaler: bool
) -> torch.optim.Optimizer:
    """AdamW over ``param_groups`` (or ``factory(groups)``, the user's optimiser). Fused AdamW runs one kernel over
    all parameters (on CPU ~10x faster than the per-tensor loop); FSDP2's sharded DTensor parameters, and fp16 AMP
    (``amp_scaler``: it unscales before clipping), take the default one."""
    groups = param_groups(model, config.weight_decay)  # no decay on biases, norms, embeddings
    if factory is not None:
        return factory(groups)
    sharded = any(isinstance(p, DTensor) for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=config.learning_rate, fused=not sharded and not amp_scaler)


def scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig, steps: int) -> Any:
    """``transformers.get_scheduler``'s ``config.lr_scheduler_type`` schedule over ``steps`` optimiser steps."""
    from transformers.optimization import get_scheduler  # imports peft: not before it is needed

    steps = max(int(steps), 1)
    warmup = config.warmup_steps or math.ceil(config.warmup_ratio * steps)
    return get_scheduler(
        config.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=steps,
        scheduler_specific_kwargs=config.lr_scheduler_kwargs,
    )


def optimizer_steps_of(trainer: L.Trainer, per_batch: int) -> int:
    """The optimiser steps the run will take, for the learning-rate schedule: ``max_steps`` counts them already;
    a run counted in epochs has ``per_batch`` of them per batch (num_iterations * steps_per_generation)."""
    steps = trainer.estimated_stepping_batches
    return steps * per_batch if trainer.max_steps == -1 else steps
