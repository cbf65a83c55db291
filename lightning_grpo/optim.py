"""Trainable parameters -> AdamW parameter groups. Knows module types and parameter names; nothing about GRPO.

Weight decay shrinks weights towards 0: right for matrices, wrong for biases and norm gains (a norm weight of 0
switches its channel off) and for embeddings (rare tokens' rows would decay between their rare gradients).
Which parameters decay follows Hugging Face ``Trainer.get_decay_parameter_names`` (biases, ``nn.LayerNorm`` and
any parameter whose name says norm: RMSNorm classes of every family), plus, unlike HF and as nanoGPT does,
``nn.Embedding`` weights (so also an LM head tied to them).
"""

from __future__ import annotations

from typing import Any

from torch import nn
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
