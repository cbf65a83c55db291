"""Completions in either format -> the plain text reward functions read (``completion_text``, from ``types``: the
callbacks show the same text), the final answer and the code block in it. Knows message formats, not scoring.
"""

from __future__ import annotations

import re

from lightning_grpo.types import completion_text

__all__ = ["answer_text", "completion_text", "extract_code"]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CODE_BLOCK = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


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
