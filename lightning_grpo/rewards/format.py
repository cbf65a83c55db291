"""Completions -> 1.0 / partial credit for following a format: reasoning tags, think tags, JSON, Python syntax.

Reads only the completion (and, for ``json_schema_reward``, an optional ``schema`` column); never the answer.
Strict variants demand the exact layout a system prompt asked for; soft variants accept the tags anywhere.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema

from lightning_grpo.rewards.text import answer_text, completion_text, extract_code

_STRICT_REASONING = re.compile(r"^<reasoning>\n.+?\n</reasoning>\n<answer>\n.+?\n</answer>\n?$", re.DOTALL)
_SOFT_REASONING = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
_STRICT_THINK = re.compile(r"^<think>\n.*?\S.*?\n</think>\n+\S.*$", re.DOTALL)
_JSON_BLOCK = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_REASONING_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")


def _each(completions: list[Any], test: Callable[[str], bool]) -> list[float | None]:
    return [float(test(completion_text(c))) for c in completions]


def _once(text: str, tags: Sequence[str]) -> bool:
    return all(text.count(tag) == 1 for tag in tags)


def strict_reasoning_format_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 for exactly ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>`` and nothing else.

    >>> strict_reasoning_format_reward(["<reasoning>\\n3+4\\n</reasoning>\\n<answer>\\n7\\n</answer>\\n",
    ...                                 "<reasoning>3+4</reasoning><answer>7</answer>"])
    [1.0, 0.0]
    """
    return _each(completions, lambda text: _once(text, _REASONING_TAGS) and bool(_STRICT_REASONING.match(text)))


def soft_reasoning_format_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where ``<reasoning>...</reasoning>`` is followed by ``<answer>...</answer>``, anywhere, any spacing.

    >>> soft_reasoning_format_reward(["Sure. <reasoning>3+4</reasoning> <answer>7</answer>", "<answer>7</answer>"])
    [1.0, 0.0]
    """
    return _each(completions, lambda text: bool(_SOFT_REASONING.search(text)))


def strict_think_format_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 for ``<think>\\n<reasoning>\\n</think>\\n<answer>``: one think block first, both parts non-empty.

    >>> strict_think_format_reward(["<think>\\nhm\\n</think>\\n42", "<think>\\nhm\\n</think>\\n", "42"])
    [1.0, 0.0, 0.0]
    """
    return _each(completions, lambda text: _once(text, ("<think>", "</think>")) and bool(_STRICT_THINK.match(text)))


