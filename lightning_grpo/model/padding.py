"""Left-padded prompts + right-padded completions -> the token layouts of the log-prob forward that skip padding.

Knows attention masks and positions; nothing about models, log-probs or losses. Two layouts:

- ``trim_padding``: the padded batch without the columns no row needs (leading columns that are padding in every
  row, trailing ones past every row's last completion token). Exact: a causal model never reads a later column,
  and a column of padding is a masked key for every row. A micro-batch of rows of similar lengths
  (``update.micro_batch_tokens``) then pays for little padding.
- ``pack_rows``: every real token of the micro-batch in one sequence, each row's positions starting at 0 (verl's
  ``use_remove_padding``, OpenRLHF's ``packing_samples``). Without a shared prompt the rows are told apart by
  their positions alone (``attention_mask=None``): transformers then builds a block-diagonal causal mask for
  sdpa and eager attention, and flash-attention runs variable-length kernels, so no pair of rows costs
  attention. With ``share_prompt`` each group's prompt is packed once and its G completions after it (Prefix
  Grouper, composed), which positions cannot express: an explicit ``[1, 1, S, S]`` mask says that a completion
  reads its group's prompt and its own past (sdpa and eager attention only).

On CPU the block-diagonal mask is computed densely (``S**2`` scores a layer and head, where the padded batch has
``n * L**2``); the MLP, the projections and the LM head run on real tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_grpo.model.prefix import prompt_runs
from lightning_grpo.types import HostRows


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """[n, L] positions that skip left padding, as ``generate`` assigns them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass(frozen=True)
class RowPlan:
    """What a log-prob forward over some rows decides from their lengths, given by the host (``Rollout.host``),
    so that deciding it does not wait for the device: the columns it keeps, the rows that share a prompt, how many
    completion tokens it scores, and whether its kept columns hold padding."""

    columns: tuple[int, int]  # (first column, completion width T'), as ``trim_padding`` finds them
    runs: list[int]  # [U] the rows of each run of consecutive rows with one prompt (``prefix.prompt_runs``)
    tokens: int  # m: the rows' completion tokens (their completion masks' sum)
    padded: bool = True  # some kept column of some row is padding
    prompt_padded: bool = True  # some kept prompt column of some row is padding


def row_plan(host: HostRows, rows: slice | list[int] | Tensor) -> RowPlan:
    """The ``RowPlan`` of ``rows`` of a rollout whose rows the host knows (``Rollout.host``)."""
    picked = host.rows(rows)
    (first, width), completion = host.columns(picked), sum(len(host.completion_ids[i]) for i in picked)
    prompt = sum(len(host.prompt_ids[i]) for i in picked)  # real prompt tokens, all in the kept columns
    prompt_width = host.prompt_width - first
    return RowPlan(
        columns=(first, width),
        runs=host.runs(picked),
        tokens=completion,
        padded=prompt + completion != len(picked) * (prompt_width + width),
        prompt_padded=prompt != len(picked) * prompt_width,
    )


# Causal LMs whose decoder keeps packed rows apart by their position ids (``pack_rows`` passes no attention mask):
# each is in tests/model/test_packing_families.py, packed log-probs equal to the padded forward's. Others are
# refused: OPT, BLOOM and MPT let packed rows attend to each other (log-probs off by 1e-3 to 1e-1, silently).
PACKED_ROWS_APART = frozenset(
    {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "llama", "mistral", "mixtral", "phi", "phi3", "gpt2", "gpt_neox"}
    | {"falcon", "gemma", "gemma2"}
)


def packing_problem(padding_free: bool, model_config: Any) -> str | None:
    """Why ``policy.padding_free`` cannot pack this model's rows (``None``: it can, or packing is off)."""
    model_type = getattr(model_config, "model_type", None)
    if not padding_free or model_type in PACKED_ROWS_APART:
        return None
    return (
        f"policy.padding_free=True packs rows into one sequence, but model type {model_type!r} is not known to keep "
        f"packed rows apart (their tokens would attend to each other, silently changing the log-probs). Model types "
        f"it packs: {', '.join(sorted(PACKED_ROWS_APART))}. Set policy.padding_free: false (the padded forward, "
        "trimmed of shared padding, gives the same log-probs)"
    )


# Causal LMs whose decoder reads its attention mask only through transformers' ``create_causal_mask`` (which takes
# a prepared [n, 1, L, L] mask as it is): ``prepared_mask`` is given to these alone. Others (ALiBi models that
# read the 2D mask for their biases, sliding windows, chunked attention) get the 2D mask as before.
PREPARED_MASK_MODELS = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3"})


