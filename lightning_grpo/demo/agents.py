"""Agent programs written against the OpenAI API, as a user's would be: they know nothing of lightning_grpo.

``calculator_agent`` answers a ``lightning-grpo/tiny-mul`` row with the ``mul`` tool over several turns: it sends the
question with the tool's schema, runs every call the model makes, sends the results back, and returns the
conversation after the prompt for the reward functions. ``calculator_agent_no_tool`` is the control: the same
program without the tool.
"""

from __future__ import annotations

import json
from typing import Any

MUL_TOOL = {
    "type": "function",
    "function": {
        "name": "mul",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "the first factor"},
                "b": {"type": "integer", "description": "the second factor"},
            },
            "required": ["a", "b"],
        },
    },
}


def _run_tool(name: str, arguments: str) -> str:
    """The agent's own tool implementation; a bad call gets an error back, as an API agent would send it."""
    try:
        args = json.loads(arguments)
        if name != "mul":
            return f"error: no tool {name!r}"
        return str(int(args["a"]) * int(args["b"]))
    except (ValueError, KeyError, TypeError) as e:
        return f"error: {type(e).__name__}: {e}"


def calculator_agent(client: Any, row: dict[str, Any], tools: bool = True, max_turns: int = 3) -> list[dict]:
    """Ask, run the model's tool calls, send their results, until it answers without a call (or ``max_turns``).
    ``client`` is an ``openai.OpenAI``."""
    messages: list[dict[str, Any]] = list(row["prompt"])
    start = len(messages)
    for _ in range(max_turns):
        reply = client.chat.completions.create(
            model="policy", messages=messages, **({"tools": [MUL_TOOL]} if tools else {})
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = _run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages[start:]


def calculator_agent_no_tool(client: Any, row: dict[str, Any]) -> list[dict]:
    """The control: the same program, no tool offered."""
    return calculator_agent(client, row, tools=False)
