"""The embedded tool task: ``37*6=`` -> ``222`` with a calculator tool, and a tool-capable tiny model, built in code.

``lightning-grpo/tiny-mul`` holds the task (chat prompts, an ``answer`` column); ``mul`` is its tool;
``lightning-grpo/tiny-qwen2-tools`` is the default tiny model with a chat template that renders tools, tool calls and
tool replies (``demo.TOOL_CHAT_TEMPLATE``): what the docs and tests run the tool engine on.

Work in progress, not yet a demo that learns: ``pretrain_tool_format`` is meant to stand in for a pretrained
tool-calling model (it teaches how to write a call from the prompt's numbers and how to read the reply, while ~95%
of replies answer directly), so that GRPO has to teach *when* to call. 300 steps of it did not yet teach the
2-layer model the call's JSON; it is not used by the embedded model.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from lightning_grpo.demo import TOOL_CHAT_TEMPLATE, materialize, write_splits

CALL_RATE = 0.05  # share of the format pretraining's replies that start with a tool call


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


def episode_texts(tokenizer: Any, row: dict[str, Any]) -> tuple[str, str, str]:
    """The rendered prompt, the tool-call turn, and the tool reply with the answer after it."""
    from transformers.utils import get_json_schema

    chat, schema = row["prompt"], [get_json_schema(mul)]
    a, b = (int(x) for x in chat[0]["content"].rstrip("=").split("*"))
    call = {"type": "function", "function": {"name": "mul", "arguments": {"a": a, "b": b}}}
    turn = [*chat, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prompt = tokenizer.apply_chat_template(chat, tools=schema, add_generation_prompt=True, tokenize=False)
    called = tokenizer.apply_chat_template(turn, tools=schema, tokenize=False)
    replied = tokenizer.apply_chat_template(
        [*turn, {"role": "tool", "name": "mul", "content": str(a * b)}],
        tools=schema,
        add_generation_prompt=True,
        tokenize=False,
    )
    return prompt, called[len(prompt) :], replied[len(called) :] + f"{a * b}<eos>"


def pretrain_tool_format(model: Any, tokenizer: Any, steps: int = 300, batch: int = 64, seed: int = 0) -> None:
    """Next-token training on the format. Direct replies (random numbers) train every token; tool episodes
    train the call and the copied answer but not the tool reply, and their first token only in ``CALL_RATE``
    of cases, so that a reply starts with a call about 5% of the time: the decision is left to GRPO."""
    import torch

    rng = random.Random(seed)
    episodes = [_tool_episode(tokenizer, row) for row in mul_rows()[150:]]  # training prompts only
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        ids, labels = [], []
        for i in range(batch):
            prompt, call, reply, answer = rng.choice(episodes)
            if i % 2:  # a direct reply with a random number
                direct = tokenizer(str(rng.randint(10, 900)) + "<eos>", add_special_tokens=False)["input_ids"]
                ids.append(prompt + direct)
                labels.append([-100] * len(prompt) + direct)
            else:
                first = call[0] if rng.random() < CALL_RATE else -100  # the decision token, rarely trained
                ids.append(prompt + call + reply + answer)
                labels.append([-100] * len(prompt) + [first] + call[1:] + [-100] * len(reply) + answer)
        width = max(len(s) for s in ids)
        input_ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in ids])
        target = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
        attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in ids])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _tool_episode(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], ...]:
    """Token ids of the rendered prompt, the tool-call turn, the tool reply with the next header, the answer."""
    prompt, call, after = episode_texts(tokenizer, row)
    reply, answer = after.rsplit("<|assistant|>", 1)
    pieces = (prompt, call, reply + "<|assistant|>", answer)
    return tuple(tokenizer(p, add_special_tokens=False)["input_ids"] for p in pieces)


def write_tiny_qwen2_tools(path: Path) -> None:
    """The default tiny model (``lightning-grpo/tiny-qwen2``) with the tool chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = materialize("lightning-grpo/tiny-qwen2")
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    AutoModelForCausalLM.from_pretrained(source).save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_tiny_mul(path: Path) -> None:
    """Train/validation JSONL; the 150 validation products never appear in training or pretraining."""
    rows = mul_rows()
    write_splits(path, {"train": rows[150:], "validation": rows[:150]})