def takes_prepared_mask(config: Any) -> bool:
    """Whether a decoder of ``config`` (a text config) is given ``prepared_mask`` instead of its 2D mask: one of
    ``PREPARED_MASK_MODELS``, sdpa or eager attention, every layer full causal attention."""
    windowed = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return (
        getattr(config, "model_type", None) in PREPARED_MASK_MODELS
        and getattr(config, "_attn_implementation", None) in ("sdpa", "eager")
        and set(getattr(config, "layer_types", None) or ["full_attention"]) == {"full_attention"}
        and not windowed
        and not getattr(config, "attention_chunk_size", None)
    )


def prepared_mask(attention_mask: Tensor, config: Any, dtype: torch.dtype) -> Tensor:
    """[n, 1, L, L] the causal mask with padding that transformers builds from ``attention_mask`` [n, L] for a
    forward without a cache: boolean for sdpa (True where a query reads a key), additive for eager attention (0 or
    the dtype's minimum). Built here, for rows the host knows to be padded (``RowPlan.padded``): transformers would
    first check on the device whether there is padding, a read that makes the host wait for the device each
    forward.

    >>> prepared_mask(torch.tensor([[0, 1, 1]]), None, torch.float32)[0, 0].int().tolist()
    [[0, 0, 0], [0, 1, 0], [0, 1, 1]]
    """
    width = attention_mask.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=attention_mask.device).tril()  # [L, L] query x key
    mask = (causal & attention_mask.bool().unsqueeze(1)).unsqueeze(1)  # [n, 1, L, L]
    if getattr(config, "_attn_implementation", None) != "eager":
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def trim_padding(
    input_ids: Tensor, attention_mask: Tensor, completion_length: int, columns: tuple[int, int] | None = None
) -> tuple[Tensor, Tensor, int]:
    """(ids [n, P'+T'], mask [n, P'+T'], T'): the columns some row needs; at least the last prompt column (it
    predicts the first completion token) and one completion column. ``columns``: (first column, T') when the host
    knows them (``RowPlan``); found on the device otherwise (one read).

    >>> ids = torch.tensor([[0, 5, 6, 7, 0], [0, 0, 5, 8, 0]])
    >>> mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 0]])
    >>> trim_padding(ids, mask, 2)[0].tolist(), trim_padding(ids, mask, 2)[2], trim_padding(ids, mask, 2, (1, 1))[2]
    ([[5, 6, 7], [0, 5, 8]], 1, 1)
    """
    prompt_width = input_ids.shape[1] - completion_length
    first, width = _used_columns(attention_mask, prompt_width) if columns is None else columns  # width is T'
    columns = slice(first, prompt_width + width)
    return input_ids[:, columns], attention_mask[:, columns], width


def _used_columns(attention_mask: Tensor, prompt_width: int) -> tuple[int, int]:
    """(first column, T') of ``trim_padding``, found on the device: one read."""
    used = attention_mask.bool().any(dim=0)  # [P+T]
    prompt_used, completion_used = used[:prompt_width], used[prompt_width:]
    first = torch.where(prompt_used.any(), prompt_used.long().argmax(), prompt_width - 1)
    last = (completion_used * torch.arange(1, len(completion_used) + 1, device=used.device)).max()  # 0: none
    first, width = torch.stack([first, last.clamp(min=1)]).tolist()
    return first, width


