"""The records the stages hand each other: ``PromptBatch`` (data -> rollout), ``Rollout`` (rollout -> rewards and
the loss), ``RewardScores`` (rewards -> advantages), and ``Collectives``, what a record needs of the ranks."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Protocol

import torch
from torch import Tensor

from lightning_grpo.types.host import HostRows, pad_rows
from lightning_grpo.types.signal import weighted_total, without_signal
from lightning_grpo.types.text import Prompt


class Collectives(Protocol):
    """The data-parallel collectives a stage's record needs (``ranks.Ranks``); with one process, the identity."""

    world_size: int

    def sum(self, t: Tensor) -> Tensor: ...

    def gather_rows(self, t: Tensor) -> Tensor: ...


def _padded(rows: list[list] | None, value: float, dtype: torch.dtype = torch.long) -> Tensor | None:
    return None if rows is None else pad_rows(rows, value, dtype=dtype, min_width=1)[0]


def fields_of(obj: Any) -> dict[str, Any]:
    """A dataclass's fields by name, one level deep: what a checkpoint holds (``torch.load(weights_only=True)``
    reads back dicts, lists and tensors), rebuilt with ``type(obj)(**fields)``."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _rows(t: Tensor | None, rows: Tensor) -> Tensor | None:
    return None if t is None else t[rows]


Vision = dict[str, list[Tensor | None]]  # name -> [N] each row's vision inputs, its images along dim 0; None: no image


def vision_rows(vision: Vision | None, rows: slice | Tensor) -> dict[str, Tensor]:
    """Per-row vision inputs -> those of ``rows`` for one forward, as the processor batches them: each name's tensors
    concatenated along dim 0, every later dim zero-padded to the largest (Idefics3's images split into different tile
    counts: an all-zero tile is padding to the model). Rows without images add nothing, and a name that no row of
    ``rows`` has is left out: a forward of text-only rows is a text forward (TRL's per-row image count).

    >>> a, b = torch.ones(1, 3, 2), torch.ones(1, 1, 2)  # one image each: 3 tiles, 1 tile
    >>> vision_rows({"pixel_values": [a, None, b]}, slice(0, 3))["pixel_values"].sum(-1)
    tensor([[2., 2., 2.],
            [2., 0., 0.]])
    >>> vision_rows({"pixel_values": [a, None, b]}, slice(1, 2))
    {}
    """
    if vision is None:
        return {}
    picked = range(len(next(iter(vision.values()), [])))[rows] if isinstance(rows, slice) else rows.tolist()
    found = {name: [per_row[i] for i in picked if per_row[i] is not None] for name, per_row in vision.items()}
    return {name: _padded_cat(tensors) for name, tensors in found.items() if tensors}


def _padded_cat(tensors: list[Tensor]) -> Tensor:
    """[n_i, *S_i] -> [sum n_i, *max S_i], zeros after each tensor's own extent (a processor's batch padding)."""
    if all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
        return torch.cat(tensors)
    shape = [max(sizes) for sizes in zip(*(t.shape[1:] for t in tensors))]
    out = tensors[0].new_zeros(sum(len(t) for t in tensors), *shape)
    start = 0
    for t in tensors:
        out[(slice(start, start + len(t)), *(slice(0, s) for s in t.shape[1:]))] = t
        start += len(t)
    return out


def _picked(vision: Vision | None, picked: list[int]) -> Vision | None:
    return None if vision is None else {k: [v[i] for i in picked] for k, v in vision.items()}


def _cat_vision(a: Vision | None, b: Vision | None, len_a: int, len_b: int) -> Vision | None:
    """Two rollouts' rows of vision inputs, one after the other; a name one of them lacks is ``None`` in its rows."""
    if a is None and b is None:
        return None
    a, b = a or {}, b or {}
    return {k: a.get(k, [None] * len_a) + b.get(k, [None] * len_b) for k in {**a, **b}}


