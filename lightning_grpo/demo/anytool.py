"""Any tool you define -> a tiny model that can call it (a warm start from the tool's own schema), and the
``reverse`` demo built with it: ``lightning-grpo/tiny-qwen2-reverse`` and the task ``lightning-grpo/tiny-reverse``.

``tiny-qwen2-calc`` has the ``mul`` call's JSON among its tokens, so it can call nothing else. Here the tokenizer
holds only a call's scaffolding (``CALL_PIECES``): tool names and arguments are spelled byte by byte, so any tool
can be written. ``warm_start_tools`` teaches the format by next-token training on episodes made from each tool's
JSON schema: the user's message holds the arguments' values (``user_message``: a one-argument tool's value is the
whole message, verbatim; several arguments are one ``name: value`` line each), the call copies them, the tool itself
gives the reply, and the answer copies the reply. Only ``CALL_RATE`` of the replies to a prompt that lists the tools
start with a call; the others guess (the tool's output for other values), so the model rarely calls and greedy
decoding never does: GRPO teaches it *when* to call. Your dataset's prompts must put the arguments' values in the
user message the same way. Run it for your tools (``--help`` lists every option):

    python -m lightning_grpo.demo.anytool my_package.my_tools.reverse --out my-tiny-model   # ~5-8 min on CPU

A tool with several arguments gets twice the warm start and twice the attention heads (``default_steps``,
``model_size``): the model learns to find a value after its name later than one that is the whole message.
"""

from __future__ import annotations

import argparse
import functools
import random
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
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
STEPS = 1000  # warm-start steps, one-argument tools: word_count(text) 100% of calls exact at 1000 (decayed); 88% at 600
# Several arguments: each value is found after its name, not as the whole message, and the model learns that later
# and with more heads (shift(text, n), 100 fresh calls exact: 4 heads 0% at 1000 steps, 83% at 2000; 8 heads 100% at
# 2000; 4 layers 0% at 1000). Only such tools get them: the one-argument models stay as they were built.
STEPS_SEVERAL = 2000
SEVERAL_SIZE = {**MODEL_SIZE, "num_attention_heads": 8, "num_key_value_heads": 4}  # head size 16 (4 heads: 32)
BATCH = 32  # replies a step
MIN_CORRECT = 0.9  # the share of exact calls below which the CLI fails (report)


def reverse(text: str) -> str:
    """Reverse a string.

    Args:
        text: the string to reverse
    """
    return text[::-1]


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text whose space-separated words are counted
    """
    return len(text.split())


def shift(text: str, n: int) -> str:
    """Shift every letter of a lowercase text n places along the alphabet (a Caesar cipher); spaces stay.

    Args:
        text: the lowercase text to shift
        n: how many places to shift each letter
    """
    return "".join(c if c == " " else chr((ord(c) - 97 + n) % 26 + 97) for c in text)


def user_message(args: dict[str, Any]) -> str:
    """The user message the warm start teaches a model to read a call from: a one-argument tool's value is the whole
    message, verbatim (a text keeps its spaces); several arguments are one ``name: value`` line each, in the schema's
    order. Build your prompts with it.

    >>> user_message({"text": "two words"})
    'two words'
    >>> user_message({"text": "two words", "n": 3})
    'text: two words\\nn: 3'
    """
    for name, value in args.items():
        if "\n" in str(value):
            raise ValueError(f"argument {name!r} must fit on one line (one argument per line), got {value!r}")
    if len(args) == 1:
        return str(next(iter(args.values())))
    return "\n".join(f"{name}: {value}" for name, value in args.items())


def build_anytool_tokenizer() -> Any:
    """The default byte-level tokenizer with the tool chat template and the call's scaffolding as tokens."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(CALL_PIECES)  # plain tokens, not special: decoding keeps them for the call parser
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def random_value(kind: str, rng: random.Random) -> Any:
    """A value of a JSON-schema type: 1-4 short lowercase words, small integers and numbers, booleans."""
    if kind == "integer":
        return rng.randint(2, 99)
    if kind == "number":
        return round(rng.uniform(0, 100), 1)
    if kind == "boolean":
        return rng.random() < 0.5
    return " ".join(_word(rng) for _ in range(rng.randint(1, 4)))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 5)))


