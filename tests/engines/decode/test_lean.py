"""LeanDecode against Hugging Face ``generate``: greedy token for token, the filters' distributions exactly,
sampling statistically; early exit, ended rows leaving the batch with the same tokens, generation batches, the
shared prompt cache, LoRA, ranks in step."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import fit, free_port, make_module
from transformers import DynamicCache
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lightning_grpo import PromptDataModule
from lightning_grpo.engines import HFGenerate, LeanDecode
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode import lean as lean_module
from lightning_grpo.engines.decode import packing
from lightning_grpo.engines.decode.fused import FusedDecodeStep
from lightning_grpo.engines.decode.sampling import sample_inverse_cdf, sampling_logits
from lightning_grpo.engines.prompts import tokenize_prompts
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy

PROMPTS = ["max(1,2,3)=", "max(9,2,3)= and a longer one", "a"]  # different lengths: left padding
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}
FILTERS = {  # one filter at a time, then all together
    "temperature": dict(temperature=0.6),
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.7),
    "min_p": dict(min_p=0.3),
    "repetition_penalty": dict(repetition_penalty=1.8),
    "all": dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
}
DECODE_PATHS = {"fused": {}, "packed": dict(fused_layers=False), "plain": dict(packed_weights=False)}


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return Policy(tiny_model_dir)


def hf_processors(sampling: SamplingConfig) -> LogitsProcessorList:
    """``generate``'s processors for these settings, in its order (transformers 5)."""
    out = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty))
    if sampling.temperature != 1.0:
        out.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k:
        out.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(sampling.top_p))
    if sampling.min_p is not None:
        out.append(MinPLogitsWarper(sampling.min_p))
    return out


@pytest.mark.parametrize("penalty", [1.0, 1.5])
@pytest.mark.parametrize(
    "engine",
    [
        LeanDecode(),
        LeanDecode(share_prompt_cache=False),
        LeanDecode(packed_weights=False),
        LeanDecode(generation_batch_size=4),  # 1 prompt x 3 per call (whole groups)
    ],
    ids=["default", "unshared", "unpacked", "batched"],
)
def test_greedy_is_generate_token_for_token(policy, engine, penalty):
    sampling = SamplingConfig(max_completion_length=12, repetition_penalty=penalty)
    expected = HFGenerate().generate(policy, PROMPTS, 3, sampling, greedy=True)
    got = engine.generate(policy, PROMPTS, 3, sampling, greedy=True)
    assert torch.equal(got.completion_ids, expected.completion_ids)
    assert torch.equal(got.completion_mask, expected.completion_mask)
    assert torch.equal(got.prompt_ids, expected.prompt_ids) and got.completions == expected.completions


