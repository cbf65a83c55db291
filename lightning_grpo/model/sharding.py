"""Hugging Face causal LM -> FSDP2-sharded (``fully_shard``) for Lightning's ``ModelParallelStrategy``.

Knows the model's layer layout and FSDP2; nothing about GRPO. Each decoder layer is its own FSDP unit and the
root unit holds the rest (embeddings, final norm, LM head, tied or not). Two things make GRPO work under it:

- ``completion_logps`` calls the decoder and the LM head directly, not ``forward``, so it is registered as a
  forward method of the root: FSDP gathers the root's parameters around it and reduces their gradients after.
- ``generate`` is registered likewise: a PEFT wrapper's ``generate`` calls the inner model's ``forward``, never
  its own, so without it the root's weights would stay sharded during generation.
- Generation lengths differ per rank, but every forward all-gathers shards from every rank, so generation
  runs with ``synced_gpus``: a rank that is done keeps stepping until all ranks are (no deadlock).
"""

from __future__ import annotations

import copy
import math
from types import MethodType
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from lightning_grpo.model.logprobs import completion_logps

LOGPS_METHOD = "completion_logps"


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The repeated transformer blocks (``model.model.layers`` for Llama, Qwen2, Mistral, Gemma ...)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"cannot shard {type(model).__name__}: its decoder has no `layers` ModuleList; FSDP2 sharding supports "
            "Llama-style causal LMs (Llama, Qwen2, Mistral, Gemma, Phi-3 ...)"
        )
    return layers


def shard_causal_lm(model: nn.Module, mesh: DeviceMesh, frozen: bool = False) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` (1-D, data parallel) and return it.

    ``frozen``: a model that never runs backward (the reference). FSDP2 keeps the root's gathered weights
    (embeddings, LM head) until the backward that never comes; resharding after each forward frees them.
    """
    if isinstance(model, FSDPModule):
        return model  # configure_model can run again (e.g. fit then validate)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if frozen:
        model.set_reshard_after_forward(True)
    setattr(model, LOGPS_METHOD, MethodType(completion_logps, model))
    for method in (LOGPS_METHOD, "generate"):
        register_fsdp_forward_method(model, method)
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def full_state_dict(model: nn.Module, every_rank: bool = False, trained_only: bool = False) -> dict[str, Tensor]:
    """The unsharded weights, on CPU on rank 0 (other ranks get an empty dict), or with ``every_rank`` on every
    rank, on the weights' device; with ``trained_only`` those that require a gradient (a LoRA adapter's), the
    frozen ones neither gathered nor returned. Every rank must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not every_rank, ignore_frozen_params=trained_only)
    return get_model_state_dict(model, options=options)


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of an unsharded ``model``'s modules whose parameters are on the meta device (no memory): the
    skeleton ``unsharded`` fills once ``model`` has been sharded in place."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad) for p in model.parameters()}
    return copy.deepcopy(model, memo)


def unsharded(model: nn.Module, skeleton: nn.Module) -> nn.Module:
    """``skeleton`` (``meta_copy`` of ``model`` before sharding) with ``model``'s current weights, whole, on CPU on
    every rank: a plain module to sample from. Every rank must call it (a collective)."""
    state = full_state_dict(model, every_rank=True)
    skeleton.to_empty(device="cpu")
    buffers = dict(skeleton.named_buffers())
    with torch.no_grad():  # FSDP2 leaves buffers whole; the non-persistent ones (rotary frequencies) are not in state
        for name, buffer in model.named_buffers():
            buffers[name].copy_(buffer)
    skeleton.load_state_dict(state, strict=True)
    return skeleton


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
