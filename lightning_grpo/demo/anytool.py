"""Any tool you define -> a tiny model that can call it (a warm start from the tool's own schema), and the
``reverse`` demo built with it: ``lightning-grpo/tiny-qwen2-reverse`` and the task ``lightning-grpo/tiny-reverse``.

``tiny-qwen2-calc`` has the ``mul`` call's JSON among its tokens, so it can call nothing else. Here the tokenizer
holds only a call's scaffolding (``CALL_PIECES``): tool names and arguments are spelled byte by byte, so any tool
can be written. ``warm_start_tools`` teaches the format by next-token training on episodes made from each tool's
JSON schema: the user's message holds the arguments' values (space-separated, in the schema's order), the call
copies them, the tool itself gives the reply, and the answer copies the reply. Only ``CALL_RATE`` of the replies to a
prompt that lists the tools start with a call; the others guess (the tool's output for other values), so the model
rarely calls and greedy decoding never does: GRPO teaches it *when* to call. Your dataset's prompts
must put the arguments' values in the user message the same way. Run it for your tools:

    python -m lightning_grpo.demo.anytool my_package.my_tools.reverse --out my-tiny-model   # ~2-4 min on CPU
"""

from __future__ import annotations

import argparse
import functools
import inspect
import random
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_grpo.demo.calc import warm_start_loop
from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE, build_tiny_qwen2, build_tokenizer, write_splits

CALL_PIECES = ['<tool_call>{"name": "', '", "arguments": {', "}}</tool_call>"]  # a call's fixed JSON, no names
POOL = 3000  # synthetic episodes drawn from during the warm start
MODEL_SIZE = {"hidden_size": 128, "intermediate_size": 512}  # 2 layers; 64 wide did not learn to copy strings
# Half demo.calc's rate: at 0.10, greedy decoding of the reverse demo called on about half the words before any
# training (held-out 50.5% at the start), a guess's first token being spread over 26 letters; at 0.05 it calls on
# none (0.0%) while sampling still finds calls for GRPO (1.6% of episodes at the first step); at 0.03 GRPO found
# too few (0.0% -> 0.0% in 30 steps).
CALL_RATE = 0.05


def reverse(text: str) -> str:
    """Reverse a string.

    Args:
        text: the string to reverse
    """
    return text[::-1]


