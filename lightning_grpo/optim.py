"""Trainable parameters -> AdamW parameter groups. Knows module types and parameter names; nothing about GRPO.

Weight decay shrinks weights towards 0: right for matrices, wrong for biases and norm gains (a norm weight of 0
switches its channel off) and for embeddings (rare tokens' rows would decay between their rare gradients).
Which parameters decay follows Hugging Face ``Trainer.get_decay_parameter_names`` (biases, ``nn.LayerNorm`` and
any parameter whose name says norm: RMSNorm classes of every family), plus, unlike HF and as nanoGPT does,
``nn.Embedding`` weights (so also an LM head tied to them).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
from transformers.trainer_pt_utils import get_parameter_names

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


def clip_gradients(params: list[nn.Parameter], max_norm: float | None, root: Any = None) -> Tensor:
    """Clip the global gradient norm to ``max_norm`` (``None``: no clipping) and return it as it was before, so
    one norm computation serves the clipping and the finiteness check; every rank gets the same value.

    ``root``: an FSDP1 root module, the only one that sees every shard; plain, DDP (identical gradients) and
    FSDP2 (DTensor gradients, whose norm is global) clip the parameters directly.
    """
    if root is not None:
        return root.clip_grad_norm_(math.inf if max_norm is None else max_norm)
    params = [p for p in params if p.grad is not None]
    if max_norm is None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def scheduler(optimizer: torch.optim.Optimizer, name: str, warmup_ratio: float, steps: int) -> Any:
    """``transformers.get_scheduler``'s ``name`` schedule over ``steps`` optimiser steps, warm-up first."""
    from transformers.optimization import get_scheduler  # imports peft: not before it is needed

    steps = max(int(steps), 1)
    return get_scheduler(name, optimizer, num_warmup_steps=math.ceil(warmup_ratio * steps), num_training_steps=steps)
