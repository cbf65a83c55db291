"""Prompts -> Rollout with a lean sampling loop over the policy's own forward and KV cache (no ``generate``).

Knows the policy's decoder, LM head and cache; nothing about rewards. Per decode step it runs the model's forward on
one token per row (the LM head on the last position only) and ``decode.sampling`` on the logits: the same filters
and distribution as ``generate``, without its per-step overhead. Where the time went on 2 CPU cores (Qwen2, 4
layers, 256 wide, vocabulary 32,000, 16 rows; GRPO_REFERENCE.md): ``generate`` 35 ms a step, of which
``torch.multinomial`` 13-16 ms (an inverse-CDF draw needs one random number per row, not per vocabulary entry)
and the LM head 12.5 ms as ``F.linear``, which re-packs its 32.8 MB weight on every call (pre-packed once per
``generate`` call: about the time of copying the weight, the memory floor).

Each prompt is prefilled once and its KV cache repeated for its G completions; rows are generated
``generation_batch_size`` at a time. Rows leave the batch as they end: once a quarter of the rows in the batch have
ended, the logits, mask, positions, repetition-penalty ids and KV cache are narrowed to the rest (``DecodeRows``),
so an ended row stops costing its share of attention, MLP and LM head (completions of 16 to 512 tokens in one
group are common). The draw takes a random number for every row either way, so the tokens are those of the full
batch. The loop stops when every row has ended (under sharding, when every rank's rows have: a forward is then a
collective, so a rank that is done keeps stepping, on one row).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from transformers import DynamicCache, cache_utils
from typing_extensions import override

from lightning_grpo.engines.base import TokenSampler
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode.fused import FusedDecodeStep, fusable, fused_projections
from lightning_grpo.engines.decode.graphed import GraphedDecodeStep, graphable
from lightning_grpo.engines.decode.packing import autocast_dtype, packed_linears
from lightning_grpo.engines.decode.sampling import draw, drawn_logps, sampling_logits
from lightning_grpo.engines.rollout import (
    build_rollout,
    check_generation_batch_size,
    cut_turns,
    generation_chunks,
    pad_right,
    tokenized_prompts,
)
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.prefix import cache_keyword
from lightning_grpo.types import Prompt, Rollout, pad_rows

# cache layers holding a recurrent state per row (linear attention); the class is new in transformers 5
RECURRENT_LAYERS = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())
# Off the CPU, the loop reads "have all rows ended?" every this many tokens: each read waits for the GPU to finish
# the step (the next step's launches cannot queue behind it), and at most this many - 1 steps run past the end.
STOP_CHECK_EVERY = 8


class LeanDecode(TokenSampler):
    """A sampling loop over the policy's forward with its KV cache; ``generate``'s sampling distribution.

    Args:
        generation_batch_size: completions generated at once (whole groups of G; at least one group);
            ``None``: all B * G of the step together. Smaller batches bound the KV cache's memory.
        share_prompt_cache: prefill each prompt once and repeat its KV cache for its G completions.
        packed_weights: on CPU, run the linear layers (the LM head included) against copies of their weights
            pre-packed for oneDNN, made at the start of each ``generate`` call (so they have the current weights)
            and freed at its end: about twice as fast per decode step, for a transient copy of the weights.
            Off, or where it does not apply (GPU, bf16, sharded weights), the layers run as they are.
        fused_layers: with ``packed_weights``, decode Llama, Qwen2, Qwen3 and Mistral models (no adapters, no
            sliding window) with ``decode.fused.FusedDecodeStep`` instead of the model's forward: the same values
            to fp32 rounding with fewer, larger operations. Other models run their forward either way.
        cuda_graphs: on CUDA, decode Llama, Qwen2, Qwen3 and Mistral models (no adapters, no shards) with
            ``engines.decode.graphed.GraphedDecodeStep``: the same step as ``fused_layers``, captured once per call
            as a CUDA graph and replayed for every token, so a step costs one launch instead of ~15 a layer. Its
            batch keeps the rows that have ended, and the loop checks for the end every ``STOP_CHECK_EVERY``
            tokens (each check waits for the GPU). Other models and devices run as without it.
        drop_finished_rows: decode only the rows that have not ended, narrowing the batch and its KV cache once a
            quarter of it has ended. The same tokens as off (the draw takes a random number for every row); off,
            every row stays in the batch until all have ended (the loop before, kept for comparison).
        sampler_logps: record the log-prob of every sampled token under ``softmax(logits / temperature)``, the
            distribution the trainer scores, before the repetition penalty and the filters
            (``Rollout.sampling_logps``; in ``complete``, the endpoint's ``sampler_logprobs``). ``AsyncRollouts``
            turns it on in its producer, where the sampler is a stale copy of the policy and the correction needs
            them: no forward pass to make.
            Off, a rollout carries none (the policy sampled itself: nothing to correct).
    """

    def __init__(
        self,
        generation_batch_size: int | None = None,
        share_prompt_cache: bool = True,
        packed_weights: bool = True,
        fused_layers: bool = True,
        cuda_graphs: bool = True,
        drop_finished_rows: bool = True,
        sampler_logps: bool = False,
    ) -> None:
        self.generation_batch_size = check_generation_batch_size(generation_batch_size)
        self.share_prompt_cache = share_prompt_cache
        self.packed_weights = packed_weights
        self.fused_layers = fused_layers
        self.cuda_graphs = cuda_graphs
        self.drop_finished_rows = drop_finished_rows
        self.sampler_logps = sampler_logps

    @override
    def problems(self, sampling: SamplingConfig) -> list[str]:
        if not sampling.generation_kwargs:
            return []
        return [
            f"sampling.generation_kwargs={sampling.generation_kwargs!r}: LeanDecode samples with sampling's own "
            "settings only (temperature, top_p, top_k, min_p, repetition_penalty); for generate's other options "
            "use rollout_engine: null (HFGenerate), or remove them"
        ]

    @override
    def generate(
        self,
        policy: Policy,
        prompts: list[Prompt],
        num_generations: int,
        sampling: SamplingConfig,
        greedy: bool,
        columns: dict[str, list[Any]] | None = None,
    ) -> Rollout:
        tokenizer, device = policy.tokenizer, policy.device
        prompt = tokenized_prompts(policy, prompts, sampling)  # no columns: LeanDecode takes no images
        prompt_ids, prompt_mask = prompt.ids.to(device), prompt.mask.to(device)  # [B, P]
        chunks = generation_chunks(len(prompts), num_generations, self.generation_batch_size)
        rows = (chunks[0].stop - chunks[0].start) * num_generations
        completions, logps = [], []
        with self.decoder(policy, rows, sampling) as decoder:
            for chunk in chunks:
                completions.append(
                    decoder(prompt_ids[chunk], prompt_mask[chunk], num_generations, greedy, self.share_prompt_cache)
                )
                logps.append(decoder.logps)
        completion_ids = pad_right(completions, tokenizer.pad_token_id)  # [N, T]
        return build_rollout(
            tokenizer,
            prompts,
            *prompt.repeated(num_generations, device),
            completion_ids,
            policy.eos_token_ids,
            num_generations,
            prompt.num_truncated,
            pad_right(logps, 0.0).float() if self.sampler_logps else None,
        )

    def complete(
        self, policy: Policy, contexts: list[list[int]], budgets: list[int], sampling: SamplingConfig, greedy: bool
    ) -> list[tuple[list[int], list[float] | None]]:
        """Each context's next turn, all in one decode loop (``OpenAIAgent``'s sampler), up to its EOS or budget.
        Sampler log-probs only with ``sampler_logps``: the policy samples itself in the trainer's process, so the
        trainer's recomputation is the behaviour policy and there is nothing for the correction to correct."""
        tokenizer = policy.tokenizer
        ids, mask = pad_rows(contexts, tokenizer.pad_token_id, left=True)  # [n, C]
        # under sharding every rank decodes as many steps (HF's synced_gpus does the same): the longest budget's
        turn = dataclasses.replace(sampling, max_completion_length=int(policy.ranks_max(max(budgets))[0]))
        with self.decoder(policy, len(contexts), turn) as decoder:
            new = decoder(ids.to(policy.device), mask.to(policy.device), 1, greedy, False)  # [n, t]
        logps = decoder.logps.tolist() if self.sampler_logps else None
        return cut_turns(new.tolist(), logps, budgets, policy.eos_token_ids)

    @contextlib.contextmanager
    def decoder(self, policy: Policy, rows: int, sampling: SamplingConfig) -> Iterator[Decoder]:
        """The decode loop of ``rows`` rows at a time over the policy's weights, as this engine's settings make it
        (packed or fused weights, finished rows dropped), for the length of the context."""
        with policy.generating() as model:
            with decode_weights(model, rows, self.packed_weights, self.fused_layers, self.cuda_graphs) as step:
                eos, pad_id, synced = policy.eos_token_ids, policy.tokenizer.pad_token_id, policy.synced_generation
                yield Decoder(
                    NextTokenLogits(model),
                    sampling,
                    eos,
                    pad_id,
                    synced,
                    step,
                    self.drop_finished_rows,
                    self.sampler_logps,
                )


