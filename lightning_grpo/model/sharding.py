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

from pathlib import Path
from types import MethodType

from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

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


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The unsharded weights on CPU, on rank 0 (other ranks get an empty dict). Every rank must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def export_distributed_checkpoint(checkpoint: str | Path, out: str | Path, max_shard_bytes: int = 2**30) -> Path:
    """A distributed checkpoint directory (``ModelParallelStrategy``, full fine-tuning) -> Hugging Face format in
    ``out`` (``AutoModelForCausalLM.from_pretrained(out)``), in one process without the whole model in memory:
    tensors are read one at a time and written in ``model-0000k-of-0000n.safetensors`` files of at most
    ``max_shard_bytes`` (a larger tensor gets a file of its own), so the peak is one file's tensors. Config and
    tokenizer come from the run's ``model``. LoRA checkpoints hold only the adapter: export those with
    ``GRPOModule.save_pretrained`` (the ``export:`` callback) at the end of training.
    """
    import json

    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    from lightning_grpo.model.loading import resolve_pretrained

    checkpoint, out = Path(checkpoint), Path(out)
    hparams = torch.load(checkpoint / "meta.pt", weights_only=False)["hyper_parameters"]
    if hparams.get("peft_config"):
        raise ValueError(f"{checkpoint} is a LoRA run's checkpoint: it holds only the adapter, not a full model")
    if not isinstance(hparams.get("model"), str):
        raise ValueError(f"{checkpoint} does not name its model (a model object was passed): config unknown")
    source = resolve_pretrained(hparams["model"])
    config = AutoConfig.from_pretrained(source)
    reader = dcp.FileSystemReader(checkpoint)
    prefix = "state_dict.policy.model."
    tied = "lm_head.weight" if getattr(config, "tie_word_embeddings", False) else None
    entries = {
        k[len(prefix) :]: md for k, md in reader.read_metadata().state_dict_metadata.items() if k.startswith(prefix)
    }
    files: list[list[str]] = [[]]
    size = 0
    for name, md in entries.items():
        nbytes = md.size.numel() * md.properties.dtype.itemsize
        if files[-1] and size + nbytes > max_shard_bytes:
            files.append([])
            size = 0
        if name != tied:
            files[-1].append(name)
            size += nbytes
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for k, names in enumerate(files):
        filename = "model.safetensors" if len(files) == 1 else f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        tensors = {n: torch.empty(entries[n].size, dtype=entries[n].properties.dtype) for n in names}
        dcp.load({prefix + n: t for n, t in tensors.items()}, storage_reader=reader, no_dist=True)
        save_file(tensors, out / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, filename))
        del tensors
    if len(files) > 1:
        total = sum(entries[n].size.numel() * entries[n].properties.dtype.itemsize for n in weight_map)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out
