"""The tool engine on the real tiny model: real generate over several turns, a real Trainer.fit, and resume.

The tiny model has random weights and never writes ``<tool_call>``, so a test parser reads a call from every
turn whose text has an even number of characters: episodes then have different numbers of turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import fit, length_reward, logged, make_module
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import CompletionSampleLogger
from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE
from lightning_grpo.engines import ToolCall, ToolCalling
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


class EvenLengthParser:
    """A call to ``add(len(text), 1)`` whenever the turn's text has an even length."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, [ToolCall("add", {"a": len(text), "b": 1})] if len(text) % 2 == 0 else []


def last_answer_reward(completions, answer, **kwargs):
    return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]


@pytest.fixture(scope="module")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-tools")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    teach_short_turns(model, tokenizer)
    model.save_pretrained(path)
    return str(path)


def teach_short_turns(model, tokenizer, steps=60):
    """A few steps of next-token training on turns of 1-3 random digits then EOS, first and after a tool reply:
    the random model otherwise rarely emits EOS, and every episode would end at the token budget."""
    gen = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        texts = []
        for a in range(8):
            chat = [{"role": "user", "content": f"{a % 4}+1="}]
            digits = [
                "".join(str(int(d)) for d in torch.randint(0, 10, (int(n),), generator=gen))
                for n in torch.randint(1, 4, (2,), generator=gen)
            ]
            prompt = tokenizer.apply_chat_template(chat, tools=[add], add_generation_prompt=True, tokenize=False)
            texts.append(f"{prompt}{digits[0]}<eos><|tool|>{a}<eos><|assistant|>{digits[1]}<eos>")
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "train.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a in range(4) for b in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def engine(**kw):
    return ToolCalling(tools=[add], parser=EvenLengthParser(), max_tool_calling_iterations=3, **kw)


def test_real_generation_over_several_turns(tool_model_dir):
    policy = Policy(tool_model_dir)
    prompts = [[{"role": "user", "content": f"{a}+1="}] for a in range(4)]
    torch.manual_seed(0)
    rollout = engine().generate(policy, prompts, 4, SamplingConfig(max_completion_length=12), False)
    turns = [sum(m["role"] == "assistant" for m in c) for c in rollout.completions]
    assert len(set(turns)) > 1 and max(turns) > 1  # episodes of different lengths in one batch
    for row, completion in enumerate(rollout.completions):
        mask, tool = rollout.completion_mask[row].bool(), rollout.tool_mask[row].bool()
        assert int((mask & tool).sum()) <= 12  # the budget counts every model-written token
        replies = "".join(f"<|tool|>{m['content']}<eos><|assistant|>" for m in completion if m["role"] == "tool")
        assert policy.tokenizer.decode(rollout.completion_ids[row][mask & ~tool]) == replies
    assert rollout.metrics["turns/mean"] == pytest.approx(sum(turns) / len(turns))
    logps = policy.logps(rollout, [slice(0, len(rollout))])  # the episode conditions the log-probs
    assert logps.shape == rollout.completion_ids.shape and logps.isfinite().all()


def test_chat_template_kwargs_reach_the_prompt_and_every_tool_reply(tool_model_dir):
    policy = Policy(tool_model_dir)
    # an assistant header that depends on a template keyword, as Qwen3's enable_thinking does
    policy.tokenizer.chat_template = TOOL_CHAT_TEMPLATE.replace(
        "<|assistant|>", "<|assistant|>{% if think %}7{% endif %}"
    )
    prompts = [[{"role": "user", "content": f"{a}+1="}] for a in range(4)]
    torch.manual_seed(0)
    sampling = SamplingConfig(max_completion_length=12, chat_template_kwargs={"think": True})
    rollout = engine().generate(policy, prompts, 4, sampling, False)
    assert policy.tokenizer.decode(rollout.prompt_ids[0][rollout.prompt_mask[0].bool()]).endswith("<|assistant|>7")
    called = [row for row, c in enumerate(rollout.completions) if any(m["role"] == "tool" for m in c)]
    assert called  # some episode called the tool: its reply is followed by the keyword's header
    for row in called:
        mask, tool = rollout.completion_mask[row].bool(), rollout.tool_mask[row].bool()
        assert policy.tokenizer.decode(rollout.completion_ids[row][mask & ~tool]).endswith("<|assistant|>7")


def test_template_without_tools_fails_before_compute(tiny_model_dir):
    with pytest.raises(ValueError, match="has no tool support"):
        engine().setup(Policy(tiny_model_dir), None, 0)


def tool_module(model_dir):
    return make_module(
        model_dir,
        reward_funcs=[last_answer_reward],
        accuracy_reward=None,
        rollout_engine=engine(),
        sampling={"max_completion_length": 10},
    )