@contextlib.contextmanager
def decode_weights(
    model: nn.Module, rows: int, packed: bool = True, fused: bool = True, graphs: bool = True
) -> Iterator[FusedDecodeStep | None]:
    """The weights a decode loop of ``rows`` rows runs against while the context lasts: ``graphs`` (on CUDA, for a
    ``graphable`` model), a ``GraphedDecodeStep``, yielded; on CPU ``packed``, pre-packed copies
    (``packed_linears``), and ``fused`` (with ``packed``, for a ``fusable`` model) also a ``FusedDecodeStep``,
    yielded, which holds the projections it concatenates itself (they get no packed copy). ``None`` otherwise.
    Under CPU autocast (``trainer.precision: bf16-mixed``) the packed copies are in autocast's dtype (bf16), and
    there is no ``FusedDecodeStep``, whose concatenated projections are fp32 in oneDNN's layout."""
    if graphs and graphable(model):
        yield GraphedDecodeStep(model, rows)
        return
    fused = packed and fused and fusable(model) and autocast_dtype() is None
    skip = list(fused_projections(model)) if fused else []
    with packed_linears(model, rows, skip) if packed else contextlib.nullcontext():
        yield FusedDecodeStep(model, rows) if fused else None


class NextTokenLogits:
    """``(input_ids, attention_mask, position_ids, cache) -> [n, V]`` fp32 logits of each row's last position:
    the model's own forward with ``logits_to_keep=1``, as ``generate`` calls it (so LoRA, logit scaling and
    soft-capping are the model's business)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.cache_keyword = cache_keyword(model.get_decoder())

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: DynamicCache) -> Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_keyword: cache},
        )
        return out.logits[:, -1].float()  # [n, V]


def narrowable(cache: DynamicCache | None) -> bool:
    """The cache's rows can be dropped: key/value layers only (transformers 5.24's ``batch_select_indices`` leaves
    a linear-attention layer's recurrent state, a hybrid layer's included, as it is). ``None``: a fused step's."""
    return cache is None or not any(isinstance(layer, RECURRENT_LAYERS) for layer in cache.layers)


