"""GraphedDecodeStep (LeanDecode's CUDA decode step, one captured graph a step): its static-shape step gives the
model's forward logits per architecture (run eagerly on CPU, where the arithmetic is the same), LeanDecode's loop
through it (rows kept in the batch, the stop checked every few steps) gives ``generate``'s greedy tokens, and the
models it must not take run their forward. On a CUDA machine the captured graph itself is checked: greedy tokens
equal ``generate``'s, and sampled ones the uncaptured loop's (``benchmarks/gpu_checks.sh`` runs this file there).
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import DynamicCache

from lightning_grpo.engines import HFGenerate, LeanDecode
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode.graphed import GraphedDecodeStep, graphable
from lightning_grpo.engines.decode.lean import Decoder, NextTokenLogits
from lightning_grpo.model.policy import Policy
from tests.engines.decode.test_fused import CONFIGS, model_of

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_static_step_gives_the_forwards_logits(name):
    """Left-padded prompts, five decode steps: the step that attends to every column of its buffers under a mask
    and writes its column at a device index gives the forward's logits."""
    model = model_of(name)
    n, width, steps = 4, 7, 5
    ids = torch.randint(3, 300, (n, width))
    mask = torch.ones(n, width, dtype=torch.long)
    mask[0, :3], mask[1, :1] = 0, 0  # left padding
    positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1)
    plain, cache, static_cache = NextTokenLogits(model), DynamicCache(config=model.config), None
    with torch.no_grad():
        plain(ids, mask, positions, cache)
        static_cache = DynamicCache(config=model.config)
        plain(ids, mask, positions, static_cache)
        static = GraphedDecodeStep(model, n).bind(static_cache, width + steps + 3)  # spare columns: masked out
        position = mask.sum(1, keepdim=True)
        for step in range(steps):
            token = torch.randint(3, 300, (n, 1))
            mask = torch.cat([mask, torch.ones(n, 1, dtype=torch.long)], dim=1)
            expected = plain(token, mask, position + step, cache)
            torch.testing.assert_close(static(token, mask, position + step, None), expected, rtol=0, atol=2e-5)


def test_the_decode_loop_through_the_static_step_gives_generates_greedy_tokens(tiny_model_dir):
    """The loop keeps every row in the batch (``narrows`` False) and checks for the end every few steps: the tokens
    are those of ``generate`` (rows that ended early get pad, as there)."""
    policy = Policy(tiny_model_dir)
    prompts = ["max(1,2,3)=", "max(9,2,3)= and a longer one", "a"]
    sampling = SamplingConfig(max_completion_length=12)
    expected = HFGenerate().generate(policy, prompts, 2, sampling, greedy=True).completion_ids
    tokenizer = policy.tokenizer
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        step = GraphedDecodeStep(policy.model, len(prompts) * 2)
        decoder = Decoder(
            NextTokenLogits(policy.model), sampling, policy.eos_token_ids, tokenizer.pad_token_id, False, step
        )
        tokens = decoder(batch.input_ids, batch.attention_mask, 2, greedy=True, share_prompt=True)
    width = expected.shape[1]
    assert torch.equal(tokens[:, :width], expected)
    assert (tokens[:, width:] == tokenizer.pad_token_id).all()  # steps past the end, before the check saw it


def test_models_the_graphed_step_does_not_take_run_their_forward():
    assert not graphable(model_of("qwen2"))  # on CPU: the fused step's business
    lora = get_peft_model(model_of("qwen2"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert not graphable(lora)


@cuda
def test_on_cuda_graphed_lean_decode_equals_generate_when_greedy(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    policy.model.to("cuda")
    assert graphable(policy.model)
    prompts = ["max(1,2,3)=", "max(9,2,3)= and a longer one", "a"]
    sampling = SamplingConfig(max_completion_length=24)
    graphed = LeanDecode().generate(policy, prompts, 4, sampling, greedy=True).completion_ids
    expected = HFGenerate().generate(policy, prompts, 4, sampling, greedy=True).completion_ids
    assert torch.equal(graphed, expected)


@cuda
def test_on_cuda_graphed_lean_decode_samples_as_the_uncaptured_loop(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    policy.model.to("cuda")
    prompts = ["max(1,2,3)=", "max(4,8,3)="]
    sampling = SamplingConfig(max_completion_length=16)
    runs = []
    for graphs in (True, False):
        torch.manual_seed(0)
        runs.append(LeanDecode(cuda_graphs=graphs).generate(policy, prompts, 8, sampling, greedy=False))
    graphed, eager = (r.completion_ids for r in runs)
    assert graphed.shape == eager.shape
    assert (graphed == eager).float().mean() >= 0.98  # fp32 sums in another order may flip a near-tie, rarely
