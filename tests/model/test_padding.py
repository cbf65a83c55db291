"""The padding-free log-prob forwards (trimmed columns, packed rows, packed with a shared prompt) against an
independent padded computation: the model's own forward over every column, log-softmax, gather. Log-probs,
entropies and every gradient equal to fp32 tolerance, for several length spreads, with LoRA, eager attention
and a Mixture-of-Experts router loss; and the positions each layout computes, as ``train/tokens/*`` reports them."""

from __future__ import annotations

import pytest
import torch
from helpers import fit, logged, make_module

from lightning_grpo.data import PromptDataModule
from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
from lightning_grpo.model.logprobs import completion_logps
from lightning_grpo.model.padding import (
    forward_positions,
    pack_rows,
    position_ids_from_mask,
    row_plan,
    trim_padding,
)
from lightning_grpo.model.prefix import prompt_runs
from lightning_grpo.types import HostRows
from tests.model.test_logprobs_moe import tiny_mixtral
from tests.model.test_prefix import assert_same_outputs, grouped_rows, lora_model, with_grads

LAYOUTS = {
    "trimmed": {},
    "packed": {"padding_free": True},
    "packed_shared": {"padding_free": True, "shared_prefix": True},
    "shared": {"shared_prefix": True},
}


def reference_logps(model, ids, mask, completion_length, temperature=0.7):
    """[n, T] log-probs and entropies from the model's full forward over the padded batch, 0 on padding."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logp = (logits[:, -completion_length - 1 : -1].float() / temperature).log_softmax(-1)  # [n, T, V]
    keep = mask[:, -completion_length:]
    token = logp.gather(-1, ids[:, -completion_length:].unsqueeze(-1)).squeeze(-1) * keep
    entropy = -(logp.exp() * logp).sum(-1) * keep
    return token, entropy


def assert_equal_to_reference(model, ids, mask, completion_length, layout):
    expected = with_grads(lambda: reference_logps(model, ids, mask, completion_length), model, mask, completion_length)

    def ours():
        out = completion_logps(model, ids, mask, completion_length, temperature=0.7, **LAYOUTS[layout])
        return out.logps, out.entropy

    assert_same_outputs(with_grads(ours, model, mask, completion_length), expected, entropy_atol=1e-4)


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen2(build_tokenizer()).train()


SPREADS = [
    ([5], 1, 4),  # one row
    ([3, 7], 2, 5),  # left padding on the first prompt
    ([6, 6, 2], 4, 3),  # equal-length prompts, distinct ids
    ([9, 1], 3, 6),  # a one-token prompt
    ([4, 2], 4, 24),  # long, uneven completions (1 to 24 tokens)
]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("prompt_lengths,group_size,completion_length", SPREADS)
def test_every_layout_equals_the_padded_forward(model, layout, prompt_lengths, group_size, completion_length):
    ids, mask = grouped_rows(prompt_lengths, group_size, completion_length, seed=len(prompt_lengths))
    assert_equal_to_reference(model, ids, mask, completion_length, layout)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("prompt_lengths,group_size,completion_length", SPREADS)
def test_the_positions_counted_are_those_the_decoder_runs(model, layout, prompt_lengths, group_size, completion_length):
    """``forward_positions`` (the ``train/tokens/computed`` of a step) against the token positions that reach the
    decoder's embedding in the forward itself."""
    ids, mask = grouped_rows(prompt_lengths, group_size, completion_length, seed=len(prompt_lengths))
    seen = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda _, args: seen.append(args[0].numel()))
    try:
        with torch.no_grad():
            completion_logps(model, ids, mask, completion_length, **LAYOUTS[layout])
    finally:
        hook.remove()
    options = LAYOUTS[layout]
    counted = forward_positions(
        ids, mask, completion_length, options.get("shared_prefix", False), "padding_free" in options
    )
    assert int(counted) == sum(seen) <= ids.numel()