def rows_to_keep(rows: int, left: int) -> int:
    """How many rows a batch of ``rows``, ``left`` of them not ended, narrows to: all of them (no narrowing) until
    a quarter have ended, and never fewer than one.

    Why a quarter: narrowing copies the kept rows' KV cache once, about what one step's attention reads of it;
    every later step then skips the dropped rows' attention, MLP and LM head. Dropping d >= rows / 4 while keeping
    k <= 3 rows / 4, the attention saved alone (d of k rows' worth a step) repays the copy within k / d <= 3 steps.
    Each narrowing keeps at most 3/4 of the rows, so a batch of N narrows at most log_{4/3} N times (10 for 16
    rows, 20 for 256) and copies at most 3/4 + 9/16 + ... = 3 batches' worth of cache in all.

    Never 0: under sharded generation every forward is a collective, and a rank whose rows have all ended steps
    until every rank's have; a forward of 0 rows is untested ground for models' mask and attention code, so the
    rank keeps one ended row (fed pad, its tokens discarded): 1/N of a step.
    """
    keep = max(left, 1)
    return keep if 4 * (rows - keep) >= rows else rows


class DecodeRows:
    """The rows of a batch of N that are in the decode batch, and their per-row state, narrowed together.

    Args:
        mask: [N, P+T] the prompt's mask, then one column per step.
        position: [N, 1] each row's first completion position.
        seen: [N, V] the ids of each row for the repetition penalty, or None.
        cache: the prefill's KV cache; None when ``fused`` holds the keys and values.
        fused: the decode step whose buffers hold the keys and values, or None.
    """

    def __init__(
        self,
        mask: Tensor,
        position: Tensor,
        seen: Tensor | None,
        cache: DynamicCache | None,
        fused: FusedDecodeStep | None,
    ) -> None:
        self.batch = len(mask)  # N
        self.ids = torch.arange(self.batch, device=mask.device)  # [n] the rows in the decode batch, in order
        self.mask, self.position, self.seen, self.cache, self.fused = mask, position, seen, cache, fused

    def keep(self, kept: Tensor, written: int) -> None:
        """Narrow to ``kept`` ([n'] positions in the decode batch, ascending); ``written``: KV columns so far."""
        self.ids, self.mask, self.position = self.ids[kept], self.mask[kept], self.position[kept]
        if self.seen is not None:
            self.seen = self.seen[kept]  # [n', V]
        if self.cache is not None:
            self.cache.batch_select_indices(kept)
        if self.fused is not None:
            self.fused.select(kept, written)


