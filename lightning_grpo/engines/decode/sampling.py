"""Next-token logits -> sampled token ids, with the distribution of Hugging Face ``generate``.

Knows logits and the ``SamplingConfig``; nothing about models or caches. The filters are ``generate``'s, in its
order (transformers 5: repetition penalty, then temperature, top-k, top-p, min-p), with the same tie rules, so the
filtered distribution equals ``generate``'s to rounding. Only the draw differs: ``torch.multinomial`` makes a random
number per vocabulary entry (13-16 ms for [16, 32000] on 2 CPU cores, as much as the LM head); inverse CDF makes
one per row (``sample_inverse_cdf``) and draws from the same distribution. Each row's random number is its own:
a loop that decodes only some ``rows`` of a batch draws for the whole batch and keeps those rows' numbers, so the
tokens do not depend on which rows are still being decoded.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_grpo.engines.config import SamplingConfig


def penalise_repeats(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty on every token already in the row (prompt, its padding and the completion), as
    ``generate`` applies it: positive logits divided by ``penalty``, negative ones multiplied.

    Args:
        logits: [N, V] fp32.
        seen: [N, V] bool, True for every id in the row so far.
    """
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)  # [N, V]
    return torch.where(seen, penalised, logits)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """-inf below the k-th largest logit; ties with it are kept (``TopKLogitsWarper``)."""
    kth = torch.topk(logits, min(k, logits.shape[-1])).values[..., -1:]  # [N, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """-inf on the least likely tokens whose total probability is at most 1 - top_p; the most likely token
    always stays (``TopPLogitsWarper``: an ascending sort, so equal logits are cut in its order)."""
    sorted_logits, order = torch.sort(logits, descending=False)  # [N, V]
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [N, V]
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, float("-inf"))


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """-inf on tokens less likely than ``min_p`` times the most likely one (``MinPLogitsWarper``)."""
    probs = logits.softmax(dim=-1)  # [N, V]
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(remove, float("-inf"))


def sampling_logits(logits: Tensor, sampling: SamplingConfig, greedy: bool, seen: Tensor | None = None) -> Tensor:
    """``generate``'s processed scores: the repetition penalty (also when greedy), then, when sampling, the
    warpers it enables (temperature != 1, top_k != 0, top_p < 1, min_p set).

    Args:
        logits: [N, V] fp32 next-token logits (not modified).
        seen: [N, V] bool, the ids of each row so far; needed when ``repetition_penalty != 1``.
    """
    if sampling.repetition_penalty != 1.0:
        logits = penalise_repeats(logits, seen, sampling.repetition_penalty)
    if greedy:
        return logits
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    if sampling.top_k:
        logits = top_k_filter(logits, sampling.top_k)
    if sampling.top_p < 1.0:
        logits = top_p_filter(logits, sampling.top_p)
    if sampling.min_p is not None:
        logits = min_p_filter(logits, sampling.min_p)
    return logits


def row_uniforms(like: Tensor, rows: Tensor | None = None, batch: int | None = None) -> Tensor:
    """[n, 1] uniforms in [0, 1) for the n rows of ``like`` ([n, ...]): with ``rows`` ([n] ids in a batch of
    ``batch``), ``batch`` are drawn and those rows' kept, so the random stream advances as for the whole batch and
    batch row i always gets the i-th number."""
    if rows is None:
        return torch.rand(like.shape[0], 1, device=like.device, dtype=like.dtype)
    return torch.rand(batch, 1, device=like.device, dtype=like.dtype).index_select(0, rows)  # [n, 1]


def sample_inverse_cdf(
    logits: Tensor, block: int = 256, rows: Tensor | None = None, batch: int | None = None
) -> Tensor:
    """[N] ids drawn from ``softmax(logits)`` with one uniform per row, by inverse CDF in two levels: a block of
    ``block`` ids chosen by the cumulative mass of the blocks, then an id inside it by the cumulative mass of its
    ids. Exactly the softmax's distribution (up to rounding), with no cumulative sum over the whole vocabulary:
    that sum is sequential, and took longer than the softmax ([16, 32000], 1 thread: 0.8 ms -> 0.4 ms a draw).

    An id of probability 0 (filtered to -inf, or block padding) never increases a cumulative sum, so it is never
    the first to exceed the target; the target inside the block is a fraction < 1 of the block's own total.
    ``rows``, ``batch``: as in ``row_uniforms``, the rows of a larger batch that ``logits`` holds.
    """
    n, vocab = logits.shape
    probs = logits.softmax(dim=-1)  # [N, V] (a faster exp than torch.exp's)
    blocks = (nn.functional.pad(probs, (0, -vocab % block)) if vocab % block else probs).view(n, -1, block)
    block_cdf = blocks.sum(dim=-1).cumsum_(dim=-1)  # [N, K]
    target = row_uniforms(block_cdf, rows, batch) * block_cdf[:, -1:]  # [N, 1] u * total
    k = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)  # [N, 1]
    below = torch.where(k > 0, block_cdf.gather(1, (k - 1).clamp_(min=0)), 0.0)  # [N, 1] mass before block k
    mass = block_cdf.gather(1, k) - below  # [N, 1]
    fraction = ((target - below) / mass).clamp_(0.0, 1.0 - 2**-23)  # [N, 1] where the target falls in block k
    inner = blocks.gather(1, k.unsqueeze(-1).expand(n, 1, block)).squeeze(1).cumsum_(dim=-1)  # [N, b]
    j = torch.searchsorted(inner, fraction * inner[:, -1:], right=True).clamp_(max=block - 1)  # [N, 1]
    return (k * block + j).squeeze(1)


def draw(scores: Tensor, greedy: bool, rows: Tensor | None = None, batch: int | None = None) -> Tensor:
    """[N] next ids from [N, V] processed scores (``sampling_logits``): the argmax when greedy, else a draw from
    their distribution.

    Args:
        rows: [N] ids of the scores' rows in a batch of ``batch`` rows: the draw takes ``batch`` random numbers and
            keeps theirs, as if the whole batch were sampled. ``None``: the N rows are the batch.
    """
    return scores.argmax(dim=-1) if greedy else sample_inverse_cdf(scores, rows=rows, batch=batch)


def drawn_logps(logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
    """[N] the sampler's log-prob of each drawn id under the distribution the trainer scores,
    ``softmax(logits / temperature)``: before the repetition penalty and the top-k/top-p/min-p filters, so that a
    sampler that is the current policy gives every token an importance ratio of exactly 1 whatever the filters
    (``references/concepts.md``, "Sampling filters and the correction").

    Args:
        logits: [N, V] fp32 next-token logits as the model gave them (not ``sampling_logits``' scores).
        ids: [N] the drawn ids.
    """
    scaled = logits if temperature == 1.0 else logits / temperature  # [N, V]
    return scaled.log_softmax(dim=-1).gather(1, ids.unsqueeze(1)).squeeze(1)