def tool_episode(tokenizer: Any, tools: list[Callable], tool: Callable, rng: random.Random) -> tuple[list[int], ...]:
    """Token ids of one synthetic episode: the prompt without and with the tools listed, the call turn, the tool's
    reply with the next header, the answer (the reply copied), and a guess (the tool's output for other values)."""
    schemas = _schemas(tuple(tools))
    properties = schemas[tools.index(tool)]["function"]["parameters"]["properties"]
    args = {name: random_value(p.get("type", "string"), rng) for name, p in properties.items()}
    other = {name: random_value(p.get("type", "string"), rng) for name, p in properties.items()}
    chat = [{"role": "user", "content": user_message(args)}]
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
    steps: int = STEPS,
    batch: int = BATCH,
    seed: int = 0,
    call_rate: float = CALL_RATE,
) -> None:
    """Next-token training on synthetic episodes of ``tools`` (see the module's docstring); the first
    ``COPY_FIRST`` of the steps on tool episodes alone (``demo.calc.warm_start_loop``, the same training)."""
    rng = random.Random(seed)
    pool = [tool_episode(tokenizer, tools, rng.choice(tools), rng) for _ in range(POOL)]  # rendering is the slow part
    draw = lambda kind, p: _example(rng.choice(pool), kind, p, rng)  # noqa: E731
    warm_start_loop(model, tokenizer.pad_token_id, steps, batch, draw, call_rate, decay=True)


def arguments(tools: list[Callable]) -> int:
    """The most arguments one of ``tools`` takes (its JSON schema's properties)."""
    return max(len(s["function"]["parameters"].get("properties", {})) for s in _schemas(tuple(tools)))


def default_steps(tools: list[Callable]) -> int:
    """Warm-start steps for ``tools``: ``STEPS`` when each takes one argument, ``STEPS_SEVERAL`` otherwise."""
    return STEPS if arguments(tools) <= 1 else STEPS_SEVERAL


def model_size(tools: list[Callable]) -> dict[str, int]:
    """The model's size settings for ``tools``: ``MODEL_SIZE`` when each takes one argument, ``SEVERAL_SIZE``."""
    return MODEL_SIZE if arguments(tools) <= 1 else SEVERAL_SIZE


def write_tool_model(path: Path, tools: list[Callable], steps: int | None = None, call_rate: float = CALL_RATE) -> Any:
    """A 2-layer Qwen2 (``model_size(tools)``) warm-started to call ``tools`` (``steps``, by default
    ``default_steps(tools)``), with its tokenizer, saved with save_pretrained; returned."""
    tokenizer = build_anytool_tokenizer()
    model = build_tiny_qwen2(tokenizer, **model_size(tools))
    warm_start_tools(model, tokenizer, tools, steps=steps or default_steps(tools), call_rate=call_rate)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


@dataclass(frozen=True)
class CallCheck:
    """How a warm-started model calls ``tools`` on fresh values (``check_calls``)."""

    correct: float
    """Share of calls written exactly (the tool's name and every argument's value) once the call is begun."""
    greedy_calls: float
    """Share of prompts on which greedy decoding begins a call unprompted (near 0: GRPO teaches when to call)."""
    bad: tuple[str, ...]
    """Up to three calls that were wrong, as the model wrote them."""


def check_calls(model: Any, tokenizer: Any, tools: list[Callable], prompts: int = 100, seed: int = 1) -> CallCheck:
    """Greedy decoding on ``prompts`` synthetic prompts (``user_message`` of fresh values): does it begin a call, and
    once the call's first token is given, does it write, character for character, the call that ``tool_episode``
    would?"""
    import torch

    rng, begin = random.Random(seed), tokenizer.convert_tokens_to_ids(CALL_PIECES[0])
    calls, correct, bad = 0, 0, []
    for _ in range(prompts):
        tool = rng.choice(tools)
        _, prompt, call, *_ = tool_episode(tokenizer, tools, tool, rng)
        with torch.no_grad():
            calls += int(model(torch.tensor([prompt])).logits[0, -1].argmax()) == begin
            out = model.generate(
                torch.tensor([prompt + [begin]]), max_new_tokens=len(call) + 8, do_sample=False,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
        written = tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True)
        ok = written.strip() == tokenizer.decode(call, skip_special_tokens=True).strip()
        correct += ok
        bad += [] if ok or len(bad) == 3 else [written]
    return CallCheck(correct / prompts, calls / prompts, tuple(bad))


def write_tiny_qwen2_reverse(path: Path) -> None:
    write_tool_model(path, [reverse])