@pytest.mark.parametrize("path", DECODE_PATHS)
def test_greedy_under_bf16_autocast_is_generate_s(policy, path, monkeypatch):
    """``trainer.precision: bf16-mixed`` on a CPU samples inside bf16 autocast: fp32 weights in oneDNN's layout take
    no bf16 input ("could not create a primitive descriptor"), so under autocast the packed copies are bf16 and the
    fused step is off; every path's greedy output is ``generate``'s, token for token."""
    monkeypatch.setattr(packing, "MIN_PACKED", 0)  # every layer packed: the tiny model's are below the size
    sampling = SamplingConfig(max_completion_length=12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = HFGenerate().generate(policy, PROMPTS, 3, sampling, greedy=True)
        got = LeanDecode(**DECODE_PATHS[path]).generate(policy, PROMPTS, 3, sampling, greedy=True)
    assert torch.equal(got.completion_ids, expected.completion_ids)


def test_packed_layers_under_bf16_autocast_compute_in_bf16_as_autocast_does(policy, monkeypatch):
    """Under CPU autocast the packed copies are bf16 (autocast would cast each fp32 weight on every call): a layer's
    output is bf16, as autocast's own product, and equal to it to bf16 rounding."""
    monkeypatch.setattr(packing, "MIN_PACKED", 0)
    model, layer = policy.model, policy.model.model.layers[0].mlp.up_proj
    x = torch.randn(4, layer.in_features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
        with packing.packed_linears(model, rows=4):
            assert "forward" in vars(layer)  # packed: its own forward replaced for the context
            got = layer(x)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_a_bf16_mixed_run_samples_with_lean_decode(tiny_model_dir, arith_jsonl, tmp_path, monkeypatch):
    monkeypatch.setattr(packing, "MIN_PACKED", 0)
    module = make_module(tiny_model_dir, rollout_engine=LeanDecode())
    data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None)
    assert fit(module, data, tmp_path, max_steps=1, precision="bf16-mixed").global_step == 1


def test_greedy_with_lora(tiny_model_dir):
    policy = Policy(tiny_model_dir, PolicyConfig(peft_config=LORA))
    with torch.no_grad():  # a non-zero adapter, so that it changes the output
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    sampling = SamplingConfig(max_completion_length=10)
    expected = HFGenerate().generate(policy, PROMPTS, 2, sampling, greedy=True)
    got = LeanDecode().generate(policy, PROMPTS, 2, sampling, greedy=True)
    assert torch.equal(got.completion_ids, expected.completion_ids)


def test_stops_when_every_row_has_ended(policy, monkeypatch):
    sampling = SamplingConfig(max_completion_length=12)
    first = LeanDecode().generate(policy, PROMPTS, 2, sampling, greedy=True).completion_ids
    eos = sorted(set(first[:, 2].tolist()))  # every row ends by its third token
    monkeypatch.setattr(policy.model.generation_config, "eos_token_id", eos)
    calls = []
    original = lean_module.NextTokenLogits.__call__
    monkeypatch.setattr(lean_module.NextTokenLogits, "__call__", lambda *a: calls.append(1) or original(*a))
    got = LeanDecode().generate(policy, PROMPTS, 2, sampling, greedy=True)
    expected = HFGenerate().generate(policy, PROMPTS, 2, sampling, greedy=True)
    assert torch.equal(got.completion_ids, expected.completion_ids)
    assert got.completion_ids.shape[1] <= 3 and len(calls) <= 3  # prefill + at most 2 decode steps, not 12


def decode_batch_sizes(monkeypatch) -> list[int]:
    """The batch size of every decode-step forward (one token per row), through the model or the fused step."""
    sizes = []
    for cls in (lean_module.NextTokenLogits, FusedDecodeStep):
        original = cls.__call__

        def record(self, ids, *rest, _original=original):
            if ids.shape[1] == 1:  # a decode step, not a prefill (the prompts are longer than one token)
                sizes.append(ids.shape[0])
            return _original(self, ids, *rest)

        monkeypatch.setattr(cls, "__call__", record)
    return sizes


def end_rows_unevenly(policy, monkeypatch, engine, sampling, greedy) -> None:
    """EOS ids that end the rows at different steps: two ids of a run with no EOS, from two rows' completions.
    The run draws the same random numbers as the next one (a row's tokens before its EOS do not depend on it)."""
    monkeypatch.setattr(policy.model.generation_config, "eos_token_id", [])
    torch.manual_seed(0)
    pilot = engine.generate(policy, PROMPTS, 4, sampling, greedy=greedy).completion_ids  # [12, T]
    monkeypatch.setattr(policy.model.generation_config, "eos_token_id", [int(pilot[0, 2]), int(pilot[-1, 6])])


@pytest.mark.parametrize("path", sorted(DECODE_PATHS))
@pytest.mark.parametrize("share", [True, False], ids=["shared", "unshared"])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_ended_rows_leave_the_batch_with_the_same_tokens(policy, monkeypatch, greedy, penalty, share, path):
    sampling = SamplingConfig(max_completion_length=20, temperature=1.3, top_k=50, repetition_penalty=penalty)
    engines = {
        drop: LeanDecode(share_prompt_cache=share, drop_finished_rows=drop, **DECODE_PATHS[path])
        for drop in (False, True)
    }
    end_rows_unevenly(policy, monkeypatch, engines[False], sampling, greedy)
    sizes = decode_batch_sizes(monkeypatch)
    runs = {}
    for drop, engine in engines.items():
        torch.manual_seed(0)
        runs[drop] = engine.generate(policy, PROMPTS, 4, sampling, greedy=greedy), list(sizes)
        sizes.clear()
    (kept, kept_sizes), (dropped, dropped_sizes) = runs[False], runs[True]
    assert torch.equal(dropped.completion_ids, kept.completion_ids)
    assert torch.equal(dropped.completion_mask, kept.completion_mask)
    assert len(set(kept.completion_mask.sum(dim=1).tolist())) >= 2  # rows really end at different steps
    assert set(kept_sizes) == {12} and len(dropped_sizes) == len(kept_sizes)  # as many steps
    assert dropped_sizes == sorted(dropped_sizes, reverse=True) and dropped_sizes[-1] < 12  # the batch shrank


def test_rows_to_keep_waits_for_a_quarter_and_keeps_one():
    # 16 rows: 3 ended is under a quarter (keep all 16); 4 ended is a quarter (keep 12); all ended: keep 1
    assert [lean_module.rows_to_keep(16, left) for left in (13, 12, 0)] == [16, 12, 1]
    assert lean_module.rows_to_keep(3, 2) == 2 and lean_module.rows_to_keep(1, 0) == 1  # 1 of 3 ended: > 3/4


def test_a_cache_with_recurrent_layers_is_not_narrowed(policy):
    """``batch_select_indices`` would leave a linear-attention layer's per-row state whole: such a cache keeps
    every row (and a fused step's cache, None, is narrowed by the step)."""
    config = policy.model.config.__class__(num_hidden_layers=2)
    assert lean_module.narrowable(DynamicCache(config=config)) and lean_module.narrowable(None)
    config.layer_types = ["full_attention", "linear_attention"]
    assert not lean_module.narrowable(DynamicCache(config=config))


def test_a_rows_draw_does_not_depend_on_the_others():
    """Rows 1 and 3 of 5 sampled alone, with the batch's size, get the tokens they get in the whole batch."""
    logits = torch.randn(5, 600, generator=torch.Generator().manual_seed(0))  # [N, V]
    rows = torch.tensor([1, 3])
    torch.manual_seed(3)
    whole, after_whole = sample_inverse_cdf(logits), torch.rand(1)  # [5]
    torch.manual_seed(3)
    part, after_part = sample_inverse_cdf(logits[rows], rows=rows, batch=5), torch.rand(1)  # [2]
    assert torch.equal(part, whole[rows])
    assert torch.equal(after_part, after_whole)  # the stream advanced as for all 5 rows


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_filtered_distribution_equals_generates(name):
    """Exact: the same ids filtered out, the same probabilities elsewhere; logits rounded to make ties."""
    sampling = SamplingConfig(**FILTERS[name])
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 40, generator=gen) * 2).round(decimals=1)  # [N, V]
    ids = torch.randint(0, 40, (6, 9), generator=gen)  # [N, L] each row's prompt and completion so far
    seen = torch.zeros(6, 40, dtype=torch.bool).scatter_(1, ids, True)
    expected = hf_processors(sampling)(ids, logits.clone())
    got = sampling_logits(logits, sampling, greedy=False, seen=seen)
    assert torch.equal(got.isinf(), expected.isinf())
    torch.testing.assert_close(got.softmax(-1), expected.softmax(-1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("block", [256, 2, 3])  # one block; whole blocks; a padded last block
def test_inverse_cdf_draws_from_the_softmax(block):
    """200k draws from a 4-row distribution with filtered (-inf) ids, a whole block of them when ``block`` is 2:
    frequencies within 5 standard errors, and never a filtered id."""
    torch.manual_seed(0)
    inf = float("inf")
    logits = torch.tensor([[0.0, 1.0, 2.0, -inf], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-inf, -inf, 0.0, 1.0]])
    n = 200_000
    draws = sample_inverse_cdf(logits.repeat(n, 1), block).view(n, 4)  # [n, 4]
    p = logits.softmax(-1)  # [4, V]
    freq = torch.stack([torch.bincount(draws[:, r], minlength=4) for r in range(4)]).float() / n
    assert freq[0, 3] == 0 and freq[3, :2].sum() == 0  # never a filtered id
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-9).all()


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_first_token_frequencies_match_generate(policy, name):
    """Statistical, end to end: 4000 first tokens from one prompt, from each engine, against the exact
    distribution (the model's logits through generate's own processors): every id within 5 standard errors."""
    sampling = SamplingConfig(max_completion_length=1, **FILTERS[name])
    prompt = ["max(1,2,3)="]
    ids, _, _ = tokenize_prompts(policy.tokenizer, prompt, SamplingConfig(max_prompt_length=None))
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[:, -1].float()  # [1, V]
    p = hf_processors(sampling)(ids, logits).softmax(-1)[0]  # [V]
    n = 4000
    for engine in (LeanDecode(), HFGenerate()):  # generate passes the same check: the tolerance is calibrated
        torch.manual_seed(1)
        first = engine.generate(policy, prompt, n, sampling, greedy=False).completion_ids[:, 0]
        freq = torch.bincount(first, minlength=p.numel()).float() / n
        assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1.5 / n).all(), type(engine).__name__


