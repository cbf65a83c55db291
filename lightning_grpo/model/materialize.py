"""Checkpoint files -> the weights of a model built on the meta device, each rank reading only its own shard.

Knows safetensors files, Hugging Face's layer naming (PEFT's wrapper included) and FSDP2's row sharding;
nothing about GRPO. Meta-device initialisation in three moves, as torchtitan does it:

1. ``empty_causal_lm``: the architecture from the config on the meta device: no memory, no random init.
2. the caller shards it (``fully_shard``: each parameter becomes a meta DTensor holding this rank's rows).
3. ``load_weights``: ``to_empty`` allocates this rank's rows only, then each is filled from the files with
   ``safe_open(...).get_slice``, which reads those rows and no others (the file mapped for that one read). A
   plain (unsharded) model takes the whole tensors. Peak memory per rank: its shard plus one tensor's rows.

Two kinds of tensors are not in the files: the non-persistent buffers (RoPE's ``inv_freq``), recomputed by the
model's own ``_init_weights``, and values the caller made for real before sharding (a LoRA adapter's
initialisation, ``real_tensors``), which are kept and sliced like the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

PEFT_PREFIX, PEFT_BASE_LAYER = "base_model.model.", ".base_layer"
# init_lora_weights values that initialise the adapter without reading the base weights (on meta, none exist)
LORA_INITS_WITHOUT_BASE = (True, False, "gaussian")


def empty_causal_lm(model_dir: str, dtype: Any, init_kwargs: dict[str, Any] | None = None) -> nn.Module:
    """``AutoModelForCausalLM`` of ``model_dir``'s config on the meta device, in ``dtype`` (``"auto"``: config's).
    ``init_kwargs`` (``model_init_kwargs``): ``attn_implementation`` and ``trust_remote_code`` go to the model,
    the others (``revision`` ...) and ``trust_remote_code`` to the config."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    kwargs = dict(init_kwargs or {})
    model_kwargs = {k: kwargs.pop(k) for k in ("attn_implementation",) if k in kwargs}
    model_kwargs |= {"trust_remote_code": kwargs["trust_remote_code"]} if "trust_remote_code" in kwargs else {}
    config = AutoConfig.from_pretrained(model_dir, **kwargs)
    if hasattr(config, "vision_config"):  # its checkpoint's names are not the causal LM's: not mapped yet
        raise ValueError(
            f"{model_dir!r} is a vision-language model: building it on the meta device (trainer.init_module("
            "empty_init=True)) is not supported yet; build the module outside init_module (FSDP2 then shards it whole)"
        )
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **model_kwargs)
    try:  # sampling defaults and EOS ids, as from_pretrained reads them
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    except OSError:
        pass  # no generation_config.json: from_config's defaults, as from_pretrained keeps them
    return model


def weight_files(model_dir: str) -> list[Path]:
    """The ``*.safetensors`` files of a local directory or a Hub name (downloaded once, weights and configs only)."""
    path = Path(model_dir)
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(model_dir, allow_patterns=["*.safetensors", "*.json"]))
    index = path / "model.safetensors.index.json"
    if index.exists():
        return sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"meta-device initialisation reads the weights from safetensors files; {model_dir!r} has none "
            f"(convert it with AutoModelForCausalLM.from_pretrained(...).save_pretrained(dir))"
        )
    return files


def materialize_lora_adapters(model: nn.Module, rng_state: Tensor) -> dict[str, Tensor]:
    """The adapters of a PEFT model on meta made real on CPU, drawn from ``rng_state`` in the order PEFT drew them
    (so equal to what ``get_peft_model`` gives a real base); name -> value, to keep through ``load_weights``."""
    torch.set_rng_state(rng_state)
    for module in model.modules():
        if not hasattr(module, "reset_lora_parameters"):
            continue
        for adapter in module.lora_A:
            init = model.peft_config[adapter].init_lora_weights
            if init not in LORA_INITS_WITHOUT_BASE or model.peft_config[adapter].use_dora:
                raise ValueError(
                    f"peft_config init_lora_weights={init!r} (use_dora={model.peft_config[adapter].use_dora}) reads "
                    f"the base weights, which meta-device initialisation has not loaded yet: use one of "
                    f"{list(LORA_INITS_WITHOUT_BASE)} without DoRA, or build the model without empty_init"
                )
            for linear in (module.lora_A[adapter], module.lora_B[adapter]):  # created as nn.Linear: drawn once
                linear.to_empty(device="cpu").reset_parameters()
            module.reset_lora_parameters(adapter, init)  # then drawn again by PEFT's own initialisation
    return {name: p.detach().clone() for name, p in model.named_parameters() if not p.is_meta}


