"""The shared-prefix (Prefix Grouper) forward against the plain one: log-probs, entropies and every gradient equal
to fp32 tolerance, for several prompt lengths, group sizes, padding patterns, cut groups and LoRA."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.loading import with_lora
from lightning_grpo.model.logprobs import completion_logps
from lightning_grpo.model.prefix import prompt_runs

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def grouped_rows(prompt_lengths: list[int], group_size: int, completion_length: int, seed: int = 0):
    """[n, P+T] ids and mask: one left-padded prompt per group repeated ``group_size`` times, completions of random
    lengths (right padding, as after an EOS)."""
    gen = torch.Generator().manual_seed(seed)
    width = max(prompt_lengths)
    ids, mask = [], []
    for length in prompt_lengths:
        prompt = torch.randint(3, 100, (length,), generator=gen)
        for _ in range(group_size):
            done = int(torch.randint(1, completion_length + 1, (1,), generator=gen))
            completion = torch.randint(3, 100, (completion_length,), generator=gen)
            row_mask = torch.cat(
                [torch.zeros(width - length), torch.ones(length + done), torch.zeros(completion_length - done)]
            )
            ids.append(torch.cat([torch.zeros(width - length, dtype=torch.long), prompt, completion]))
            mask.append(row_mask.long())
    ids, mask = torch.stack(ids), torch.stack(mask)
    return ids.masked_fill(mask == 0, 0), mask


def with_grads(fn, model, mask, completion_length):
    """(log-probs, entropies, every parameter's gradient) of ``fn() -> (logps [n, T], entropies [n, T])``."""
    model.zero_grad()
    logps, entropy = fn()
    weights = torch.linspace(-1, 1, logps.numel()).view_as(logps)  # a loss that weighs every token
    (logps * weights * mask[:, -completion_length:]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), entropy.detach(), grads


def assert_same_outputs(got, expected, entropy_atol=1e-5):
    """Two ``with_grads`` results equal to fp32 tolerance."""
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)  # log-probs
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=entropy_atol)  # entropies
    assert got[2].keys() == expected[2].keys() and expected[2]
    for name in expected[2]:
        torch.testing.assert_close(got[2][name], expected[2][name], rtol=1e-4, atol=1e-5, msg=name)


def logps_and_grads(model, ids, mask, completion_length, shared):
    def forward():
        out = completion_logps(model, ids, mask, completion_length, temperature=0.7, shared_prefix=shared)
        return out.logps, out.entropy

    return with_grads(forward, model, mask, completion_length)


def assert_same(model, ids, mask, completion_length):
    plain = logps_and_grads(model, ids, mask, completion_length, shared=False)
    shared = logps_and_grads(model, ids, mask, completion_length, shared=True)
    assert_same_outputs(shared, plain)


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen2(build_tokenizer()).train()


@pytest.mark.parametrize(
    "prompt_lengths,group_size,completion_length",
    [
        ([5], 1, 4),  # no sharing: one row per prompt
        ([3, 7], 2, 5),  # left padding on the first prompt
        ([6, 6, 2], 4, 3),  # equal-length prompts, distinct ids
        ([9, 1], 3, 6),  # a one-token prompt
    ],
)
def test_shared_prefix_equals_the_plain_forward(model, prompt_lengths, group_size, completion_length):
    ids, mask = grouped_rows(prompt_lengths, group_size, completion_length)
    assert_same(model, ids, mask, completion_length)


def test_a_micro_batch_that_cuts_groups(model):
    ids, mask = grouped_rows([4, 8, 3], 4, 5, seed=1)
    rows = slice(2, 9)  # the end of group 0, all of group 1, the start of group 2
    first, counts = prompt_runs(ids[rows, :8], mask[rows, :8])
    assert first.tolist() == [0, 2, 6] and counts.tolist() == [2, 4, 1]
    assert_same(model, ids[rows], mask[rows], 5)


def lora_model():
    """The tiny model under a LoRA adapter whose B matrices are random (0 at initialisation: the adapter would
    change nothing)."""
    torch.manual_seed(0)
    model = with_lora(build_tiny_qwen2(build_tokenizer()), LORA).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)
    return model


def test_shared_prefix_with_lora():
    model = lora_model()
    ids, mask = grouped_rows([5, 2], 3, 4, seed=2)
    assert_same(model, ids, mask, 4)


def test_policy_setting_and_its_refusals(tiny_model_dir):
    with pytest.raises(ValueError, match="share_prompt_prefix=True with policy.gradient_checkpointing=True"):
        PolicyConfig(gradient_checkpointing=True, share_prompt_prefix=True)
    with pytest.raises(ValueError, match="shared_prefix does not return MoE router logits"):
        model = build_tiny_qwen2(build_tokenizer())
        ids, mask = grouped_rows([3], 2, 2)
        completion_logps(model, ids, mask, 2, router_aux=True, shared_prefix=True)


def test_module_trains_with_a_shared_prompt_prefix(tiny_model_dir, arith_jsonl, tmp_path):
    """Same seed, same sampled completions: the shared and plain forwards reach the same weights."""
    from helpers import fit, make_module

    from lightning_grpo import PromptDataModule

    trained = []
    for shared in (False, True):
        module = make_module(tiny_model_dir, policy={"share_prompt_prefix": shared}, loss={"beta": 0.1})
        fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path / str(shared), max_steps=2)
        trained.append(module.policy.model)
    # Adam divides by sqrt(v): where a gradient is at rounding level, rounding can move a weight by up to
    # lr = 1e-2 a step; a tenth of that is the tolerance (seen: 3 of 16,768 weights apart by 2e-4, the rest 1e-5)
    for a, b in zip(trained[0].parameters(), trained[1].parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3)
