"""ToolUseAlert on real runs of the tool engine: a model that never writes a call, and calls that all fail."""

from __future__ import annotations

import json

import pytest
from helpers import fit, logged, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import ToolUseAlert
from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE
from lightning_grpo.engines import ToolCall, ToolCalling


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


class NoCalls:
    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, []


class CallsWithoutB:
    """Reads every completion as a call of ``add`` without its second argument: each call fails when run."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, [ToolCall("add", {"a": 1})]


@pytest.fixture(scope="module")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-tools-alert")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "train.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"{a}+1="}], "answer": str(a + 1)} for a in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_alert_warns_when_the_tools_are_never_called(tool_model_dir, chat_jsonl, tmp_path):
    engine = ToolCalling(tools=[add], parser=NoCalls(), max_tool_calling_iterations=1)
    module = make_module(tool_model_dir, rollout_engine=engine, sampling={"max_completion_length": 6})
    with pytest.warns(UserWarning, match="has not written one tool call.*demo.anytool"):
        fit(module, PromptDataModule(chat_jsonl, batch_size=2), tmp_path, max_steps=2, callbacks=[ToolUseAlert(2)])


def test_the_alert_warns_when_every_call_fails(tool_model_dir, chat_jsonl, tmp_path):
    engine = ToolCalling(tools=[add], parser=CallsWithoutB(), max_tool_calling_iterations=1)
    module = make_module(tool_model_dir, rollout_engine=engine, sampling={"max_completion_length": 6})
    # patience 1: a step whose turns all ran out of tokens before ending has no call at all ("never called")
    with pytest.warns(UserWarning, match=r"every tool call failed \(add\).*samples.jsonl"):
        fit(module, PromptDataModule(chat_jsonl, batch_size=2), tmp_path, max_steps=3, callbacks=[ToolUseAlert(1)])


@pytest.fixture(scope="module")
def half_warm_model(tmp_path_factory):
    """A model that begins calls but cannot write them: 80 warm-start steps (``demo.anytool``) at call rate 0.9."""
    from lightning_grpo.demo.anytool import write_tool_model

    path = tmp_path_factory.mktemp("half-warm")
    write_tool_model(path, [add], steps=80, call_rate=0.9)
    return str(path)


def test_a_call_the_parser_cannot_read_is_counted_malformed():
    from lightning_grpo.engines import HermesParser
    from lightning_grpo.engines.multiturn.calls import run_call
    from lightning_grpo.engines.multiturn.episodes import EpisodeStats

    calls = HermesParser().parse('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')[1]
    calls += HermesParser().parse('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2')[1]
    results = [run_call(c, {"add": add}, None) for c in calls]
    assert [r.failed for r in results] == [False, True] and [r.malformed for r in results] == [False, True]
    episode = type("Episode", (), {"turns": 2, "ended": "answer", "results": results, "unparsed": 0})
    metrics = EpisodeStats.of([episode]).metrics()
    assert metrics["tools/malformed_frequency"] == 0.5 and metrics["tools/failure_frequency"] == 0.5


def test_the_alert_warns_when_the_calls_made_cannot_be_read(half_warm_model, tmp_path):
    """A real run of a model that begins calls it cannot finish: the calls are made (call_frequency > 0), so
    "never called" stays silent; the malformed share fires, naming its rate."""
    from lightning_grpo.demo.anytool import user_message

    data = tmp_path / "train.jsonl"
    prompts = [[{"role": "user", "content": user_message({"a": a, "b": 3})}] for a in range(8)]
    rows = [{"prompt": prompt, "answer": str(a + 3)} for a, prompt in enumerate(prompts)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    engine = ToolCalling(tools=[add], max_tool_calling_iterations=1)
    module = make_module(half_warm_model, rollout_engine=engine, sampling={"max_completion_length": 16})
    with pytest.warns(UserWarning, match=r"malformed_frequency = .*could not be read.*--steps") as caught:
        trainer = fit(
            module, PromptDataModule(str(data), batch_size=2), tmp_path, max_steps=2, callbacks=[ToolUseAlert(2)]
        )
    metrics = logged(trainer)
    assert min(metrics["train/tools/call_frequency"]) > 0 and min(metrics["train/tools/malformed_frequency"]) >= 0.5
    assert not any("has not written one tool call" in str(w.message) for w in caught)


def test_max_malformed_is_a_share():
    with pytest.raises(ValueError, match=r"max_malformed must be a share of calls in \(0, 1\], got 1.5"):
        ToolUseAlert(max_malformed=1.5)


def test_turns_that_look_like_calls_but_read_as_none_fire_the_alert():
    """Llama-format calls from a model whose template is Qwen's: counted as unparsed by the engine; the alert reads
    the share, whether or not other calls were made."""
    from types import SimpleNamespace

    alert = ToolUseAlert(max_unparsed=0.25)
    step = {"tools/call_frequency": 0.0, "tools/failure_frequency": 0.0, "tools/unparsed_frequency": 0.5}
    record = SimpleNamespace(rollout=SimpleNamespace(metrics=step))
    signals = {s.name: s for s in alert.signals(None, record)}
    assert (
        signals["tools/unparsed_frequency"].value == 0.5
        and "tool_families.md" in signals["tools/unparsed_frequency"].advice
    )
    record.rollout.metrics = {**step, "tools/unparsed_frequency": 0.2}
    assert "tools/unparsed_frequency" not in {s.name for s in alert.signals(None, record)}
    with pytest.raises(ValueError, match=r"max_unparsed must be a share of model turns in \(0, 1\], got 0"):
        ToolUseAlert(max_unparsed=0)
