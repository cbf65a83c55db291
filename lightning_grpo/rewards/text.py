"""Completions in either format -> the plain text reward functions read. Knows message formats, not scoring.

A completion is a string, or chat messages ``[{"role": "assistant", "content": ...}]`` whose content is a string
or a list of parts (``[{"type": "text", "text": ...}]``). Anything else reads as ``""``, so a malformed
completion scores like an empty one instead of crashing a training step.
"""

from __future__ import annotations

import re
from typing import Any

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CODE_BLOCK = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def completion_text(completion: Any) -> str:
    """Text of a plain-text completion or of a chat completion ``[{"role": "assistant", "content": ...}]``.

    >>> completion_text([{"role": "assistant", "content": "hi"}]), completion_text("hi"), completion_text(None)
    ('hi', 'hi', '')
    """
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, list):
        last = completion[-1] if completion else None
        return _content_text(last.get("content")) if isinstance(last, dict) else ""
    return completion if isinstance(completion, str) else ""


def answer_text(text: str) -> str:
    """The final answer of a completion: inside the last ``<answer>`` tag, else after ``</think>``, else all.

    >>> answer_text("<reasoning>3+4</reasoning><answer> 7 </answer>"), answer_text("<think>hm</think>\\n42")
    (' 7 ', '\\n42')
    """
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1]
    return text.rsplit("</think>", 1)[-1]


def extract_code(text: str) -> str:
    """The last ```` ```python ```` fenced block of ``text``, or the whole text when there is none.

    The last block is the model's final program; earlier ones are usually drafts or usage examples.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    """
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else text
