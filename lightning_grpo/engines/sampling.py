"""Next-token logits -> sampled token ids, with the distribution of Hugging Face ``generate``.

Knows logits and the ``SamplingConfig``; nothing about models or caches. The filters are ``generate``'s, in its
order (transformers 5: repetition penalty, then temperature, top-k, top-p, min-p), with the same tie rules, so the
filtered distribution equals ``generate``'s to rounding. Only the draw differs: ``torch.multinomial`` makes a random
number per vocabulary entry (13-16 ms for [16, 32000] on 2 CPU cores, as much as the LM head); inverse CDF makes
one per row (softmax, cumulative sum, one uniform, ``searchsorted``) and draws from the same distribution.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.rollout import SamplingConfig


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


def sample_inverse_cdf(logits: Tensor) -> Tensor:
    """[N] ids drawn from ``softmax(logits)`` with one uniform per row: the first id whose cumulative
    probability exceeds ``u * total``. A filtered id (probability 0) adds nothing to the cumulative sum, so
    it can never be the first to exceed it."""
    cdf = logits.softmax(dim=-1).cumsum_(dim=-1)  # [N, V]
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]  # [N, 1]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)


def next_tokens(logits: Tensor, sampling: SamplingConfig, greedy: bool, seen: Tensor | None = None) -> Tensor:
    """[N] next ids from [N, V] fp32 logits: the argmax when greedy, else a draw from the filtered distribution."""
    scores = sampling_logits(logits, sampling, greedy, seen)
    return scores.argmax(dim=-1) if greedy else sample_inverse_cdf(scores)
