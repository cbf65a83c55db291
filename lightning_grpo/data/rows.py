"""A dataset's prompt column -> prompts checked and shaped: what a prompt is (``PROMPT_TYPES``), the problems of
its rows named by row, chat messages with a system prompt and few-shot examples, and how many rows are held out.
Knows rows; nothing about files or tokenizers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset


PROMPT_TYPES = (
    "a string, or a list of chat messages, each a dict with 'role' and 'content' "
    '(e.g. [{"role": "user", "content": "2+2="}])'
)


def prompt_problem(prompt: Any) -> str | None:
    """What makes ``prompt`` not a prompt (``PROMPT_TYPES``), or ``None``: the tokenizer's own errors name neither
    the column nor the row.

    >>> prompt_problem(42)
    'is 42 (int)'
    >>> prompt_problem([{"content": "2+2="}])
    "message 0 has no 'role': {'content': '2+2='}"
    >>> prompt_problem([{"role": "user", "content": "2+2="}]) is None
    True
    """
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list):
        return f"is {_short(prompt)} ({'null' if prompt is None else type(prompt).__name__})"
    if not prompt:
        return "is an empty list of messages"
    for i, message in enumerate(prompt):
        problem = _message_problem(message)
        if problem:
            return f"message {i} {problem}: {_short(message)}"
    return None


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return f"is a {type(message).__name__}, not a dict"
    missing = [key for key in ("role", "content") if message.get(key) is None and not _tool_call(message, key)]
    if missing:
        return f"has no {' or '.join(repr(key) for key in missing)}"
    if not isinstance(message["role"], str):
        return f"has a {type(message['role']).__name__} 'role', not a string"
    content = message["content"]
    if content is not None and not isinstance(content, (str, list)):
        return f"has a {type(content).__name__} 'content', not a string (or a list of parts)"
    return None


def _tool_call(message: dict, key: str) -> bool:
    """An assistant message that calls tools may have no text: ``content`` is then ``None``."""
    return key == "content" and bool(message.get("tool_calls"))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def prompt_problems(data: Dataset, column: str) -> list[str]:
    """``row i: ...`` for each row of a loaded split whose ``column`` is not a prompt (row i is ``data[i]``)."""
    feature = data.features.get(column)
    if getattr(feature, "dtype", None) in ("string", "large_string") and not data.data.column(column).null_count:
        return []  # a text column without missing values: every row is a prompt, and reading them costs time
    return [
        f"row {i}: {column!r} {problem}" for i, value in enumerate(data[column]) if (problem := prompt_problem(value))
    ]


def mixed_kinds(prompts: list[Any]) -> str | None:
    """Why ``prompts`` (a split's, each one a prompt) cannot be batched together, or ``None``: a step renders its
    batch's prompts one way, through the chat template or as plain text, so one split holds one kind. Names the
    rows of the fewer kind (the first 10).

    >>> mixed_kinds(["2+2=", [{"role": "user", "content": "3+3="}], "4+4="])
    'row 1 is chat messages and rows 0, 2 are plain text'
    >>> mixed_kinds(["2+2=", "3+3="]) is None
    True
    """
    chat = [i for i, p in enumerate(prompts) if isinstance(p, list)]
    text = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    if not chat or not text:
        return None
    few, many = sorted([(chat, "chat messages"), (text, "plain text")], key=lambda kind: len(kind[0]))

    def rows(indices: list[int]) -> str:
        shown = ", ".join(map(str, indices[:10])) + (f" (and {len(indices) - 10} more)" if len(indices) > 10 else "")
        return f"row{'s' if len(indices) > 1 else ''} {shown} {'are' if len(indices) > 1 else 'is'}"

    return f"{rows(few[0])} {few[1]} and {rows(many[0])} {many[1]}"


def prompt_characters(data: Dataset, column: str) -> list[int]:
    """[rows] characters of each row's prompt (its messages' text together): what tokenizing it will cost."""
    feature = data.features.get(column)
    if getattr(feature, "dtype", None) in ("string", "large_string"):
        import pyarrow.compute as pc

        return pc.utf8_length(data.data.column(column)).fill_null(0).to_pylist()
    return [_characters(prompt) for prompt in data[column]]


def _characters(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m["content"]) for m in prompt if isinstance(m, dict) and isinstance(m.get("content"), str))


Message = dict[str, str]


def as_chat(prompt: Any, system_prompt: str | None, few_shot: list[Message] | None) -> Any:
    """The prompt with the system message and few-shot turns in front, as chat messages.

    A plain-text prompt becomes the user message (as open-r1 does), so the tokenizer's chat template formats
    all of it; without a system prompt or few-shot turns it stays plain text. A chat prompt's own system
    message is kept (``system_prompt`` does not replace it); few-shot turns go after it.

    >>> as_chat("2+2=", "Be brief.", [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}])
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '1+1='}, \
{'role': 'assistant', 'content': '2'}, {'role': 'user', 'content': '2+2='}]
    """
    if system_prompt is None and not few_shot:
        return prompt
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    system = messages[:1] if messages and messages[0].get("role") == "system" else []
    if not system and system_prompt is not None:
        system = [{"role": "system", "content": system_prompt}]
    rest = messages[1:] if messages and messages[0].get("role") == "system" else messages
    return [*system, *(few_shot or []), *rest]


def check_few_shot(few_shot: list[Message] | None) -> None:
    for i, turn in enumerate(few_shot or []):
        if not isinstance(turn, dict) or set(turn) != {"role", "content"} or turn["role"] not in ("user", "assistant"):
            raise ValueError(
                f"few_shot[{i}] must be {{role: user|assistant, content: ...}}, got {turn!r}: "
                "few-shot turns are example user questions and assistant answers"
            )


def held_out_size(val_size: int | float | None, n: int) -> int:
    """Rows to hold out of ``n`` training rows: ``val_size`` rows, a fraction of them, or by default 5% (at
    least 1, at most 500); always leaving one to train on."""
    if val_size is None:
        size = min(max(1, round(0.05 * n)), 500)
    elif isinstance(val_size, float) and 0 < val_size < 1:
        size = max(1, round(val_size * n))
    else:
        size = int(val_size)
    return min(size, n - 1)