class Decoder:
    """Samples completions for one batch of prompts: prefill, then one forward per token until every row (on
    every rank, when ``synced``) has produced an EOS or ``max_completion_length`` tokens. ``drop_finished``:
    rows leave the forward's batch as they end (``rows_to_keep``); the tokens are the same either way.
    ``record_logps``: ``logps`` holds the [N, t] log-probs of the last call's tokens under ``softmax(logits / T)``,
    the trainer's distribution, not the filtered one they were drawn from (0 after a row ended)."""

    def __init__(
        self,
        forward: NextTokenLogits,
        sampling: SamplingConfig,
        eos_ids: list[int],
        pad_id: int,
        synced: bool,
        fused: FusedDecodeStep | None = None,
        drop_finished: bool = True,
        record_logps: bool = False,
    ) -> None:
        self.forward, self.sampling, self.pad_id, self.synced = forward, sampling, pad_id, synced
        self.eos_ids, self.fused, self.drop_finished = eos_ids, fused, drop_finished
        self.record_logps, self.logps = record_logps, None

    def __call__(
        self, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int, greedy: bool, share_prompt: bool
    ) -> Tensor:
        """[b * G, t] completion ids (pad after a row's EOS) for [b, P] left-padded prompts; rows are grouped."""
        n, width, steps = len(prompt_ids) * group_size, prompt_ids.shape[1], self.sampling.max_completion_length
        mask = prompt_mask.new_ones(n, width + steps)  # [N, P+T]: the prompt's, then one column per step
        mask[:, :width] = prompt_mask.repeat_interleave(group_size, dim=0)
        logits, cache = self.prefill(prompt_ids, prompt_mask, group_size, share_prompt)  # [N, V]
        forward = self.forward
        if self.fused is not None:  # the decode steps write into buffers of every column instead
            forward, cache = self.fused.bind(cache, width + steps), None
        position = mask[:, :width].sum(dim=1, keepdim=True)  # [N, 1] the next token's position
        seen = self.seen_ids(prompt_ids.repeat_interleave(group_size, dim=0), logits.shape[1])  # [N, V] or None
        rows, drop = DecodeRows(mask, position, seen, cache, self.fused), self.drop_finished and self.narrows(cache)
        check_every = 1 if prompt_ids.device.type == "cpu" else STOP_CHECK_EVERY
        eos = torch.tensor(self.eos_ids, device=prompt_ids.device)
        unfinished = torch.ones(n, dtype=torch.bool, device=prompt_ids.device)  # [N]
        tokens, logps = [], []
        for step in range(steps):
            token = self.sample(logits, rows, unfinished, greedy, logps)  # [N]
            tokens.append(token)
            unfinished &= ~torch.isin(token, eos)
            if step == steps - 1 or (step % check_every == check_every - 1 and self.all_done(unfinished)):
                break
            if drop:
                self.drop_ended(rows, unfinished, width + step)
            decoded = token.index_select(0, rows.ids).unsqueeze(1)  # [n, 1]
            logits = forward(decoded, rows.mask[:, : width + step + 1], rows.position + step, rows.cache)  # [n, V]
        self.logps = torch.stack(logps, dim=1) if self.record_logps else None  # [N, t]
        return torch.stack(tokens, dim=1)  # [N, t]

    def sample(self, logits: Tensor, rows: DecodeRows, unfinished: Tensor, greedy: bool, logps: list) -> Tensor:
        """[N] next ids: drawn from the [n, V] logits of the decode batch's rows (random numbers for all N, so a
        row's draw is the same whichever rows are in the batch), pad on rows that have ended; ``seen`` updated;
        with ``record_logps``, each id's log-prob appended to ``logps`` ([N], 0 on rows that have ended)."""
        scores = sampling_logits(logits, self.sampling, greedy, rows.seen)  # [n, V]
        drawn = draw(scores, greedy, rows.ids, rows.batch)  # [n]
        if self.record_logps:
            logp = drawn_logps(logits, drawn, self.sampling.temperature)  # [n] unfiltered: the trainer's
            logps.append(torch.zeros(len(unfinished), device=logp.device).index_copy_(0, rows.ids, logp) * unfinished)
        token = torch.full_like(unfinished, self.pad_id, dtype=torch.long).index_copy_(0, rows.ids, drawn)  # [N]
        token.masked_fill_(~unfinished, self.pad_id)
        if rows.seen is not None:
            rows.seen.scatter_(1, token.index_select(0, rows.ids).unsqueeze(1), True)
        return token

    def drop_ended(self, rows: DecodeRows, unfinished: Tensor, written: int) -> None:
        """Narrow the decode batch to its unfinished rows when ``rows_to_keep`` says it pays."""
        batch, left = len(rows.ids), int(unfinished.sum())
        keep = rows_to_keep(batch, left)
        if keep == batch:
            return
        in_batch = unfinished.index_select(0, rows.ids)  # [n] unfinished, by position in the decode batch
        kept = in_batch.nonzero().squeeze(1) if left else in_batch.new_zeros(1, dtype=torch.long)  # [keep]
        rows.keep(kept, written)

    def prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int, share_prompt: bool
    ) -> tuple[Tensor, DynamicCache]:
        """[N, V] first-token logits and the cache of the N = b * G prompt rows. Shared: the b prompts run once
        and their cache is repeated G times along the batch (the G rows of a group are the same prompt)."""
        if not share_prompt:
            prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0)
            prompt_mask = prompt_mask.repeat_interleave(group_size, dim=0)
        # generate's positions: padding skipped, and position 1 on pad tokens (masked out either way)
        position_ids = (prompt_mask.cumsum(dim=1) - 1).masked_fill_(prompt_mask == 0, 1)  # [b, P]
        cache = DynamicCache(config=self.forward.model.config)
        logits = self.forward(prompt_ids, prompt_mask, position_ids, cache)  # [b, V]
        if share_prompt and group_size > 1:
            cache.batch_repeat_interleave(group_size)
            logits = logits.repeat_interleave(group_size, dim=0)
        return logits, cache

    def seen_ids(self, row_ids: Tensor, vocab_size: int) -> Tensor | None:
        """[N, V] True at every id of each row (padding included, as ``generate`` penalises it), or None when
        there is no repetition penalty."""
        if self.sampling.repetition_penalty == 1.0:
            return None
        seen = torch.zeros(row_ids.shape[0], vocab_size + 1, dtype=torch.bool, device=row_ids.device)
        return seen.scatter_(1, row_ids.clamp(max=vocab_size), True)[:, :vocab_size]  # ids past the head: dropped

    def narrows(self, cache: DynamicCache | None) -> bool:
        """The decode batch can drop the rows that ended: the cache allows it, and the fused step (if any) too."""
        return narrowable(cache) and (self.fused is None or self.fused.narrows)

    def all_done(self, unfinished: Tensor) -> bool:
        """Every row has ended; under sharding, on every rank (one small all-reduce a step)."""
        left = unfinished.any().to(torch.int32)
        if self.synced:
            dist.all_reduce(left)  # SUM of the ranks' flags: 0 only when all are done
        return int(left) == 0
