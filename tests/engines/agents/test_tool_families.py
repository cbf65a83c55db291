"""The agent endpoint on a model of another family than Qwen: a tiny model with Llama 3.2's chat template, its
calls written in Llama's format, answered to the real ``openai`` client as OpenAI ``tool_calls``."""

from __future__ import annotations

import json

import pytest
from helpers import write_tiny_llama

from lightning_grpo.engines import HFGenerate, OpenAIAgent
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.multiturn.calls import tool_schema
from lightning_grpo.engines.multiturn.episodes import tool_suffix_ids
from lightning_grpo.model.policy import Policy

pytest.importorskip("openai")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


SEEN: list = []  # what the agents got back: (tool name, arguments, finish reason), then the last reply's text


class LlamaTurns(HFGenerate):
    """Samples as a Llama 3.2 checkpoint would: a call in Llama's format, then the answer."""

    def complete(self, policy, contexts, budgets, sampling, greedy):
        tokenizer, eos = policy.tokenizer, policy.tokenizer.eos_token_id
        shown = "<|start_header_id|>ipython<|end_header_id|>"  # a tool reply was shown: answer it
        answered = [shown in tokenizer.decode(c) for c in contexts]
        turns = ["5" if done else '{"name": "add", "parameters": {"a": 2, "b": 3}}' for done in answered]
        return [(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos], None) for t in turns]


def calling_agent(client, row):
    tools = [tool_schema(add)]
    messages = list(row["prompt"])
    reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)
    call = reply.choices[0].message.tool_calls[0]
    SEEN.append((call.function.name, json.loads(call.function.arguments), reply.choices[0].finish_reason))
    messages += [reply.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": str(add(**json.loads(call.function.arguments)))}]
    reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)
    SEEN.append(reply.choices[0].message.content)
    return 1.0


def test_the_endpoint_answers_a_llama_call_as_openai_tool_calls(tmp_path):
    policy = Policy(write_tiny_llama(tmp_path))
    engine = OpenAIAgent(calling_agent, timeout=60, on_error="raise", sampler=LlamaTurns())
    try:
        rollout = engine.generate(
            policy, [[{"role": "user", "content": "What is 2+3?"}]], 1, SamplingConfig(max_prompt_length=None), False
        )
    finally:
        engine.teardown()
    assert SEEN == [("add", {"a": 2, "b": 3}, "tool_calls"), "5"]
    ids, mask, written = rollout.completion_ids[0], rollout.completion_mask[0].bool(), rollout.tool_mask[0].bool()
    reply = [{"role": "tool", "name": "add", "content": "5"}]
    assert ids[mask & ~written].tolist() == tool_suffix_ids(policy.tokenizer, reply)  # Llama's ipython turn
    assert rollout.metrics["tools/call_frequency"] == 1.0 and rollout.metrics["tools/unparsed_frequency"] == 0.0