def tool_rows(tools: list[Callable], rows: int = 1200, seed: int = 1) -> list[dict[str, Any]]:
    """Chat prompts of fresh values (``user_message``) with the tool's output as ``answer``: a task to try the
    recipe on (each row picks one of ``tools``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        tool = rng.choice(tools)
        properties = _schemas(tuple(tools))[tools.index(tool)]["function"]["parameters"]["properties"]
        args = {name: random_value(p.get("type", "string"), rng) for name, p in properties.items()}
        out.append({"prompt": [{"role": "user", "content": user_message(args)}],
                    "answer": str(tool(**args))})  # fmt: skip
    return out


def reverse_rows(seed: int = 1) -> list[dict[str, Any]]:
    """Lowercase words of 3-5 letters as chat prompts with their reversal as ``answer``, distinct, shuffled."""
    rng, seen = random.Random(seed), set()
    while len(seen) < 1200:
        seen.add(_word(rng))
    words = sorted(seen)
    rng.shuffle(words)
    return [{"prompt": [{"role": "user", "content": w}], "answer": w[::-1]} for w in words]


def write_tiny_reverse(path: Path) -> None:
    """Train/validation JSONL; the 200 validation words never appear in training (the warm start draws its own)."""
    rows = reverse_rows()
    write_splits(path, {"train": rows[200:], "validation": rows[:200]})


DESCRIPTION = """Warm-start a tiny model (2 layers, 128 wide) to call your tools, then check how it calls them.

The tools are Python functions with type hints and a Google-style docstring, given by import path. Your dataset's
user messages must hold the arguments' values as the warm start wrote them: a one-argument tool's value is the whole
message, verbatim (a text keeps its spaces); several arguments are one "name: value" line each, in the schema's
order; lightning_grpo.demo.anytool.user_message builds them. A tool with several arguments gets a model with 8
attention heads instead of 4 and a longer warm start (--steps). After the warm start, the model is checked on --check
fresh prompts: the share of calls it writes exactly once a call is begun (the run exits 1 below 90%: raise --steps),
and the share of prompts on which greedy decoding calls unprompted (near 0 is intended: GRPO teaches when to call)."""


def main(argv: list[str] | None = None) -> None:
    from lightning_grpo.demo.tiny import write_splits

    parser = argparse.ArgumentParser(
        prog="python -m lightning_grpo.demo.anytool", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("tools", nargs="+", help="import paths of the tools (package.module.function)")
    parser.add_argument("--out", required=True, help="the model directory to write (model and tokenizer)")
    parser.add_argument(
        "--steps", type=int,
        help=f"warm-start steps of {BATCH} replies (default {STEPS} when every tool takes one argument, ~5-8 CPU "
        f"minutes on 1 thread; {STEPS_SEVERAL} when one takes several, ~8-10 minutes); raise it when the check "
        "finds wrong calls",
    )  # fmt: skip
    parser.add_argument(
        "--call-rate", type=float, default=CALL_RATE,
        help=f"share of replies that start with a call (default {CALL_RATE}): low enough that greedy decoding does "
        "not call, high enough that sampling does (lower it if the check finds greedy decoding calling)",
    )  # fmt: skip
    parser.add_argument(
        "--data",
        help="also write a task to try the model on: DIR/train.jsonl (1000 rows) and "
        "DIR/validation.jsonl (200), prompts of random values with the tool's output as answer",
    )
    parser.add_argument("--check", type=int, default=100, help="fresh prompts the check decodes (default 100; 0 skips)")
    args = parser.parse_args(argv)
    if not 0 < args.call_rate < 1:
        parser.error(f"--call-rate must be between 0 and 1, got {args.call_rate}")
    if (args.steps is not None and args.steps < 1) or args.check < 0:
        parser.error(f"--steps must be >= 1 and --check >= 0, got {args.steps} and {args.check}")
    tools = [_import(t, parser) for t in args.tools]
    steps = args.steps or default_steps(tools)
    model = write_tool_model(Path(args.out), tools, steps, args.call_rate)
    if args.data:
        rows = tool_rows(tools)
        write_splits(Path(args.data), {"train": rows[200:], "validation": rows[:200]})
    if args.check:
        report(check_calls(model, build_anytool_tokenizer(), tools, args.check), steps)


def _import(path: str, parser: argparse.ArgumentParser) -> Callable:
    import importlib

    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        parser.error(f"cannot import the tool {path!r} ({e}): give package.module.function")


def report(check: CallCheck, steps: int) -> None:
    """Print the check; exit 1 when the model writes too few calls right to be trained on."""
    print(f"calls written exactly: {check.correct:.0%}; greedy decoding calls unprompted on {check.greedy_calls:.0%}")
    if check.correct < MIN_CORRECT:
        wrong = "; ".join(check.bad)
        sys.exit(
            f"the model writes only {check.correct:.0%} of its calls right (wrong: {wrong}), under {MIN_CORRECT:.0%}: "
            f"GRPO cannot teach it to use a tool it cannot call. Warm-start longer (--steps {2 * steps})"
        )


if __name__ == "__main__":
    main()
