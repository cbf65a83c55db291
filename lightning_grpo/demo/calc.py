"""The embedded tool task: ``37*6=`` -> ``222`` with a calculator tool, and a tiny model that rarely calls it.

``lightning-grpo/tiny-mul`` holds the task (chat prompts, an ``answer`` column); ``mul`` is its tool.

``lightning-grpo/tiny-qwen2-calc`` stands in for a pretrained tool-calling model: ``warm_start`` teaches it, by
next-token training, how to write a call from the prompt's numbers and how to read the reply, but it starts a reply
with a call only ~``CALL_RATE`` of the time and otherwise guesses a number. GRPO has to teach it *when* to call.
Its tokenizer is the default byte-level one plus one token per piece of the call's fixed JSON (``CALL_PIECES``), as
a BPE trained on tool-calling text would have them, so a call is 7 tokens of which 3 are the copied digits.

``lightning-grpo/tiny-qwen2-tools`` is the default tiny model with the tool chat template (never warm-started).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE, build_tiny_qwen2, build_tokenizer, write_splits

CALL_RATE = 0.1  # share of warm-started replies (to a prompt that lists the tool) that start with a call
CALL_PIECES = ['<tool_call>{"name": "mul", "arguments": {"a": ', ', "b": ', "}}</tool_call>"]
COPY_FIRST = 0.5  # share of the warm start spent on tool episodes alone
MODEL_SIZE: dict[str, int] = {}  # the default tiny size: 2 layers, 64 wide, 0.14M parameters


def mul(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def mul_rows(seed: int = 0) -> list[dict[str, Any]]:
    """Every ``a*b`` with a in 10..99 and b in 2..9 as chat prompts with an ``answer`` column, shuffled."""
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}*{b}="}], "answer": str(a * b)}
        for a in range(10, 100)
        for b in range(2, 10)
    ]
    random.Random(seed).shuffle(rows)
    return rows


def build_calc_tokenizer() -> Any:
    """The default byte-level tokenizer with the tool chat template and the call's JSON pieces as tokens."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(CALL_PIECES)  # plain tokens, not special: decoding keeps them for the call parser
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def episode_texts(tokenizer: Any, row: dict[str, Any]) -> tuple[str, str, str, str]:
    """The prompt rendered without and with the tool listed, the call turn, and the tool reply with the next
    header: rendered by the chat template, as the tool engine renders them."""
    from transformers.utils import get_json_schema

    chat, schema = row["prompt"], [get_json_schema(mul)]
    a, b = (int(x) for x in chat[0]["content"].rstrip("=").split("*"))
    call = {"type": "function", "function": {"name": "mul", "arguments": {"a": a, "b": b}}}
    turn = [*chat, {"role": "assistant", "content": "", "tool_calls": [call]}]
    plain = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.apply_chat_template(chat, tools=schema, add_generation_prompt=True, tokenize=False)
    called = tokenizer.apply_chat_template(turn, tools=schema, tokenize=False)
    replied = tokenizer.apply_chat_template(
        [*turn, {"role": "tool", "name": "mul", "content": str(a * b)}],
        tools=schema,
        add_generation_prompt=True,
        tokenize=False,
    )
    return plain, prompt, called[len(prompt) :], replied[len(called) :]


def warm_start(model: Any, tokenizer: Any, steps: int = 500, batch: int = 32, seed: int = 0) -> None:
    """Next-token training on three kinds of replies: a guess (a random number) to the prompt without the tool, a
    guess to the prompt with it, and a whole tool episode (call, reply, the reply's number copied).

    The episode trains every token but the tool reply's, and its first token (the decision to call) only as often
    as makes ``CALL_RATE`` of replies to the tool prompt start with a call. The first ``COPY_FIRST`` of the steps
    train the episodes alone: with the noisy guesses mixed in from the start, the 2-layer model takes ~3x longer
    to learn to copy the digits."""

    rng = random.Random(seed)
    episodes = [_episode_ids(tokenizer, row) for row in mul_rows()[150:]]  # training prompts only
    draw = lambda kind, p: _example(rng, rng.choice(episodes), kind, p, tokenizer)  # noqa: E731
    warm_start_loop(model, tokenizer.pad_token_id, steps, batch, draw)


