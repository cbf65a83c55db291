"""Linear layers against weights pre-packed for oneDNN: the CPU decode step's matrix products.

Knows ``nn.Linear`` and oneDNN's packed layout; nothing about models or sampling.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Iterator

import torch
from torch import Tensor, nn

MIN_PACKED = 65_536  # weight elements: packing a smaller layer costs more per call than its decode steps save


def can_pack(layer: nn.Module) -> bool:
    """A plain fp32 CPU ``nn.Linear`` with ordinary tensors (not FSDP shards) and oneDNN in this build."""
    weight = getattr(layer, "weight", None)
    return (
        type(layer) is nn.Linear
        and type(weight) in (torch.Tensor, nn.Parameter)
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


def pack_weight(weight: Tensor, rows: int) -> Tensor:
    """A copy of an [out, in] fp32 weight in oneDNN's layout for products with ``rows`` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def packed_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """[..., in] -> [..., out] with a weight from ``pack_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear(
    weight: Tensor, bias: Tensor | None, rows: int, dtype: torch.dtype | None = None
) -> Callable[[Tensor], Tensor]:
    """``x -> x @ weight.T + bias`` for products of ``rows`` rows: on CPU against a packed copy of the weight when
    it has at least ``MIN_PACKED`` elements, else (a GPU's weight too) ``F.linear`` on the weight itself. With
    ``dtype`` (CPU autocast's, bf16) the copy, the bias and the input are in it, and so is the output, as autocast's
    own product gives."""
    if weight.numel() < MIN_PACKED or weight.device.type != "cpu":
        return functools.partial(nn.functional.linear, weight=weight, bias=bias)
    if dtype is None:
        return functools.partial(packed_linear, weight=pack_weight(weight, rows), bias=bias)
    packed, cast_bias = pack_weight(weight.to(dtype), rows), None if bias is None else bias.to(dtype)
    return lambda x: packed_linear(x.to(dtype), packed, cast_bias)


def autocast_dtype() -> torch.dtype | None:
    """The dtype CPU autocast computes linear layers in (``trainer.precision: bf16-mixed``), or ``None`` outside it."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


def packs_in(dtype: torch.dtype | None) -> bool:
    """Whether oneDNN here packs weights for products in ``dtype`` (``None``: fp32, the weights' own)."""
    return dtype is None or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@contextlib.contextmanager
def packed_linears(model: nn.Module, rows: int, skip: Collection[nn.Module] = ()) -> Iterator[None]:
    """Every packable linear layer of ``model`` (the LM head included) with at least ``MIN_PACKED`` weights runs
    against a copy of its weight pre-packed for oneDNN while the context lasts; the copies are made on entry, so
    they hold the current weights, and freed on exit. Layers in ``skip`` keep their forward.

    Why: at decode time a linear layer multiplies a few rows by its whole weight, and ``F.linear`` re-packs the
    weight on every call, which reads and writes it once more: [16, 256] x [256, 32000] took 14-20 ms against
    7.6 ms pre-packed, while copying the weight once (the memory floor) took 6.5 ms (1 thread, a loaded machine).
    The sums run in another order: logits agree to ~1e-5, like any two matmul kernels. Under CPU autocast
    (``trainer.precision: bf16-mixed``) the copies are bf16, as autocast's products are: autocast would cast each
    fp32 weight on every call ([32, 576] x [576, 49152]: 25.7 ms; packed bf16: 2.0 ms; packed fp32: 7.8 ms).
    """
    skip, dtype = set(skip), autocast_dtype()
    packable = [m for m in model.modules() if can_pack(m) and m.weight.numel() >= MIN_PACKED and m not in skip]
    patched = packable if packs_in(dtype) else []  # fp16 autocast: the layers' own forward
    for layer in patched:
        layer.forward = linear(layer.weight.detach(), layer.bias, rows, dtype)
    try:
        yield
    finally:
        for layer in patched:
            del layer.forward  # the class's forward again
