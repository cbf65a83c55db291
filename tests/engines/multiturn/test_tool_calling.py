"""Tool schemas, tool-call parsing and execution, the multi-turn loop with scripted turns, and its validation."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from types import SimpleNamespace

import pytest
import torch

from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE, build_tokenizer
from lightning_grpo.engines import HermesParser, ToolCall, ToolCalling
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.multiturn.calls import run_call, tool_schema
from lightning_grpo.engines.multiturn.episodes import EpisodeStats, check_tool_template, tool_suffix_ids
from lightning_grpo.model.policy import Policy


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def boom(x: str) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError(f"cannot handle {x}")


def hang(x: str) -> str:
    """Never returns in time.

    Args:
        x: anything
    """
    time.sleep(5)
    return x


async def slow_echo(x: str) -> str:
    """Echo, asynchronously.

    Args:
        x: the text
    """
    await asyncio.sleep(0.01)
    return x


def no_docstring(a: int) -> int:
    return a


def no_hints(a):
    """Has no type hints.

    Args:
        a: a value
    """
    return a


TOOLS = {"add": add, "boom": boom, "hang": hang, "slow_echo": slow_echo}


def tool_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


# ---- schemas and validation -------------------------------------------------------------------------------


def test_schema_from_signature_and_docstring():
    schema = tool_schema(add)
    assert schema["function"]["name"] == "add"
    assert schema["function"]["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "the first integer",
    }
    assert schema["function"]["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tools": [no_docstring]}, "'no_docstring' cannot be described"),
        ({"tools": [no_hints]}, "'no_hints' cannot be described"),
        ({"tools": [42]}, "tools must hold callables"),
        ({"tools": ["lightning_grpo.nowhere.tool"]}, "cannot import 'lightning_grpo.nowhere.tool'"),
        ({"tools": [add], "max_tool_calling_iterations": 0}, "max_tool_calling_iterations must be an int >= 1, got 0"),
        ({"tools": [add], "tool_timeout": 0}, "tool_timeout must be > 0"),
        ({}, "needs tools"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ToolCalling(**kwargs)


def test_tools_by_import_path():
    engine = ToolCalling(tools=["tests.engines.multiturn.test_tool_calling.add"])
    assert engine.tools[0](2, 3) == 5 and [s["function"]["name"] for s in engine.schemas] == ["add"]


def test_template_without_tool_support_is_refused():
    check_tool_template(tool_tokenizer(), [tool_schema(add)])
    with pytest.raises(ValueError, match="has no tool support"):
        check_tool_template(build_tokenizer(), [tool_schema(add)])


# ---- parsing and execution --------------------------------------------------------------------------------


def test_parse_well_formed_calls():
    text = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    text += '<tool_call>{"name": "slow_echo", "arguments": "{\\"x\\": \\"hi\\"}"}</tool_call>'
    content, calls = HermesParser().parse(text)
    assert content == "Let me add."
    assert calls == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("slow_echo", {"x": "hi"})]
    assert HermesParser().parse("The answer is 5") == ("The answer is 5", [])


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "add", "arguments": {"a": 2,', "not valid JSON"),  # unclosed block, truncated JSON
        ('{"name": "add", "arguments": {"a": 2}</tool_call>', "not valid JSON"),
        ('["add", 2, 3]</tool_call>', "a tool call must be"),
        ('{"name": "add", "arguments": [2, 3]}</tool_call>', "arguments must be a JSON object"),
    ],
)
def test_malformed_calls_become_error_replies(body, error):
    _, calls = HermesParser().parse("<tool_call>" + body)
    result = run_call(calls[0], TOOLS, timeout=1.0)
    assert result.failed and error in result.content and result.content.startswith("{'error': ")


def test_execution_results_and_failures():
    ok = run_call(ToolCall("add", {"a": 2, "b": 3}), TOOLS, 1.0)
    assert (ok.content, ok.failed) == ("5", False)
    assert ok.message() == {"role": "tool", "name": "add", "content": "5"}
    assert run_call(ToolCall("slow_echo", {"x": "hi"}), TOOLS, 1.0).content == "hi"  # async tool
    unknown = run_call(ToolCall("mul", {"a": 1}), TOOLS, 1.0)
    assert unknown.failed and "Tool mul not found" in unknown.content
    wrong = run_call(ToolCall("add", {"a": 1, "c": 2}), TOOLS, 1.0)
    assert wrong.failed and "TypeError" in wrong.content
    raised = run_call(ToolCall("boom", {"x": "it"}), TOOLS, 1.0)
    assert raised.failed and "RuntimeError: cannot handle it" in raised.content
    start = time.perf_counter()
    hung = run_call(ToolCall("hang", {"x": "it"}), TOOLS, 0.2)
    assert hung.failed and "timed out after 0.2 s" in hung.content and time.perf_counter() - start < 2


def test_tool_suffix_is_the_reply_and_next_header():
    tokenizer = tool_tokenizer()
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "add", "content": "5"}])
    assert tokenizer.decode(suffix) == "<|tool|>5<eos><|assistant|>"


# ---- the loop, with scripted turns ------------------------------------------------------------------------


class Scripted(ToolCalling):
    """The model's turns come from a script keyed by the last prompt message and the turn number."""

    def __init__(self, script, **kw):
        super().__init__(**kw)
        self.script, self.calls = script, 0

    def _generate_turn(self, policy, episodes, sampling, greedy, dummy):
        self.calls += 1
        out = []
        for e in episodes:
            text, end = self.script[e.prompt[-1]["content"]][e.turns]
            ids = policy.tokenizer(text)["input_ids"] + ([policy.tokenizer.eos_token_id] if end else [])
            out.append(ids[: e.budget])
        return out


