"""Tools as callables -> JSON schemas, model text -> tool calls, tool calls -> tool messages.

Knows Python callables and the Hermes/Qwen ``<tool_call>{json}</tool_call>`` format; nothing about models or
rollouts. Every failure (malformed JSON, an unknown tool, wrong arguments, an exception, a timeout) becomes an
error string the model reads as the tool's reply, as TRL 1.16 does (``{'error': '...'}``): never a crash.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning_grpo.deadline import DeadlineExceeded, run_on_thread


@dataclass
class ToolCall:
    """One call the model asked for; ``error`` is set when it could not be read (the call is not run)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def message(self) -> dict[str, Any]:
        """The ``tool_calls`` entry of the assistant message, as chat templates expect it; a call that could not be
        read keeps why (templates ignore the key; the sample log shows it)."""
        entry: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return entry if self.error is None else {**entry, "error": self.error}


@dataclass
class ToolResult:
    name: str
    content: str
    failed: bool
    known: bool = True  # the call names a tool of the episode (metrics count any other name under UNKNOWN_TOOL)
    malformed: bool = False  # the call could not be read (``ToolCall.error``): it was not run

    def message(self) -> dict[str, Any]:
        return {"role": "tool", "name": self.name, "content": self.content}


class HermesParser:
    """Hermes/Qwen2.5/Qwen3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Any object with ``parse(text) -> (content, calls)`` can replace it (``parser:`` in YAML).
    """

    pattern = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The text without its tool-call blocks, and the calls in order.

        >>> HermesParser().parse('ok<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        ('ok', [ToolCall(name='add', arguments={'a': 1}, error=None)])
        """
        calls = [_read_call(body) for body in self.pattern.findall(text)]
        return self.pattern.sub("", text).strip(), calls


def _read_call(body: str) -> ToolCall:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("unknown", error=f"the tool call is not valid JSON ({e.msg}): {body.strip()[:200]}")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall("unknown", error=f'a tool call must be {{"name": ..., "arguments": {{...}}}}, got {body[:200]}')
    return call_of(data["name"], data.get("arguments", {}))


def call_of(name: str, arguments: Any) -> ToolCall:
    """A call by name with its arguments, given as an object or as a JSON string of one (some models and families
    write them so); anything else is an unreadable call."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f"arguments must be a JSON object, got {arguments!r}")
    return ToolCall(name, arguments)


def resolve_tool(tool: Callable | str, setting: str = "tools") -> Callable:
    """A callable, or its import path (``package.module.function``) as YAML gives it."""
    if isinstance(tool, str):
        module, _, name = tool.rpartition(".")
        try:
            tool = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(
                f"{setting}: cannot import {tool!r} ({e}); give a callable or 'package.module.name'"
            ) from e
    if not callable(tool):
        raise ValueError(f"{setting} must hold callables or their import paths, got {tool!r} ({type(tool).__name__})")
    return tool


def tool_schema(tool: Callable, setting: str = "tools") -> dict[str, Any]:
    """The JSON schema the chat template shows the model, from the signature and Google-style docstring
    (``transformers.utils.get_json_schema``, as TRL does); a tool it cannot describe is refused here."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(tool)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException: both name the problem
        name = getattr(tool, "__name__", repr(tool))
        raise ValueError(
            f"{setting}: tool {name!r} cannot be described to the model: {e}. A tool needs type hints on every "
            "argument and a Google-style docstring with a description and an 'Args:' entry per argument"
        ) from e


def run_call(call: ToolCall, tools: dict[str, Callable], timeout: float | None) -> ToolResult:
    """Run one call (sync or async) on a daemon thread; an overdue call is abandoned, not killed."""
    if call.error is not None:
        return _failure(call.name, call.error, call.name in tools, malformed=True)
    if call.name not in tools:
        return _failure(call.name, f"Tool {call.name} not found. Available tools: {sorted(tools)}", known=False)

    def invoke() -> Any:
        result = tools[call.name](**call.arguments)
        return asyncio.run(result) if inspect.iscoroutine(result) else result

    try:
        value = run_on_thread(invoke, timeout, f"tool-{call.name}")
    except DeadlineExceeded:
        return _failure(call.name, f"Tool {call.name} timed out after {timeout} s")
    except Exception as e:  # the model reads it and may correct its call
        return _failure(call.name, f"{type(e).__name__}: {e}")
    return ToolResult(call.name, str(value), failed=False)


def _failure(name: str, message: str, known: bool = True, malformed: bool = False) -> ToolResult:
    return ToolResult(name, str({"error": message}), failed=True, known=known, malformed=malformed)