def _cat(a: Tensor | None, b: Tensor | None, value: float, left: bool = False) -> Tensor | None:
    """[n, Ta] and [m, Tb] -> [n+m, max] padded on the right (or the left) with ``value``."""
    if a is None or b is None:
        if a is not None or b is not None:
            raise ValueError("rollouts to concatenate differ in which per-token fields they have")
        return None
    width = max(a.shape[1], b.shape[1])
    pad = [
        torch.nn.functional.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value)
        for t in (a, b)
    ]
    return torch.cat(pad)


@dataclass  # not frozen: Lightning's batch transfer rejects frozen dataclasses
class PromptBatch:
    """B prompts and every other dataset column, as the data module yields them."""

    prompts: list[Prompt]  # [B]
    columns: dict[str, list[Any]] = field(default_factory=dict)  # name -> [B] values

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class Rollout:
    """G sampled completions for each of B prompts, grouped: rows ``g*G .. g*G+G-1`` share a prompt."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P] 1 on real prompt tokens
    completion_ids: Tensor  # [N, T] right-padded
    completion_mask: Tensor  # [N, T] 1 up to and including the first EOS
    is_truncated: Tensor  # [N] bool, True where no EOS was emitted within max_completion_length
    prompts: list[Prompt]  # [N] each prompt repeated G times
    completions: list[Any]  # [N] decoded text, or [{"role": "assistant", "content": text}] for chat prompts
    group_size: int  # G
    num_truncated_prompts: int = 0  # of the B prompts, how many lost tokens to max_prompt_length
    sampling_logps: Tensor | None = None  # [N, T] the sampler's log-probs when it is not the policy (vLLM)
    # [N, T] 1 on tokens the model wrote, 0 on tokens it did not (tool results, environment observations,
    # template scaffolding between turns): those condition the model but stay out of the loss, KL and entropy.
    # ``None``: the model wrote every completion token (single turn).
    tool_mask: Tensor | None = None
    columns: dict[str, list[Any]] = field(default_factory=dict)  # name -> [N] extra per-row reward inputs
    metrics: dict[str, float] = field(default_factory=dict)  # the engine's own step metrics (turns, tool calls)
    # [N] long: the policy version (updates made) whose weights sampled each row, from an engine sampling ahead
    # (``AsyncRollouts``); ``None``: the weights current when the rollout is trained on.
    versions: Tensor | None = None
    # name -> [N] per-row tensors of the processor's vision inputs (``pixel_values``, ``image_grid_thw`` ...), each
    # row's images along dim 0, so the rows of a forward concatenate (``vision_rows``); ``None`` in the rows of a
    # text-only prompt. The field ``None``: a rollout without images.
    vision: Vision | None = None

    @cached_property  # built once: every log-prob pass reads it per micro-batch; fields are never mutated
    def input_ids(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @cached_property
    def attention_mask(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @cached_property  # read once, by whoever reads it first: a rollout's tokens and masks never change once built
    def host(self) -> HostRows:
        """The rows' ids and lengths on the host (one read of the device), for the step's shapes and plans."""
        return HostRows.read(self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask)

    def known_on_host(self, host: HostRows) -> Rollout:
        """This rollout, its ``host`` rows given by the engine that built it from the same tokens (no read)."""
        self.host = host  # set as the cached property would cache it (it defines no setter)
        return self

    @property
    def model_mask(self) -> Tensor:  # [N, T]
        """1 on the completion tokens the model wrote itself, up to and including the first EOS."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def vision_inputs(self, rows: slice | Tensor) -> dict[str, Tensor]:
        """The vision inputs of ``rows`` for one forward: each name's per-row tensors concatenated (empty for a
        text-only rollout)."""
        return vision_rows(self.vision, rows)

    @classmethod
    def from_token_lists(
        cls,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        pad_id: int,
        is_truncated: list[bool],
        sampling_logps: list[list[float]] | None = None,
        tool_mask: list[list[int]] | None = None,
        device: torch.device | str = "cpu",
        **fields: Any,
    ) -> Rollout:
        """A Rollout from one token list per row (an engine's or an agent's raw output): prompts left-padded,
        completions right-padded (mask 1 on every listed token), per-token lists padded alike; ``fields``:
        ``prompts``, ``completions``, ``group_size`` and any other field."""
        prompts, prompt_mask = pad_rows(prompt_ids, pad_id, left=True, min_width=1)  # [N, P]
        completions, completion_mask = pad_rows(completion_ids, pad_id, min_width=1)  # [N, T]
        logps, model = _padded(sampling_logps, 0.0, torch.float32), _padded(tool_mask, 0)  # [N, T] each
        rollout = cls(
            prompt_ids=prompts.to(device),
            prompt_mask=prompt_mask.to(device),
            completion_ids=completions.to(device),
            completion_mask=completion_mask.to(device),
            is_truncated=torch.tensor(is_truncated, dtype=torch.bool, device=device),
            sampling_logps=None if logps is None else logps.to(device),
            tool_mask=None if model is None else model.to(device),
            **fields,
        )
        return rollout.known_on_host(HostRows.unpadded(prompt_ids, completion_ids))

    def select(self, rows: Tensor) -> Rollout:
        """The rollout of ``rows`` ([n] indices) only; whole groups keep it grouped."""
        picked = rows.tolist()
        return replace(
            self,
            prompt_ids=self.prompt_ids[rows],
            prompt_mask=self.prompt_mask[rows],
            completion_ids=self.completion_ids[rows],
            completion_mask=self.completion_mask[rows],
            is_truncated=self.is_truncated[rows],
            prompts=[self.prompts[i] for i in picked],
            completions=[self.completions[i] for i in picked],
            sampling_logps=_rows(self.sampling_logps, rows),
            tool_mask=_rows(self.tool_mask, rows),
            columns={k: [v[i] for i in picked] for k, v in self.columns.items()},
            versions=_rows(self.versions, rows),
            vision=_picked(self.vision, picked),
        )

    def cat(self, other: Rollout, pad_id: int) -> Rollout:
        """This rollout's rows then ``other``'s, prompts re-padded on the left and completions on the right."""
        return replace(
            other,
            prompt_ids=_cat(self.prompt_ids, other.prompt_ids, pad_id, left=True),
            prompt_mask=_cat(self.prompt_mask, other.prompt_mask, 0, left=True),
            completion_ids=_cat(self.completion_ids, other.completion_ids, pad_id),
            completion_mask=_cat(self.completion_mask, other.completion_mask, 0),
            is_truncated=torch.cat([self.is_truncated, other.is_truncated]),
            prompts=self.prompts + other.prompts,
            completions=self.completions + other.completions,
            num_truncated_prompts=self.num_truncated_prompts + other.num_truncated_prompts,
            sampling_logps=_cat(self.sampling_logps, other.sampling_logps, 0.0),
            tool_mask=_cat(self.tool_mask, other.tool_mask, 0),
            columns={k: self.columns[k] + other.columns[k] for k in other.columns},
            versions=None if self.versions is None else torch.cat([self.versions, other.versions]),
            vision=_cat_vision(self.vision, other.vision, len(self), len(other)),
        )


@dataclass
class RewardScores:
    """What every reward function said about every completion."""

    per_function: Tensor  # [N, F] float, NaN where a function returned None ("not applicable")
    names: list[str]  # [F]
    weights: Tensor  # [F]
    errors: dict[str, int] = field(default_factory=dict)  # failed rows per function (reward_calls.on_error skip/zero)
    metrics: dict[str, float] = field(default_factory=dict)  # the functions' own counters (sandbox/timeouts ...)

    @property
    def total(self) -> Tensor:
        """[N] weighted sum over functions, NaN where every function returned None."""
        return weighted_total(self.per_function, self.weights)

    def groups_without_signal(self, group_size: int) -> Tensor:
        """[N/G] True where a group's total rewards carry no signal (``without_signal``)."""
        return without_signal(self.total.view(-1, group_size))

    def select(self, rows: Tensor) -> RewardScores:
        return replace(self, per_function=self.per_function[rows])