def test_fit_logs_turn_and_tool_metrics_and_whole_episodes(tool_model_dir, chat_jsonl, tmp_path):
    samples = CompletionSampleLogger(every_n_steps=1, max_rows=8)
    data = PromptDataModule(chat_jsonl, batch_size=2, val_split=None)
    trainer = fit(tool_module(tool_model_dir), data, tmp_path, callbacks=[samples])
    metrics = logged(trainer)
    assert len(metrics["train/turns/mean"]) == 2 and max(metrics["train/turns/max"]) > 1
    assert "train/tools/call_frequency" in metrics and "train/tools/add/failure_frequency" in metrics
    assert all(v == v for v in metrics["train/loss"])  # finite, not NaN
    rows = [json.loads(line) for line in (Path(trainer.log_dir) / "samples.jsonl").read_text().splitlines()]
    episodes = [r["completion"].splitlines() for r in rows]
    called = [e for e in episodes if len(e) > 1]
    assert len(rows) == 16 and called  # the sample logger writes the episodes with calls whole
    for episode in called:  # assistant (the call), tool add: its reply, ... , the last assistant turn
        assert episode[0].startswith("assistant: ") and 'add({"a": ' in episode[0]
        assert episode[1].startswith("tool add: ") and episode[-1].startswith("assistant: ")


def test_resume_mid_run_repeats_the_uninterrupted_run(tool_model_dir, chat_jsonl, tmp_path):
    def data():
        return PromptDataModule(chat_jsonl, batch_size=2, val_split=None)

    full = tool_module(tool_model_dir)
    fit(full, data(), tmp_path / "full", max_steps=4)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    fit(
        tool_module(tool_model_dir),
        data(),
        tmp_path / "first",
        max_steps=2,
        callbacks=[checkpoints],
        enable_checkpointing=True,
    )
    (ckpt,) = (tmp_path / "ckpt").glob("*.ckpt")
    assert torch.load(ckpt, weights_only=False)["global_step"] == 2
    resumed, start = tool_module(tool_model_dir), tool_module(tool_model_dir)
    fit(resumed, data(), tmp_path / "second", max_steps=4, ckpt_path=str(ckpt))
    moved = [not torch.equal(a, b) for a, b in zip(full.policy.parameters(), start.policy.parameters())]
    assert any(moved)  # training changed the weights: the comparison below is not vacuous
    for (name, a), (_, b) in zip(full.policy.model.named_parameters(), resumed.policy.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


def test_lora_with_tools_trains_the_adapter_against_the_adapter_off_reference(tool_model_dir, chat_jsonl, tmp_path):
    lora = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
    module = make_module(
        tool_model_dir,
        reward_funcs=[last_answer_reward, length_reward],
        accuracy_reward=None,
        rollout_engine=engine(),
        policy={"peft_config": lora},
        sampling={"max_completion_length": 10},
        loss={"beta": 0.1},
    )
    base = {n: p.detach().clone() for n, p in module.policy.model.named_parameters() if "lora_" not in n}
    adapter = {n: p.detach().clone() for n, p in module.policy.model.named_parameters() if "lora_B" in n}
    metrics = logged(fit(module, PromptDataModule(chat_jsonl, batch_size=2, val_split=None), tmp_path, max_steps=3))
    params = dict(module.policy.model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in base.items())  # base weights untouched
    assert any(not torch.equal(params[n], v) for n, v in adapter.items())  # the adapter trained
    assert max(metrics["train/turns/max"]) > 1 and metrics["train/kl"][-1] > 0  # multi-turn, KL to adapter-off


class Tally:
    """Counts the calls of its tool; its reward is that count: per-episode values the reward functions must see."""

    def reset(self, **row) -> None:
        self.count = 0

    def tick(self) -> str:
        """Count one."""
        self.count += 1
        return str(self.count)

    def get_reward(self) -> float:
        return float(self.count)


class TickParser:
    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, [ToolCall("tick")] if len(text) % 2 == 0 else []


def test_environment_rewards_reach_the_reward_functions_per_episode(tool_model_dir, chat_jsonl, tmp_path):
    from lightning_grpo.engines import environment_reward

    seen = []

    def spy(completions, environment_reward, **kwargs):
        calls = [sum(m["role"] == "tool" for m in c) for c in completions]
        seen.append((calls, list(environment_reward)))
        return environment_reward

    rollout_engine = ToolCalling(environment_factory=Tally, parser=TickParser(), max_tool_calling_iterations=3)
    module = make_module(
        tool_model_dir, reward_funcs=[environment_reward, spy], accuracy_reward=None, rollout_engine=rollout_engine
    )
    metrics = logged(fit(module, PromptDataModule(chat_jsonl, batch_size=2, val_split=None), tmp_path))
    for calls, rewards in seen:  # the N episode rewards line up with the N completions, not repeated G times
        assert rewards == [float(c) for c in calls]
    assert any(any(calls) for calls, _ in seen)
    assert metrics["train/rewards/environment_reward/mean"] == pytest.approx(metrics["train/rewards/Tally/mean"])