def is_empty(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def load_weights(model: nn.Module, files: list[Path], real_tensors: dict[str, Tensor] | None = None) -> None:
    """Allocate ``model``'s tensors on CPU (``to_empty``) and fill them: each parameter's own rows from ``files``
    (from ``real_tensors`` where named there), non-persistent buffers recomputed. Every name must be found."""
    real_tensors = real_tensors or {}
    tied = _tied_names(model)
    model.to_empty(device="cpu")
    for name, first in tied.items():  # to_empty gave each module its own tensor: tie them again
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, model.get_parameter(first))
    where = _file_of_each_key(files)
    missing = []
    for name, tensor in _tensors_to_fill(model):
        if name in real_tensors:
            _fill(tensor, lambda rows, n=name: real_tensors[n][rows])
        elif (key := checkpoint_key(name)) in where:
            _fill(tensor, lambda rows, k=key: _read_rows(where[k], k, rows))
        else:
            missing.append(name)
    if missing:
        raise KeyError(f"meta-device initialisation: {len(missing)} tensors not in {files[0].parent}: {missing[:5]}")
    _recompute_non_persistent_buffers(model)


def _file_of_each_key(files: list[Path]) -> dict[str, Path]:
    from safetensors import safe_open

    where = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            where.update(dict.fromkeys(handle.keys(), file))
    return where


def _read_rows(file: Path, key: str, rows: slice) -> Tensor:
    """``rows`` of one tensor. The file is mapped for this one read: pages of a mapping count in RSS while it
    stays open, so a file held open through the whole load would add the rows read so far to the peak."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return handle.get_slice(key)[rows]


def checkpoint_key(name: str) -> str:
    """A parameter's name in Hugging Face's files: PEFT's wrapper prefix and ``.base_layer`` removed."""
    return name.removeprefix(PEFT_PREFIX).replace(PEFT_BASE_LAYER, "")


def _tied_names(model: nn.Module) -> dict[str, str]:
    """name -> the first name of the same parameter, for every second name of a shared one (tied LM head)."""
    first: dict[int, str] = {}
    tied = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tied.update({name: first[id(p)]} if id(p) in first else {})
        first.setdefault(id(p), name)
    return tied


def _tensors_to_fill(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Parameters (a tied pair once) and persistent buffers; the non-persistent ones are not in files."""
    yield from model.named_parameters()
    for name, buffer in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        if leaf not in model.get_submodule(owner)._non_persistent_buffers_set:
            yield name, buffer


def _fill(tensor: Tensor, read_rows: Any) -> None:
    """Copy this rank's rows into ``tensor`` (all rows when unsharded). FSDP2 shards dim 0 like ``torch.chunk``:
    rank r of W holds rows [r * ceil(n / W), ...), the last ranks fewer (or none)."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    start = 0
    if isinstance(tensor, DTensor):
        if tuple(tensor.placements) != (Shard(0),):
            raise NotImplementedError(
                f"meta-device loading handles 1-D FSDP2 sharding (Shard(0)), got {tensor.placements}"
            )
        rows, world = tensor.shape[0], tensor.device_mesh.size()
        start = tensor.device_mesh.get_local_rank() * -(-rows // world)
    if local.numel() == 0:
        return
    with torch.no_grad():
        local.copy_(read_rows(slice(start, start + local.shape[0])))


def _recompute_non_persistent_buffers(model: nn.Module) -> None:
    """RoPE's ``inv_freq`` and the like: Hugging Face's ``_init_weights`` recomputes them (a pure function of the
    config); it is called only on modules that hold no parameters, so no weight is re-drawn."""
    hf_model = next((m for m in model.modules() if hasattr(m, "_init_weights")), None)
    for module in model.modules():
        if module._non_persistent_buffers_set and not any(True for _ in module.parameters(recurse=False)):
            if hf_model is None:
                raise TypeError(f"cannot recompute the buffers of {type(module).__name__}: not a Hugging Face model")
            hf_model._init_weights(module)