def test_generation_batches_cover_every_group(policy):
    sampling = SamplingConfig(max_completion_length=6)
    torch.manual_seed(0)
    rollout = LeanDecode(generation_batch_size=5).generate(policy, PROMPTS, 2, sampling, greedy=False)
    assert rollout.completion_ids.shape[0] == 6 and rollout.group_size == 2
    assert rollout.prompts == [p for p in PROMPTS for _ in range(2)]
    with pytest.raises(ValueError, match="generation_batch_size must be None or >= 1, got 0"):
        LeanDecode(generation_batch_size=0)


def test_module_trains_with_lean_decode(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, rollout_engine=LeanDecode(generation_batch_size=8))
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=2)
    assert trainer.global_step == 2


def _synced_rank(rank: int, port: int, model_dir: str, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    policy = Policy(model_dir)
    policy.synced_generation = True
    sampling = SamplingConfig(max_completion_length=8)
    first = LeanDecode().generate(policy, PROMPTS, 1, sampling, greedy=True).completion_ids
    if rank == 0:  # rank 0's rows all end at their first token, rank 1's never
        policy.model.generation_config.eos_token_id = sorted(set(first[:, 0].tolist()))
    steps = []
    original = lean_module.Decoder.all_done
    lean_module.Decoder.all_done = lambda self, unfinished: steps.append(1) or original(self, unfinished)
    with pytest.MonkeyPatch.context() as monkeypatch:
        sizes = decode_batch_sizes(monkeypatch)
        rollout = LeanDecode().generate(policy, PROMPTS, 1, sampling, greedy=True)
    out[rank] = (len(steps), rollout.completion_ids.shape[1], sorted(set(sizes)))
    dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_keep_stepping_until_all_are_done(tiny_model_dir):
    port = free_port()
    out = mp.Manager().dict()
    mp.spawn(_synced_rank, args=(port, tiny_model_dir, out), nprocs=2)
    # the rank that ended first took as many steps (collective forwards) as the other: 7 checks for 8 tokens
    assert out[0][0] == out[1][0] == 7
    assert out[0][1] == 1 and out[1][1] == 8
    assert out[0][2] == [1] and out[1][2] == [3]  # rank 0's ended rows left its batch but one: never 0 rows


@pytest.mark.parametrize("path", sorted(DECODE_PATHS))
@pytest.mark.parametrize("drop", [True, False], ids=["drop", "keep"])
def test_sampler_logps_are_the_policy_s_as_drawn(policy, monkeypatch, path, drop):
    """``sampler_logps``: the same tokens, and each token's log-prob as drawn equals the policy's forward
    (temperature-scaled: the filters here cut nothing the tokens use) on every decode path, rows ending unevenly."""
    sampling = SamplingConfig(max_completion_length=16, temperature=0.7)
    plain = LeanDecode(drop_finished_rows=drop, **DECODE_PATHS[path])
    end_rows_unevenly(policy, monkeypatch, plain, sampling, False)
    torch.manual_seed(0)
    expected = plain.generate(policy, PROMPTS, 4, sampling, greedy=False)
    torch.manual_seed(0)
    rollout = LeanDecode(drop_finished_rows=drop, sampler_logps=True, **DECODE_PATHS[path]).generate(
        policy, PROMPTS, 4, sampling, greedy=False
    )
    assert torch.equal(rollout.completion_ids, expected.completion_ids) and expected.sampling_logps is None
    mask = rollout.completion_mask.bool()
    assert len(set(mask.sum(dim=1).tolist())) >= 2  # rows of different lengths
    monkeypatch.setattr(policy, "temperature", sampling.temperature)  # as GRPOModule makes its policy
    with torch.no_grad():
        forward = policy.logps(rollout, [slice(None)])  # [N, T]
    torch.testing.assert_close(rollout.sampling_logps[mask], forward[mask], atol=2e-5, rtol=1e-5)
    assert (rollout.sampling_logps[~mask] == 0).all()