def build_anytool_tokenizer() -> Any:
    """The default byte-level tokenizer with the tool chat template and the call's scaffolding as tokens."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(CALL_PIECES)  # plain tokens, not special: decoding keeps them for the call parser
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def random_value(kind: str, rng: random.Random) -> Any:
    """A value of a JSON-schema type: short lowercase words, small integers and numbers, booleans."""
    if kind == "integer":
        return rng.randint(2, 99)
    if kind == "number":
        return round(rng.uniform(0, 100), 1)
    if kind == "boolean":
        return rng.random() < 0.5
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 5)))


def tool_episode(tokenizer: Any, tools: list[Callable], tool: Callable, rng: random.Random) -> tuple[list[int], ...]:
    """Token ids of one synthetic episode: the prompt without and with the tools listed, the call turn, the tool's
    reply with the next header, the answer (the reply copied), and a guess (the tool's output for other values)."""
    schemas = _schemas(tuple(tools))
    properties = schemas[tools.index(tool)]["function"]["parameters"]["properties"]
    args = {name: random_value(p.get("type", "string"), rng) for name, p in properties.items()}
    other = {name: random_value(p.get("type", "string"), rng) for name, p in properties.items()}
    chat = [{"role": "user", "content": " ".join(str(v) for v in args.values())}]
    reply = str(tool(**args))
    call = {"type": "function", "function": {"name": tool.__name__, "arguments": args}}
    turn = [*chat, {"role": "assistant", "content": "", "tool_calls": [call]}]
    render = tokenizer.apply_chat_template
    plain = render(chat, add_generation_prompt=True, tokenize=False)
    prompt = render(chat, tools=schemas, add_generation_prompt=True, tokenize=False)
    called = render(turn, tools=schemas, tokenize=False)
    replied = render([*turn, {"role": "tool", "name": tool.__name__, "content": reply}], tools=schemas,
                     add_generation_prompt=True, tokenize=False)  # fmt: skip
    pieces = (plain, prompt, called[len(prompt) :], replied[len(called) :], reply + tokenizer.eos_token)
    guess = str(tool(**other)) + tokenizer.eos_token
    return (*(tokenizer(p, add_special_tokens=False)["input_ids"] for p in pieces),
            tokenizer(guess, add_special_tokens=False)["input_ids"])  # fmt: skip


@functools.lru_cache(maxsize=8)
def _schemas(tools: tuple[Callable, ...]) -> list[dict[str, Any]]:
    from transformers.utils import get_json_schema

    return [get_json_schema(t) for t in tools]


def _example(episode: tuple, kind: int, decide: float, rng: random.Random) -> tuple[list, list]:
    """(input ids, labels) of one reply: 0 a guess without the tools, 1 a guess with them, 2 a tool episode whose
    first token (the decision to call) is trained only with probability ``decide``; the tool's reply never."""
    plain, prompt, call, reply, answer, guess = episode
    if kind < 2:
        context = plain if kind == 0 else prompt
        return context + guess, [-100] * len(context) + guess
    first = call[0] if rng.random() < decide else -100
    return prompt + call + reply + answer, [-100] * len(prompt) + [first, *call[1:]] + [-100] * len(reply) + answer


def warm_start_tools(
    model: Any,
    tokenizer: Any,
    tools: list[Callable],
    steps: int = 600,
    batch: int = 32,
    seed: int = 0,
    call_rate: float = CALL_RATE,
) -> None:
    """Next-token training on synthetic episodes of ``tools`` (see the module's docstring); the first
    ``COPY_FIRST`` of the steps on tool episodes alone (``demo.calc.warm_start_loop``, the same training)."""
    rng = random.Random(seed)
    pool = [tool_episode(tokenizer, tools, rng.choice(tools), rng) for _ in range(POOL)]  # rendering is the slow part
    draw = lambda kind, p: _example(rng.choice(pool), kind, p, rng)  # noqa: E731
    warm_start_loop(model, tokenizer.pad_token_id, steps, batch, draw, call_rate)


def write_tool_model(path: Path, tools: list[Callable], steps: int = 600, call_rate: float = CALL_RATE) -> None:
    """A 2-layer Qwen2 warm-started to call ``tools``, with its tokenizer, saved with save_pretrained."""
    tokenizer = build_anytool_tokenizer()
    model = build_tiny_qwen2(tokenizer, **MODEL_SIZE)
    warm_start_tools(model, tokenizer, tools, steps=steps, call_rate=call_rate)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_tiny_qwen2_reverse(path: Path) -> None:
    write_tool_model(path, [reverse])


def reverse_rows(seed: int = 1) -> list[dict[str, Any]]:
    """Lowercase words of 3-5 letters as chat prompts with their reversal as ``answer``, distinct, shuffled."""
    rng, seen = random.Random(seed), set()
    while len(seen) < 1200:
        seen.add(random_value("string", rng))
    words = sorted(seen)
    rng.shuffle(words)
    return [{"prompt": [{"role": "user", "content": w}], "answer": w[::-1]} for w in words]


def write_tiny_reverse(path: Path) -> None:
    """Train/validation JSONL; the 200 validation words never appear in training (the warm start draws its own)."""
    rows = reverse_rows()
    write_splits(path, {"train": rows[200:], "validation": rows[:200]})


def main(argv: list[str] | None = None) -> None:
    import importlib

    def resolve_tool(path: str) -> Callable:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    parser = argparse.ArgumentParser(description=inspect.getdoc(warm_start_tools))
    parser.add_argument("tools", nargs="+", help="import paths of the tools (package.module.function)")
    parser.add_argument("--out", required=True, help="the model directory to write")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument(
        "--call-rate",
        type=float,
        default=CALL_RATE,
        help="share of replies that start with a call: low enough that greedy decoding does not call, high enough "
        "that sampling does (lower it if your untrained model already calls greedily)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.call_rate < 1:
        parser.error(f"--call-rate must be between 0 and 1, got {args.call_rate}")
    write_tool_model(Path(args.out), [resolve_tool(t) for t in args.tools], args.steps, args.call_rate)


if __name__ == "__main__":
    main()