def test_a_run_logs_the_positions_computed_against_the_padded_batch(tiny_model_dir, arith_jsonl, tmp_path):
    # G = 4 rows share each prompt: the default forward encodes it once, so a step computes fewer than N x (P + T)
    trainer = fit(make_module(tiny_model_dir), PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path)
    steps = logged(trainer)
    for computed, padded, saved in zip(*(steps[f"train/tokens/{k}"] for k in ("computed", "padded", "padding_saved"))):
        assert 0 < computed < padded and saved == pytest.approx(1 - computed / padded)
    assert len(steps["train/tokens/computed"]) == 2


@pytest.mark.parametrize("layout", ["packed", "packed_shared"])
def test_packed_with_lora(layout):
    model = lora_model()
    ids, mask = grouped_rows([5, 2], 3, 8, seed=2)
    assert_equal_to_reference(model, ids, mask, 8, layout)


@pytest.mark.parametrize("layout", ["packed", "packed_shared"])
def test_packed_with_eager_attention(layout):
    model = build_tiny_qwen2(build_tokenizer()).train()
    model.config._attn_implementation = "eager"  # an additive mask, not sdpa's
    ids, mask = grouped_rows([3, 6], 3, 7, seed=3)
    assert_equal_to_reference(model, ids, mask, 7, layout)


def test_a_row_never_reads_another_row():
    """Changing one row's tokens leaves every other row's packed log-probs as they were."""
    model = build_tiny_qwen2(build_tokenizer()).eval()
    ids, mask = grouped_rows([4, 4], 2, 6, seed=4)
    changed = ids.clone()
    changed[1, -6:] = torch.where(mask[1, -6:] == 1, (ids[1, -6:] + 7) % 90 + 3, ids[1, -6:])
    for layout in ("packed", "packed_shared"):
        before = completion_logps(model, ids, mask, 6, **LAYOUTS[layout]).logps.detach()
        after = completion_logps(model, changed, mask, 6, **LAYOUTS[layout]).logps.detach()
        assert not torch.allclose(before[1], after[1])
        torch.testing.assert_close(after[[0, 2, 3]], before[[0, 2, 3]], rtol=0, atol=1e-6)


def test_the_packed_sequence_holds_only_real_tokens_and_a_group_prompt_once():
    ids, mask = grouped_rows([3, 5], 4, 6, seed=5)
    real = int(mask.sum())
    plain = pack_rows(ids, mask, 6, share_prompt=False, dtype=torch.float32)
    shared = pack_rows(ids, mask, 6, share_prompt=True, dtype=torch.float32)
    assert plain.input_ids.shape == (1, real) and plain.attention_mask is None
    assert shared.input_ids.shape == (1, real - 3 * 3 - 3 * 5)  # 3 of each group's 4 prompt copies dropped
    assert shared.attention_mask.shape == (1, 1, shared.input_ids.shape[1], shared.input_ids.shape[1])
    assert len(plain.index) == len(shared.index) == int(mask[:, -6:].sum())


def test_trimming_drops_only_columns_no_row_needs():
    ids, mask = grouped_rows([2, 6], 2, 10, seed=6)
    mask[:, -3:] = 0  # no completion reaches the last 3 columns
    trimmed_ids, trimmed_mask, width = trim_padding(ids, mask, 10)
    assert width == int(mask[:, -10:].nonzero()[:, 1].max()) + 1 <= 7
    assert trimmed_mask.sum() == mask.sum()
    assert trimmed_mask[:, 0].any() and trimmed_mask[:, -1].any()  # the first and last columns are used


MICRO_BATCHES = [slice(None), slice(2, 9), [7, 6, 5, 4, 0, 1], [9, 0, 10, 3]]  # whole, cut groups, a length plan


def host_rows(ids, mask, completion_length):
    t = completion_length
    return HostRows.read(ids[:, :-t], mask[:, :-t], ids[:, -t:], mask[:, -t:])


def repeated_prompts():
    """Three groups of 4 rows, 8 prompt and 5 completion columns: the second group's prompt ids are the first's
    but not its padding (not one prompt), the third's prompt is the first's (one prompt, another group)."""
    ids, mask = grouped_rows([4, 8, 3], 4, 5, seed=1)
    ids[4:8, :8] = ids[:4, :8]
    ids[8:, :8], mask[8:, :8] = ids[:4, :8], mask[:4, :8]
    return ids, mask