def fake_policy():
    tokenizer = tool_tokenizer()
    policy = SimpleNamespace(
        tokenizer=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        device=torch.device("cpu"),
        synced_generation=False,
        generating=contextlib.nullcontext,
        model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=100_000)),
    )
    policy.ranks_max = functools.partial(Policy.ranks_max, policy)  # one process: the values as given
    return policy


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
SCRIPT = {
    "2+3?": [(CALL, True), ("5", True)],  # one call, then the answer
    "hi": [("hello", True)],  # no call
    "loop": [(CALL, True)] * 10,  # calls forever: cut by max_tool_calling_iterations
    "bad": [('<tool_call>{"name": "add"', True), ("sorry", True)],  # malformed, then an answer
}


def run_script(prompts, **kw):
    engine = Scripted(SCRIPT, tools=[add], **kw)
    policy = fake_policy()
    chats = [[{"role": "user", "content": p}] for p in prompts]
    rollout = engine.generate(policy, chats, 1, SamplingConfig(max_completion_length=kw.pop("budget", 1000)), False)
    return rollout, policy.tokenizer, engine


def test_episode_mask_and_messages():
    rollout, tokenizer, engine = run_script(["2+3?", "hi"])
    ids, mask, tool = rollout.completion_ids[0], rollout.completion_mask[0], rollout.tool_mask[0]
    written = tokenizer.decode(ids[(tool * mask).bool()])
    not_written = tokenizer.decode(ids[((1 - tool) * mask).bool()])
    assert written == CALL + "<eos>5<eos>"
    assert not_written == "<|tool|>5<eos><|assistant|>"
    assert tokenizer.decode(ids[mask.bool()]) == CALL + "<eos><|tool|>5<eos><|assistant|>5<eos>"
    assert rollout.completions[0] == [
        {"role": "assistant", "content": "", "tool_calls": [ToolCall("add", {"a": 2, "b": 3}).message()]},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    assert rollout.completions[1] == [{"role": "assistant", "content": "hello"}]
    assert rollout.tool_mask[1][rollout.completion_mask[1].bool()].all()  # single turn: the model wrote all
    assert engine.calls == 2  # turn 1 for both episodes in one call, turn 2 for the one still playing
    assert rollout.metrics["turns/mean"] == 1.5 and rollout.metrics["tools/call_frequency"] == 0.5
    assert rollout.metrics["tools/failure_frequency"] == 0.0 and not rollout.is_truncated.any()


def test_turn_limit_and_failures_are_counted():
    rollout, _, _ = run_script(["loop", "bad"], max_tool_calling_iterations=2)
    assert [len(c) for c in rollout.completions] == [5, 3]  # call, reply, call, reply, call (not run)
    m = rollout.metrics
    assert m["episodes/truncated_by_turns"] == 0.5 and m["turns/max"] == 3.0
    assert m["tools/call_frequency"] == 1.5 and m["tools/failure_frequency"] == pytest.approx(1 / 3)
    assert m["tools/unknown/failure_frequency"] == 1.0 and m["tools/add/failure_frequency"] == 0.0
    assert "not valid JSON" in rollout.completions[1][1]["content"]


def test_token_budget_counts_every_model_token():
    budget = len(CALL) + 1 + 3  # the first turn and its EOS, then 3 tokens of the second
    engine = Scripted(SCRIPT, tools=[add])
    policy = fake_policy()
    rollout = engine.generate(
        policy, [[{"role": "user", "content": "loop"}]], 1, SamplingConfig(max_completion_length=budget), False
    )
    assert int((rollout.tool_mask * rollout.completion_mask).sum()) == budget
    assert rollout.is_truncated.tolist() == [True] and rollout.metrics["episodes/truncated_by_tokens"] == 1.0


def test_calls_to_made_up_names_share_one_metric_key():
    """A model under RL writes names no tool has (guessL, guuess ...): each would become a metric key that loggers
    keep for the whole run. They count under tools/unknown; a real tool called with bad arguments keeps its own."""
    tools = {"mul": lambda a, b: a * b}
    calls = [
        ToolCall("mul", {"a": 2, "b": 3}),
        ToolCall("guessL", {}),
        ToolCall("guuess", {"x": 1}),
        ToolCall("mul", error="arguments must be a JSON object, got 3"),
        ToolCall("unknown", error="the tool call is not valid JSON"),
    ]
    episode = SimpleNamespace(turns=2, ended="answer", unparsed=0, results=[run_call(c, tools, None) for c in calls])
    metrics = EpisodeStats.of([episode]).metrics()
    per_tool = sorted(k for k in metrics if k.startswith("tools/") and k.count("/") == 2)
    assert per_tool == ["tools/mul/failure_frequency", "tools/unknown/failure_frequency"]
    assert metrics["tools/mul/failure_frequency"] == 0.5 and metrics["tools/unknown/failure_frequency"] == 1.0
    assert metrics["tools/call_frequency"] == 5.0 and metrics["tools/failure_frequency"] == 0.8
