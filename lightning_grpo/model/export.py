"""The policy, or a distributed checkpoint directory (FSDP2, full fine-tuning), -> Hugging Face format: the model
in training gathered and saved (``save_hf``), a checkpoint one tensor at a time (``lightning-grpo export CHECKPOINT
OUT`` runs ``export_distributed_checkpoint``). Knows checkpoint layouts; nothing about training."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, AutoTokenizer

from lightning_grpo.model.gguf import with_gguf_file
from lightning_grpo.model.loading import merged_lora, resolve_pretrained
from lightning_grpo.model.sharding import full_state_dict, is_sharded


def save_hf(model: nn.Module, inputs: Any, path: str, is_global_zero: bool, merged: bool = False) -> None:
    """``model`` in Hugging Face format in ``path``, with ``inputs`` (what reads its inputs: a VLM's processor, else
    the tokenizer) beside it. Every rank calls it: a sharded model is gathered first (a collective); rank 0 writes. A
    full model: ``AutoModelForCausalLM.from_pretrained(path)``. A LoRA model: its adapter, as TRL and PEFT save it
    (``PeftModel.from_pretrained(base, path)``), and with ``merged`` also the merged model (base + adapter in full
    weights, from a copy: training can go on) in ``path/merged``."""
    state = full_state_dict(model) if is_sharded(model) else None
    if not is_global_zero:
        return
    model.save_pretrained(path, state_dict=state)
    inputs.save_pretrained(path)
    if merged:
        whole = merged_lora(model, state) if state is not None else copy.deepcopy(model).merge_and_unload()
        whole.save_pretrained(f"{path}/merged")
        inputs.save_pretrained(f"{path}/merged")


def export_distributed_checkpoint(checkpoint: str | Path, out: str | Path, max_shard_bytes: int = 2**30) -> Path:
    """A distributed checkpoint directory (``ModelParallelStrategy``, full fine-tuning) -> Hugging Face format in
    ``out`` (``AutoModelForCausalLM.from_pretrained(out)``), in one process without the whole model in memory:
    tensors are read one at a time and written in ``model-0000k-of-0000n.safetensors`` files of at most
    ``max_shard_bytes`` (a larger tensor gets a file of its own), so the peak is one file's tensors. Config and
    tokenizer come from the run's ``model``. LoRA checkpoints hold only the adapter: export those with
    ``GRPOModule.save_pretrained`` (the ``export:`` callback) at the end of training.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    hparams = torch.load(checkpoint / "meta.pt", weights_only=False)["hyper_parameters"]
    if (hparams.get("policy") or {}).get("peft_config"):
        raise ValueError(f"{checkpoint} is a LoRA run's checkpoint: it holds only the adapter, not a full model")
    if not isinstance(hparams.get("model"), str):
        raise ValueError(f"{checkpoint} does not name its model (a model object was passed): config unknown")
    source = resolve_pretrained(with_gguf_file(hparams["model"], (hparams.get("policy") or {}).get("gguf_file")))
    config = AutoConfig.from_pretrained(source)
    reader = dcp.FileSystemReader(checkpoint)
    entries = {
        k[len(PREFIX) :]: md for k, md in reader.read_metadata().state_dict_metadata.items() if k.startswith(PREFIX)
    }
    tied = "lm_head.weight" if getattr(config, "tie_word_embeddings", False) else None
    out.mkdir(parents=True, exist_ok=True)
    _write_files(reader, entries, _files(entries, tied, max_shard_bytes), out)
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


PREFIX = "state_dict.policy.model."  # the policy's weights in a GRPOModule checkpoint


def _nbytes(md: Any) -> int:
    return md.size.numel() * md.properties.dtype.itemsize


def _files(entries: dict[str, Any], tied: str | None, max_shard_bytes: int) -> list[list[str]]:
    """Tensor names per output file, in order, each file at most ``max_shard_bytes`` (a larger tensor alone);
    a tied LM head is left out (``from_pretrained`` ties it back)."""
    files: list[list[str]] = [[]]
    size = 0
    for name, md in entries.items():
        if files[-1] and size + _nbytes(md) > max_shard_bytes:
            files.append([])
            size = 0
        if name != tied:
            files[-1].append(name)
            size += _nbytes(md)
    return files


def _write_files(reader: dcp.FileSystemReader, entries: dict[str, Any], files: list[list[str]], out: Path) -> None:
    """Each file's tensors read from the checkpoint, written, and freed before the next; the index when several."""
    weight_map = {}
    for k, names in enumerate(files):
        filename = "model.safetensors" if len(files) == 1 else f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        tensors = {n: torch.empty(entries[n].size, dtype=entries[n].properties.dtype) for n in names}
        dcp.load({PREFIX + n: t for n, t in tensors.items()}, storage_reader=reader, no_dist=True)
        save_file(tensors, out / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, filename))
        del tensors
    if len(files) > 1:
        total = sum(_nbytes(entries[n]) for n in weight_map)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