@pytest.mark.parametrize("rows", MICRO_BATCHES)
def test_the_hosts_plan_is_what_the_device_finds(rows):
    """``Rollout.host``'s plan of any micro-batch (a slice, or the index list of a length plan, whose groups may
    come in another order): the columns ``trim_padding`` keeps, the prompt runs, the completion-token count."""
    ids, mask = repeated_prompts()
    plan = row_plan(host_rows(ids, mask, 5), rows)
    picked = torch.tensor(rows) if isinstance(rows, list) else rows
    i, m = ids[picked], mask[picked]
    device_ids, device_mask, device_width = trim_padding(i, m, 5)
    planned_ids, planned_mask, planned_width = trim_padding(i, m, 5, plan.columns)
    assert planned_width == device_width and torch.equal(planned_ids, device_ids)
    assert torch.equal(planned_mask, device_mask)
    _, counts = prompt_runs(i[:, :8], m[:, :8])
    assert plan.runs == counts.tolist() and plan.tokens == int(m[:, -5:].sum())
    assert rows != [9, 0, 10, 3] or plan.runs == [4]  # two groups with one prompt, next to each other here
    assert torch.equal(
        torch.stack(prompt_runs(i[:, :8], m[:, :8], plan.runs)), torch.stack(prompt_runs(i[:, :8], m[:, :8]))
    )


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("rows", MICRO_BATCHES[1:])
def test_every_layout_with_the_hosts_plan_equals_the_padded_forward(model, layout, rows):
    """The forward as a training step runs it (its micro-batch's plan from the host: no read of the device to
    shape it) against the padded reference, in value and gradient."""
    ids, mask = repeated_prompts()
    plan = row_plan(host_rows(ids, mask, 5), rows)
    picked = torch.tensor(rows) if isinstance(rows, list) else rows
    i, m = ids[picked], mask[picked]
    expected = with_grads(lambda: reference_logps(model, i, m, 5), model, m, 5)

    def ours():
        out = completion_logps(model, i, m, 5, temperature=0.7, plan=plan, **LAYOUTS[layout])
        return out.logps, out.entropy

    assert_same_outputs(with_grads(ours, model, m, 5), expected, entropy_atol=1e-4)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("layout", ["trimmed", "shared"])
def test_the_mask_prepared_from_the_hosts_plan_gives_what_transformers_own_gives(attention, layout):
    """With the host's plan, a padded forward gets its causal mask prepared (and a prompt pass without padding
    none), so that transformers reads nothing to decide it: the same log-probs, entropies and gradients, to the
    bit, as the 2D mask transformers turns into the same mask itself."""
    model = build_tiny_qwen2(build_tokenizer()).train()
    model.config._attn_implementation = attention
    ids, mask = repeated_prompts()
    for rows in (slice(None), slice(0, 4)):  # padded prompts; one prompt, no prompt padding
        i, m = ids[rows], mask[rows]
        plan = row_plan(host_rows(i, m, 5), slice(None))
        assert plan.padded and plan.prompt_padded == (rows == slice(None))
        outputs = []
        for given in (plan, None):

            def forward(given=given, i=i, m=m):
                out = completion_logps(model, i, m, 5, temperature=0.7, plan=given, **LAYOUTS[layout])
                return out.logps, out.entropy

            outputs.append(with_grads(forward, model, m, 5))
        (logps, entropy, grads), (logps0, entropy0, grads0) = outputs
        assert torch.equal(logps, logps0) and torch.equal(entropy, entropy0)
        assert all(torch.equal(grads[k], grads0[k]) for k in grads0)


def test_packed_router_loss_equals_the_padded_one():
    model = tiny_mixtral()
    ids, mask = grouped_rows([3, 5], 2, 4, seed=7)
    ids = ids % 64
    padded = completion_logps(model, ids, mask, 4, router_aux=True).aux_loss
    packed = completion_logps(model, ids, mask, 4, router_aux=True, padding_free=True).aux_loss
    assert packed.item() == pytest.approx(padded.item(), rel=1e-5) and padded.item() > 0
