"""What a prompt and a completion are as text: ``Prompt`` (plain text or chat messages) and the text a reward
or a log line reads of any completion."""

from __future__ import annotations

from typing import Any

Prompt = str | list[dict[str, Any]]  # plain text, or chat messages [{"role": ..., "content": ...}]


def completion_text(completion: Any) -> str:
    """Text of a plain-text completion or of a chat completion ``[{"role": "assistant", "content": ...}]``, whose
    content is a string or a list of parts (``[{"type": "text", "text": ...}]``). Anything else reads as ``""``, so
    a malformed completion scores (and is shown) like an empty one instead of crashing a training step.

    >>> completion_text([{"role": "assistant", "content": "hi"}]), completion_text("hi"), completion_text(None)
    ('hi', 'hi', '')
    """
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, list):
        last = completion[-1] if completion else None
        return _content_text(last.get("content")) if isinstance(last, dict) else ""
    return completion if isinstance(completion, str) else ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