def warm_start_loop(
    model: Any,
    pad_id: int,
    steps: int,
    batch: int,
    example: Callable[[int, float], tuple[list[int], list[int]]],
    call_rate: float = CALL_RATE,
    decay: bool = False,
) -> None:
    """The warm start's next-token training: ``steps`` AdamW steps, each on ``batch`` replies of
    ``example(kind, decide) -> (input ids, labels)`` (kind 0: a guess without the tool, 1: a guess with it, 2: a
    tool episode whose first token, the decision to call, is trained with probability ``decide``, so that
    ``call_rate`` of the replies to the tool prompt start with a call); the first ``COPY_FIRST`` of the steps on
    tool episodes alone. ``decay``: the learning rate falls linearly to 0 over the second half (demo.anytool: at a
    constant rate the last step's model copied 53-88% of its calls right, varying from run to run)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # matmuls this small do not split: on a busy 2-core machine 2 threads ran 9x slower
    decide = call_rate / (1 - call_rate)  # decision tokens trained per guess: calls / guesses = call_rate / rest
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # at 3e-3 the copying is not learnt at all
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, 2 * (1 - s / steps)) if decay else 1.0)
    model.train()
    for step in range(steps):
        copying = step < COPY_FIRST * steps
        rows = [example(2 if copying else i % 3, 0.0 if copying else decide) for i in range(batch)]
        optimizer.zero_grad()
        next_token_backward(model, pad_id, rows)
        optimizer.step()
        schedule.step()
    torch.set_num_threads(threads)
    model.eval()


def next_token_backward(model: Any, pad_id: int, rows: list[tuple[list[int], list[int]]], chunks: int = 4) -> None:
    """Gradients of the mean next-token loss over every label of ``rows`` ((input ids, labels), -100 unlabelled),
    the loss one padded batch gives, computed in ``chunks`` forwards of rows sorted by length: rows of 16-119
    tokens padded to the longest were mostly padding (the anytool warm start's step took 0.29 s, ~0.2 s in chunks)."""
    import torch
    import torch.nn.functional as F

    rows = sorted(rows, key=lambda row: len(row[0]))
    total = sum(label != -100 for _, labels in rows for label in labels[1:])  # labels predicted from a token before
    size = -(-len(rows) // chunks)
    for part in (rows[start : start + size] for start in range(0, len(rows), size)):
        width = max(len(ids) for ids, _ in part)
        input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in part])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in part])
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in part])
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels[:, 1:].flatten(), reduction="sum")  # -100 left out
        (loss / total).backward()


def _episode_ids(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], ...]:
    """Token ids of the plain prompt, the tool prompt, the call turn, the reply with the next header, the answer."""
    plain, prompt, call, reply = episode_texts(tokenizer, row)
    pieces = (plain, prompt, call, reply, row["answer"] + tokenizer.eos_token)
    return tuple(tokenizer(p, add_special_tokens=False)["input_ids"] for p in pieces)


def _example(rng: random.Random, episode: tuple, kind: int, decide: float, tokenizer: Any) -> tuple[list, list]:
    """(input ids, labels) of one reply: 0 a guess without the tool, 1 a guess with it, 2 a tool episode."""
    plain, prompt, call, reply, answer = episode
    if kind < 2:
        context = plain if kind == 0 else prompt
        guess = tokenizer(str(rng.randint(20, 891)) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        return context + guess, [-100] * len(context) + guess
    first = call[0] if rng.random() < decide else -100
    ids = prompt + call + reply + answer
    return ids, [-100] * len(prompt) + [first, *call[1:]] + [-100] * len(reply) + answer


def write_tiny_qwen2_calc(path: Path) -> None:
    """A 2-layer Qwen2 warm-started by ``warm_start``, with its tokenizer, saved with save_pretrained."""
    tokenizer = build_calc_tokenizer()
    model = build_tiny_qwen2(tokenizer, **MODEL_SIZE)
    warm_start(model, tokenizer)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_tiny_qwen2_tools(path: Path, source: Path) -> None:
    """The default tiny model (``source``: ``lightning-grpo/tiny-qwen2``'s folder) with the tool chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    AutoModelForCausalLM.from_pretrained(source).save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_tiny_mul(path: Path) -> None:
    """Train/validation JSONL; the 150 validation products never appear in training or the warm start."""
    rows = mul_rows()
    write_splits(path, {"train": rows[150:], "validation": rows[:150]})
