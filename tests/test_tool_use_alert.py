"""ToolUseAlert on real runs of the tool engine: a model that never writes a call, and calls that all fail."""

from __future__ import annotations

import json

import pytest

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import ToolUseAlert
from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE
from lightning_grpo.engines import ToolCall, ToolCalling
from tests.helpers import fit, make_module


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
