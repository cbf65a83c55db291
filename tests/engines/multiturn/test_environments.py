"""Environments (TRL's ``environment_factory``): a known trajectory, rewards, per-row choice; and ``rollout_func``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_grpo.engines import RolloutFunction, environment_reward
from lightning_grpo.engines.config import SamplingConfig
from tests.engines.multiturn.test_tool_calling import Scripted, add, fake_policy


class Counter:
    """A counter the model must bring to a target: stateful, one instance per rollout."""

    def __init__(self):
        self.value, self.target, self.resets = 0, 0, 0

    def reset(self, start: int, target: int, **kwargs) -> str:
        self.value, self.target = start, target
        self.resets += 1
        return f" (counter at {start})"

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: how much to add
        """
        self.value += by
        return str(self.value)

    def get_reward(self) -> float:
        return float(self.value == self.target)


class Echo:
    """A second environment with no reward and a different tool."""

    def reset(self, **kwargs) -> None:
        return None

    def echo(self, text: str) -> str:
        """Repeat the text.

        Args:
            text: what to repeat
        """
        return text


def inc(by):
    return (f'<tool_call>{{"name": "increment", "arguments": {{"by": {by}}}}}</tool_call>', True)


SCRIPT = {
    "count (counter at 1)": [inc(2), inc(3), ("done", True)],  # 1 -> 3 -> 6
    "count (counter at 4)": [inc(1), ("done", True)],  # 4 -> 5
    "say": [('<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>', True), ("hi", True)],
}


def play(engine, rows, num_generations=1):
    prompts = [[{"role": "user", "content": r.pop("text")}] for r in rows]
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    return engine.generate(
        fake_policy(), prompts, num_generations, SamplingConfig(max_completion_length=500), False, columns=columns
    )


def test_environment_episode_follows_its_trajectory():
    engine = Scripted(SCRIPT, environment_factory=Counter, tools=[add])
    assert [s["function"]["name"] for s in engine.environments.schemas[None]] == ["increment"]
    rollout = play(engine, [{"text": "count", "start": 1, "target": 6}, {"text": "count", "start": 4, "target": 6}])
    assert rollout.prompts[0] == [{"role": "user", "content": "count (counter at 1)"}]  # reset's text appended
    replies = [[m["content"] for m in c if m["role"] == "tool"] for c in rollout.completions]
    assert replies == [["3", "6"], ["5"]]
    assert rollout.columns["environment_reward"] == [1.0, 0.0]
    assert environment_reward(rollout.completions, **rollout.columns) == [1.0, 0.0]
    assert rollout.metrics["rewards/Counter/mean"] == 0.5
    assert rollout.metrics["turns/mean"] == 2.5 and rollout.metrics["tools/call_frequency"] == 1.5
    pool = engine.environments.pool[None]
    assert len(pool) == 2 and rollout.columns["environments"] == pool  # one instance per rollout
    play(engine, [{"text": "count", "start": 1, "target": 6}])
    assert len(pool) == 2 and pool[0].resets == 2  # reused next step, reset again


def test_environment_per_row_from_the_environment_column():
    engine = Scripted(SCRIPT, environment_factory={"counter": Counter, "echo": Echo})
    rollout = play(
        engine,
        [
            {"text": "count", "start": 4, "target": 5, "environment": "counter"},
            {"text": "say", "start": 0, "target": 0, "environment": "echo"},
        ],
    )
    assert rollout.columns["environment_reward"] == [1.0, None]
    assert rollout.completions[1][-1]["content"] == "hi" and rollout.metrics["tools/failure_frequency"] == 0.0
    with pytest.raises(ValueError, match=r"'environment' column holds 'chess'.*expected one of \['counter', 'echo'\]"):
        play(engine, [{"text": "say", "start": 0, "target": 0, "environment": "chess"}])


def test_environment_without_reset_is_refused():
    with pytest.raises(ValueError, match="environment_factory: Echoless must define a callable reset"):
        Scripted(SCRIPT, environment_factory=type("Echoless", (), {}))


def fixed_rollout(prompts, context):
    """Two completions per prompt; the second has a 2-token observation the model did not write."""
    tokenizer = context.policy.tokenizer
    eos, ids = tokenizer.eos_token_id, tokenizer("ab")["input_ids"]
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": None, "env_mask": [], "extra": []}
    for i, _ in enumerate(prompts):
        for g in range(context.num_generations):
            out["prompt_ids"].append([5, 6, 7][: i + 2])
            out["completion_ids"].append(ids + ids + [eos] if g else ids + [eos])
            out["env_mask"].append([1, 1, 0, 0, 1] if g else [1, 1, 1])
            out["extra"].append(f"{i}-{g}")
    return out


def test_rollout_func_semantics():
    rollout = RolloutFunction(fixed_rollout).generate(fake_policy(), ["p", "q"], 2, SamplingConfig(), False)
    assert rollout.prompt_mask.tolist() == [[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert rollout.completion_mask.tolist()[:2] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert rollout.tool_mask[1].tolist() == [1, 1, 0, 0, 1] and rollout.completions[1] == "abab"
    assert rollout.columns == {"extra": ["0-0", "0-1", "1-0", "1-1"]} and rollout.sampling_logps is None
    assert not rollout.is_truncated.any()
    with pytest.raises(ValueError, match=r"must return the keys .* \['logprobs'\] missing"):
        RolloutFunction(lambda p, c: {"prompt_ids": [], "completion_ids": []}).generate(
            fake_policy(), ["p"], 2, SamplingConfig(), False
        )
    two_each = RolloutFunction(lambda p, c: fixed_rollout(p, SimpleNamespace(**{**vars(c), "num_generations": 2})))
    with pytest.raises(ValueError, match=r"num_generations \(3\) completions per prompt, 6 in all, got 4"):
        two_each.generate(fake_policy(), ["p", "q"], 3, SamplingConfig(), False)
    assert torch.equal(rollout.model_mask[1], torch.tensor([1, 1, 0, 0, 1]))