def forward_positions(
    input_ids: Tensor, attention_mask: Tensor, completion_length: int, share_prompt: bool, packed: bool
) -> Tensor:
    """Token positions the log-prob forward runs for these rows (the decoder's work, one micro-batch), as a 0-d
    tensor on their device (no host read: a step's statistics are read together): the columns ``trim_padding``
    keeps, then rows x columns (padded) or the real tokens (``packed``); with ``share_prompt`` each run of rows with
    one prompt counts that prompt once (``model.prefix``). The trimmed columns are padding in every row, so runs
    and tokens are those of the untrimmed rows.

    >>> ids = torch.tensor([[0, 5, 6, 7, 0], [0, 5, 6, 8, 9]])  # one prompt (0 5 6), completions of 1 and 2 tokens
    >>> mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]])
    >>> [int(forward_positions(ids, mask, 2, share, packed)) for share in (False, True) for packed in (False, True)]
    [8, 7, 6, 5]
    """
    prompt_width = input_ids.shape[1] - completion_length
    used = attention_mask.bool().any(dim=0)  # [P+T]
    column = torch.arange(len(used), device=used.device)  # [P+T]
    first = torch.where(used[:prompt_width].any(), used[:prompt_width].long().argmax(), prompt_width - 1)
    width = (used[prompt_width:] * (column[prompt_width:] - prompt_width + 1)).max().clamp(min=1)  # T'
    kept = (column >= first) & (column < prompt_width + width)  # [P+T] the columns trim_padding keeps
    prompt = attention_mask[:, :prompt_width]  # [n, P]
    rows = torch.ones(len(prompt), dtype=torch.bool, device=prompt.device)  # [n] rows whose prompt is counted
    if share_prompt:  # the first row of each run of equal prompts (``prefix.prompt_runs``'s rule)
        whole = torch.cat([input_ids[:, :prompt_width], prompt.to(input_ids.dtype)], dim=1)  # [n, 2P]
        rows[1:] = (whole[1:] != whole[:-1]).any(dim=1)
    if packed:
        return (prompt * rows.unsqueeze(1)).sum() + attention_mask[:, prompt_width:].sum()
    return rows.sum() * kept[:prompt_width].sum() + len(rows) * kept[prompt_width:].sum()


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch as one sequence of its S real tokens."""

    input_ids: Tensor  # [1, S]
    position_ids: Tensor  # [1, S] each row's own positions (a group's completions continue its prompt's)
    attention_mask: Tensor | None  # [1, 1, S, S] additive (0 or the dtype's min); None: rows told by positions
    index: Tensor  # [m] the packed token whose hidden state predicts each completion token, row-major


def pack_rows(
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    share_prompt: bool,
    dtype: torch.dtype,
    runs: list[int] | None = None,
) -> PackedRows:
    """The real tokens of ``input_ids`` [n, P+T] packed, a group's prompt once when ``share_prompt``.

    Args:
        attention_mask: [n, P+T] 1 on real tokens (left-padded prompt, right-padded completion).
        completion_length: T.
        dtype: of the additive mask (the model's).
        runs: [U] the rows of each run with one prompt, when the host knows them (``prefix.prompt_runs``).
    """
    n, width = input_ids.shape
    prompt_width = width - completion_length
    rows = torch.arange(n, device=input_ids.device)
    keep = attention_mask.bool().clone()  # [n, P+T] tokens packed
    owner = rows.unsqueeze(1).repeat(1, width)  # [n, P+T] the row whose copy of a token each row reads
    if share_prompt:
        first, counts = prompt_runs(input_ids[:, :prompt_width], attention_mask[:, :prompt_width], runs)
        leader = first.repeat_interleave(counts, output_size=n)  # [n] first row of each row's group
        keep[:, :prompt_width] &= (leader == rows).unsqueeze(1)
        owner[:, :prompt_width] = leader.unsqueeze(1)
    slot = keep.flatten().cumsum(0).view(n, width) - 1  # [n, P+T] packed index of each kept token
    read = slot.gather(0, owner)  # [n, P+T] packed index of the token (row, column) reads
    targets = attention_mask[:, prompt_width:].bool()  # [n, T]
    positions = position_ids_from_mask(attention_mask)  # [n, P+T]
    return PackedRows(
        input_ids=input_ids[keep].unsqueeze(0),
        position_ids=positions[keep].unsqueeze(0),
        attention_mask=_group_mask(keep, leader, positions, prompt_width, dtype) if share_prompt else None,
        index=read[:, prompt_width - 1 : -1][targets],
    )


def _group_mask(keep: Tensor, leader: Tensor, positions: Tensor, prompt_width: int, dtype: torch.dtype) -> Tensor:
    """[1, 1, S, S] additive: a token reads the earlier tokens of its group's prompt and of its own completion."""
    n, width = keep.shape
    row = torch.arange(n, device=keep.device).unsqueeze(1).expand(n, width)[keep]  # [S]
    in_prompt = (torch.arange(width, device=keep.device) < prompt_width).expand(n, width)[keep]  # [S]
    group = leader[row]  # [S]
    branch = torch.where(in_prompt, -1, row)  # [S] -1: the group's shared prompt
    pos = positions[keep]  # [S]
    allowed = (group.unsqueeze(1) == group) & (pos <= pos.unsqueeze(1))  # [S, S] query x key
    allowed &= (branch == -1) | (branch == branch.unsqueeze(1))
    mask = torch.zeros(allowed.shape, dtype=dtype, device=keep.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]