def soft_think_format_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where one ``</think>`` closes at most one earlier ``<think>``.

    The opening tag may be missing because chat templates of reasoning models (Qwen3, DeepSeek-R1) put
    ``<think>`` at the end of the prompt, so the completion starts inside the block.

    >>> soft_think_format_reward(["<think>hm</think>42", "hm</think>42", "<think>hm", "</think><think>"])
    [1.0, 1.0, 0.0, 0.0]
    """

    def test(text: str) -> bool:
        opened, closed = text.count("<think>"), text.count("</think>")
        return closed == 1 and (opened == 0 or (opened == 1 and text.index("<think>") < text.index("</think>")))

    return _each(completions, test)


def partial_format_reward(
    tags: Sequence[str] = ("reasoning", "answer"), trailing_penalty: float = 0.001
) -> Callable[..., list[float | None]]:
    """A reward giving partial credit per tag, so a policy far from the format still gets a gradient.

    Each opening and closing tag that appears exactly once earns ``1 / (2 * len(tags))`` (0.25 for the default
    two tags); each non-space character after the last closing tag costs ``trailing_penalty``, so the score can
    go below 0 for a completion that keeps talking after its answer.

    Args:
        tags: tag names in order, without angle brackets.
        trailing_penalty: cost per character after ``</last tag>``.

    >>> reward = partial_format_reward()
    >>> reward(["<reasoning>a</reasoning><answer>7</answer>", "<reasoning>a</reasoning>", "<answer>7</answer>ok"])
    [1.0, 0.5, 0.498]
    """
    return PartialFormatReward(tags, trailing_penalty)


class PartialFormatReward:
    """The callable ``partial_format_reward`` returns; an object rather than a closure so it pickles."""

    __name__ = "partial_format_reward"

    def __init__(self, tags: Sequence[str] = ("reasoning", "answer"), trailing_penalty: float = 0.001) -> None:
        if not tags:
            raise ValueError(f"tags must name at least one tag, got {tags!r}")
        if trailing_penalty < 0:
            raise ValueError(f"trailing_penalty must be >= 0, got {trailing_penalty}")
        self.tags, self.trailing_penalty = list(tags), trailing_penalty
        self.strings = [s for tag in tags for s in (f"<{tag}>", f"</{tag}>")]

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [self._score(completion_text(c)) for c in completions]

    def _score(self, text: str) -> float:
        credit = sum(text.count(s) == 1 for s in self.strings) / len(self.strings)
        closing = self.strings[-1]
        trailing = text.rsplit(closing, 1)[1].strip() if closing in text else ""
        return round(credit - self.trailing_penalty * len(trailing), 6)


def _json_value(text: str) -> Any:
    """The JSON in the last ```` ```json ```` block (else the final answer); raises ValueError if invalid."""
    blocks = _JSON_BLOCK.findall(text)
    source = blocks[-1] if blocks else answer_text(text)
    if not source.strip():
        raise ValueError("no JSON")
    return json.loads(source)


def _parses(text: str) -> bool:
    try:
        _json_value(text)
    except ValueError:  # json.JSONDecodeError is a ValueError
        return False
    return True


def json_valid_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where the completion (or its last ```` ```json ```` block, or its ``<answer>``) is valid JSON.

    >>> json_valid_reward(['{"a": 1}', '```json\\n[1, 2]\\n```', "{'a': 1}", ""])
    [1.0, 1.0, 0.0, 0.0]
    """
    return _each(completions, _parses)


def _validator(schema: Any) -> jsonschema.protocols.Validator:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as err:
            raise ValueError(f"schema must be a dict or a JSON string, got {schema!r:.200} ({err})") from err
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as err:
        raise ValueError(f"schema is not a valid JSON schema ({err.message}): {schema!r:.200}") from err
    return cls(schema)


def json_schema_reward(schema: dict[str, Any] | None = None) -> Callable[..., list[float | None]]:
    """A reward giving 1.0 where the completion's JSON (as in ``json_valid_reward``) conforms to a JSON schema.

    Args:
        schema: the schema every completion must follow. ``None``: each row's own ``schema`` column (a dict or
            a JSON string; a ``None`` schema scores ``None``).

    >>> reward = json_schema_reward({"type": "object", "required": ["name"]})
    >>> reward(['{"name": "Ada"}', '{"age": 36}', "not json"])
    [1.0, 0.0, 0.0]
    """
    return JsonSchemaReward(schema)


class JsonSchemaReward:
    """The callable ``json_schema_reward`` returns; an object rather than a closure so it pickles."""

    __name__ = "json_schema_reward"

    def __init__(self, schema: dict[str, Any] | None = None) -> None:
        if schema is not None:
            _validator(schema)  # a bad schema fails at configuration time, not at the first training step
        self.schema = schema  # the dict, not a validator: validators do not pickle

    def __call__(self, completions: list[Any], schema: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
        if self.schema is not None:
            validators = [_validator(self.schema)] * len(completions)
        elif schema is None:
            raise ValueError("json_schema_reward() without a schema needs a 'schema' column; the dataset has none")
        else:
            validators = [None if s is None else _validator(s) for s in schema]
        texts = [completion_text(c) for c in completions]
        return [None if v is None else _conforms(t, v) for t, v in zip(texts, validators, strict=True)]


def _conforms(text: str, validator: jsonschema.protocols.Validator) -> float:
    try:
        return float(validator.is_valid(_json_value(text)))
    except ValueError:
        return 0.0


def python_syntax_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where the completion's code (last ```` ```python ```` block, else all) is non-empty valid Python.

    Cheap shaping for code generation: compiles only, runs nothing.

    >>> python_syntax_reward(["```python\\nx = 1\\n```", "def f(:", ""])
    [1.0, 0.0, 0.0]
    """

    def parses(text: str) -> bool:
        code = extract_code(text)
        try:
            ast.parse(code)
        except (SyntaxError, ValueError):  # ValueError: null bytes in the source
            return False
        return bool(code.strip())

    return _each(completions, parses)
