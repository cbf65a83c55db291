"""Rows that share their prompt -> the decoder's hidden states of their completions, each distinct prompt encoded
once (Prefix Grouper, arXiv:2506.05433). Knows the decoder and its KV cache; nothing about log-probs or losses.

The G rows of a GRPO group repeat one prompt, and the plain forward encodes it G times. Here each run of rows with
the same prompt (ids and padding) runs the prompt once, keeping its keys and values; they are repeated once per
row and the completions attend to them, as a decoder attends to its cache while generating. The attention is split
as in the paper (the prompt attends to itself, the completion to the prompt and to its own past), every row
sees exactly the keys and values of the plain forward, and autograd carries the gradients of the G completions
back through the repeat into the one prompt pass: values and gradients equal the plain forward's to rounding.

Cost of a group of G rows with P prompt and T completion tokens: P + G * T token positions instead of
G * (P + T); for a 300-token prompt, 16-token completions and G = 8, 428 instead of 2,528.

Not with activation checkpointing (the checkpointed layers drop the cache) or a sliding-window cache (it would drop
prompt keys that the plain forward attends to).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable

import torch
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def prompt_runs(prompt_ids: Tensor, prompt_mask: Tensor, runs: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """[U] first row and [U] length of each run of consecutive rows with the same prompt ids and mask, on the rows'
    device: from ``runs`` (the lengths, known on the host: ``Rollout.host``) without waiting for the device, or
    found on the device (a host read: the number of runs is a shape).

    Args:
        prompt_ids: [n, P] left-padded prompts.
        prompt_mask: [n, P].
        runs: [U] the run lengths, when the host knows them.
    """
    if runs is not None:
        first = [0, *itertools.accumulate(runs)][:-1]
        both = torch.tensor([first, runs], dtype=torch.long)  # [2, U]
        if prompt_ids.is_cuda:  # a copy from pinned memory does not wait for the device's queue
            both = both.pin_memory()
        both = both.to(prompt_ids.device, non_blocking=True)
        return both[0], both[1]
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)  # [n, 2P]
    starts = torch.ones(len(rows), dtype=torch.bool, device=rows.device)  # [n]
    starts[1:] = (rows[1:] != rows[:-1]).any(dim=1)
    first = starts.nonzero().squeeze(1)  # [U]
    counts = torch.diff(first, append=torch.tensor([len(rows)], device=rows.device))  # [U]
    return first, counts


@functools.cache
def _cache_keyword_of(forward_class: type) -> str:
    parameters = inspect.signature(forward_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_keyword(decoder: nn.Module) -> str:
    """The name a decoder's forward takes its KV cache by: ``cache`` from transformers 5.2x (which warns about
    ``past_key_values``), ``past_key_values`` before. A causal LM's forward names it as its decoder's does."""
    return _cache_keyword_of(type(decoder))


def has_sliding_window(config) -> bool:
    """Whether a model's attention has sliding-window layers (``layer_types``, or Qwen2's ``use_sliding_window``):
    its cache drops prompt keys, so a shared prompt pass is not exact for it."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return "sliding_attention" in (getattr(text, "layer_types", None) or []) or bool(
        getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None)
    )


def repeat_cache(cache: DynamicCache, counts: Tensor, rows: int) -> None:
    """Each of the U cached prompts repeated ``counts[u]`` times along the batch (differentiably), ``rows`` in all
    (given, so that the repeat does not read ``counts`` back for its size)."""
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"shared_prefix needs a full KV cache per layer; this model's has a {type(layer).__name__} (a "
                "sliding window, which drops prompt keys): use shared_prefix=False"
            )
        layer.keys = layer.keys.repeat_interleave(counts, dim=0, output_size=rows)  # [n, heads, P, head_dim]
        layer.values = layer.values.repeat_interleave(counts, dim=0, output_size=rows)


def shared_prefix_hidden(
    decoder: nn.Module,
    config,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    completion_length: int,
    runs: list[int] | None = None,
    prompt_attention: Callable[[Tensor], Tensor | None] | None = None,
) -> Tensor:
    """[n, T, H] hidden states that predict each completion token, the prompt of each run of rows encoded once.

    Args:
        decoder: the model's decoder (``get_decoder()``), called with a KV cache.
        config: the model's (text) config, for the cache.
        input_ids: [n, P+T] prompt then completion.
        attention_mask: [n, P+T].
        position_ids: [n, P+T] the plain forward's positions.
        completion_length: T.
        runs: [U] the rows of each run with one prompt, when the host knows them (``prompt_runs``).
        prompt_attention: what the prompt pass's decoder is given for the prompts' [U, P] mask: the mask itself when
            ``None`` (``model.logprobs`` gives the prepared causal mask, or no mask, when the host knows).
    """
    width, n = input_ids.shape[1] - completion_length, len(input_ids)  # P, n
    first, counts = prompt_runs(input_ids[:, :width], attention_mask[:, :width], runs)
    cache = DynamicCache(config=config)
    prompt = decoder(
        input_ids=input_ids[first, :width],
        attention_mask=(prompt_attention or _itself)(attention_mask[first, :width]),
        position_ids=position_ids[first, :width],
        use_cache=True,
        **{cache_keyword(decoder): cache},
    ).last_hidden_state  # [U, P, H]
    repeat_cache(cache, counts, n)
    completion = decoder(
        input_ids=input_ids[:, width:],
        attention_mask=attention_mask,  # [n, P+T]: the prompt's padding stays masked
        position_ids=position_ids[:, width:],
        use_cache=True,
        **{cache_keyword(decoder): cache},
    ).last_hidden_state  # [n, T, H]
    last_prompt = prompt[:, -1:].repeat_interleave(counts, dim=0, output_size=n)  # [n, 1, H] predicts token 1
    return torch.cat([last_prompt, completion[:, :-1]], dim=1)  # [n, T, H]


def _itself(mask: Tensor) -> Tensor:
    return mask
