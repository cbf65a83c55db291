"""The dataclasses passed between stages, and the two rules every stage shares about rewards (their weighted sum
and when a group "has no signal"). No other logic beyond shape bookkeeping.

Dimensions used across the package:
    B  prompts in a step on one rank (the data module's ``batch_size``)
    G  completions per prompt (``num_generations``)
    N  completions in a step on one rank, ``B * G``
    P  prompt length in tokens (left-padded)
    T  completion length in tokens (right-padded, trimmed to the longest completion)
    F  reward functions
    W  data-parallel ranks (world size)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Protocol

import torch
from torch import Tensor

Prompt = str | list[dict[str, Any]]  # plain text, or chat messages [{"role": ..., "content": ...}]


def completion_text(completion: Any) -> str:
    """Text of a plain-text completion or of a chat completion ``[{"role": "assistant", "content": ...}]``, whose
    content is a string or a list of parts (``[{"type": "text", "text": ...}]``). Anything else reads as ``""``, so
    a malformed completion scores (and is shown) like an empty one instead of crashing a training step.

    >>> completion_text([{"role": "assistant", "content": "hi"}]), completion_text("hi"), completion_text(None)
    ('hi', 'hi', '')
    """
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, list):
        last = completion[-1] if completion else None
        return _content_text(last.get("content")) if isinstance(last, dict) else ""
    return completion if isinstance(completion, str) else ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


class Collectives(Protocol):
    """The data-parallel collectives a stage's record needs (``ranks.Ranks``); with one process, the identity."""

    world_size: int

    def sum(self, t: Tensor) -> Tensor: ...

    def gather_rows(self, t: Tensor) -> Tensor: ...


# A group whose rewards' std is within this of 0 carries no policy gradient: TRL's ``torch.isclose(std, 0)``.
# Advantages, dynamic sampling, the step metrics and the collapse alert all ask ``without_signal``.
SIGNAL_ATOL = 1e-8


def nanstd(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Unbiased std ignoring NaN; NaN where fewer than two values are present: TRL's ``trl.trainer.utils.nanstd``,
    imported on first use so that ``import lightning_grpo`` does not load TRL.

    >>> nanstd(torch.tensor([[1.0, 3.0, float("nan")], [2.0, float("nan"), float("nan")]]), dim=1)
    tensor([1.4142,    nan])
    """
    from trl.trainer.utils import nanstd as trl_nanstd

    return trl_nanstd(x, dim=dim, keepdim=keepdim)


def without_signal(grouped: Tensor) -> Tensor:
    """[groups, G] rewards -> [groups] True where they carry no signal: all equal (NaN ignored, computed in
    float64 so equal rewards give exactly 0) or fewer than two of them.

    >>> without_signal(torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, float("nan")], [1.0, 1.0 + 1e-12]])).tolist()
    [True, False, True, True]
    """
    std = nanstd(grouped.double(), dim=1).nan_to_num(0.0)  # [groups]
    return std.abs() <= SIGNAL_ATOL


def zero_std_fraction(grouped: Tensor) -> float:
    """[groups, G] rewards -> the fraction of groups ``without_signal`` (TRL's ``frac_reward_zero_std``).

    >>> zero_std_fraction(torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, float("nan")]]))
    0.6666666666666666
    """
    return without_signal(grouped).double().mean().item()


def weighted_total(per_function: Tensor, weights: Tensor) -> Tensor:
    """[N, F] scores (NaN: the function returned None) and [F] weights -> [N] weighted sum over the functions
    that applied; NaN where none did.

    >>> weighted_total(torch.tensor([[1.0, float("nan")], [float("nan"), float("nan")]]), torch.tensor([2.0, 1.0]))
    tensor([2., nan])
    """
    total = (per_function * weights.to(per_function)).nansum(dim=1)
    return torch.where(per_function.isnan().all(dim=1), torch.nan, total)


def pad_rows(
    rows: list[list], value: float, left: bool = False, dtype: torch.dtype = torch.long, min_width: int = 0
) -> tuple[Tensor, Tensor]:
    """[n] lists of different lengths -> [n, W] values padded with ``value`` (on the left or the right) and the
    [n, W] mask of real entries; ``W`` is the longest row, at least ``min_width``.

    >>> pad_rows([[7], [8, 9]], 0, left=True)
    (tensor([[0, 7],
            [8, 9]]), tensor([[0, 1],
            [1, 1]]))
    """
    width = max(max((len(r) for r in rows), default=0), min_width)
    values = torch.full((len(rows), width), value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            cols = slice(width - len(r), width) if left else slice(0, len(r))
            values[i, cols], mask[i, cols] = torch.tensor(r, dtype=dtype), 1
    return values, mask


def _padded(rows: list[list] | None, value: float, dtype: torch.dtype = torch.long) -> Tensor | None:
    return None if rows is None else pad_rows(rows, value, dtype=dtype, min_width=1)[0]


def fields_of(obj: Any) -> dict[str, Any]:
    """A dataclass's fields by name, one level deep: what a checkpoint holds (``torch.load(weights_only=True)``
    reads back dicts, lists and tensors), rebuilt with ``type(obj)(**fields)``."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _rows(t: Tensor | None, rows: Tensor) -> Tensor | None:
    return None if t is None else t[rows]


def vision_rows(vision: dict[str, list[Tensor]] | None, rows: slice | Tensor) -> dict[str, Tensor]:
    """Per-row vision inputs (name -> [N] tensors) -> those of ``rows`` concatenated along dim 0, one forward's."""
    if vision is None:
        return {}
    picked = range(len(next(iter(vision.values()))))[rows] if isinstance(rows, slice) else rows.tolist()
    return {name: torch.cat([per_row[i] for i in picked]) for name, per_row in vision.items()}


def _picked(vision: dict[str, list[Tensor]] | None, picked: list[int]) -> dict[str, list[Tensor]] | None:
    return None if vision is None else {k: [v[i] for i in picked] for k, v in vision.items()}


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


def _span(mask: list[int], empty: int) -> tuple[int, int]:
    """(first, one past the last) column of a mask row's ones; (``empty``, ``empty``) without any."""
    if 1 not in mask:
        return empty, empty
    return mask.index(1), len(mask) - mask[::-1].index(1)


def _kept(ids: list[int], mask: list[int], span: tuple[int, int]) -> list[int]:
    """The ids where ``mask`` is 1: a slice when they are contiguous (as padding leaves them), else picked."""
    start, end = span
    return ids[start:end] if sum(mask) == end - start else [t for t, kept in zip(ids, mask) if kept]


@dataclass(frozen=True)
class HostRows:
    """A rollout's rows as the host knows them, read from the device once (``Rollout.host``): the ids the rewards
    read and the lengths that the step's shapes and plans are decided from (the micro-batches, the columns a
    log-prob forward keeps, the prompts it encodes once). Deciding them then reads the device no more, which on a
    GPU would make the host wait for every queued kernel each time.

    >>> rows = HostRows.of([[0, 5, 6], [0, 5, 6], [7, 8, 9]], [[0, 1, 1], [0, 1, 1], [1, 1, 1]],
    ...                    [[3, 4], [3, 0], [0, 0]], [[1, 1], [1, 0], [0, 0]])
    >>> rows.prompt_ids[0], rows.completion_ids, rows.tokens, rows.prompt_of
    ([5, 6], [[3, 4], [3], []], [4, 3, 3], [0, 0, 2])
    >>> rows.columns(slice(0, 2)), rows.columns(slice(2, 3)), rows.runs([1, 0, 2])
    ((1, 2), (0, 1), [2, 1])
    """

    prompt_width: int  # P
    prompt_ids: list[list[int]]  # [N] each prompt's real tokens (prompt_mask 1)
    completion_ids: list[list[int]]  # [N] each completion's real tokens (completion_mask 1)
    prompt_start: list[int]  # [N] the first column of each prompt's real tokens; P when it has none
    completion_end: list[int]  # [N] one past the last real column of each completion; 0 when it has none
    prompt_of: list[int]  # [N] the first row with the same prompt (ids and mask): rows that share a prompt

    @classmethod
    def read(cls, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor) -> HostRows:
        """From the device: one copy of the four tensors ([N, P] prompts, [N, T] completions)."""
        p, t = prompt_ids.shape[1], completion_ids.shape[1]
        both = torch.cat([prompt_ids, prompt_mask, completion_ids, completion_mask], dim=1).long().tolist()
        parts = [[row[a:b] for row in both] for a, b in ((0, p), (p, 2 * p), (2 * p, 2 * p + t), (2 * p + t, None))]
        return cls.of(*parts, prompt_width=p)

    @classmethod
    def of(
        cls,
        prompt_ids: list[list[int]],
        prompt_mask: list[list[int]],
        completion_ids: list[list[int]],
        completion_mask: list[list[int]],
        prompt_width: int | None = None,
    ) -> HostRows:
        """From host lists of the padded [N, P] prompts and [N, T] completions."""
        width = prompt_width if prompt_width is not None else len(prompt_mask[0]) if prompt_mask else 0
        first: dict[tuple, int] = {}  # (ids, mask) -> the first row with that prompt
        pairs = enumerate(zip(prompt_ids, prompt_mask))
        prompt_of = [first.setdefault((tuple(i), tuple(m)), row) for row, (i, m) in pairs]
        prompts = [_span(mask, width) for mask in prompt_mask]  # [N] (first, end) of the real tokens
        completions = [_span(mask, 0) for mask in completion_mask]
        return cls(
            prompt_width=width,
            prompt_ids=[_kept(*row) for row in zip(prompt_ids, prompt_mask, prompts)],
            completion_ids=[_kept(*row) for row in zip(completion_ids, completion_mask, completions)],
            prompt_start=[start for start, _ in prompts],
            completion_end=[end for _, end in completions],
            prompt_of=prompt_of,
        )

    @classmethod
    def unpadded(cls, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> HostRows:
        """From each row's prompt and completion tokens, as ``Rollout.from_token_lists`` pads them."""
        width = max(max((len(ids) for ids in prompt_ids), default=0), 1)
        first: dict[tuple, int] = {}
        return cls(
            prompt_width=width,
            prompt_ids=[list(ids) for ids in prompt_ids],
            completion_ids=[list(ids) for ids in completion_ids],
            prompt_start=[width - len(ids) for ids in prompt_ids],
            completion_end=[len(ids) for ids in completion_ids],
            prompt_of=[first.setdefault(tuple(ids), row) for row, ids in enumerate(prompt_ids)],
        )

    def rows(self, rows: slice | list[int] | Tensor) -> list[int]:
        """Row indices of ``rows``: a slice, or indices (a micro-batch plan's, made on the host)."""
        if isinstance(rows, slice):
            return list(range(len(self.prompt_ids))[rows])
        return rows.tolist() if isinstance(rows, Tensor) else list(rows)

    def columns(self, rows: slice | list[int] | Tensor) -> tuple[int, int]:
        """(first column, completion width T'): the columns of ``rows`` that some row needs, as
        ``model.padding.trim_padding`` keeps them; at least the last prompt column and one completion column."""
        picked = self.rows(rows)
        first = min((self.prompt_start[i] for i in picked), default=self.prompt_width)
        return min(first, self.prompt_width - 1), max(max((self.completion_end[i] for i in picked), default=0), 1)

    def runs(self, rows: slice | list[int] | Tensor) -> list[int]:
        """[U] the length of each run of consecutive ``rows`` that share a prompt (``model.prefix.prompt_runs``)."""
        counts: list[int] = []
        last = None
        for i in self.rows(rows):
            if counts and self.prompt_of[i] == last:
                counts[-1] += 1
            else:
                counts.append(1)
            last = self.prompt_of[i]
        return counts

    @property
    def tokens(self) -> list[int]:
        """[N] real prompt and completion tokens of each row."""
        return [len(p) + len(c) for p, c in zip(self.prompt_ids, self.completion_ids)]

    @property
    def width(self) -> int:
        """The longest completion, at least 1: columns past it are padding in every row."""
        return max(max(self.completion_end, default=0), 1)


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
    # row's images along dim 0, so the rows of a forward concatenate; ``None``: a text-only rollout.
    vision: dict[str, list[Tensor]] | None = None

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
            vision=None if self.vision is None else {k: v + other.vision[k] for k, v in self.vision.items()},
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


# ---- the step record: what one training step did, read by callbacks by attribute -------------------------


@dataclass(frozen=True)
class RewardStats:
    """Rewards of the global batch (every rank's rows)."""

    mean: float  # of the total reward
    std: float  # of the total reward over the batch
    frac_zero_std: float  # groups whose rewards are all equal: they carry no gradient
    function_means: dict[str, float]  # per reward function; NaN where it returned None for every row
    function_stds: dict[str, float]
    accuracy: float | None = None  # share of full marks of the module's accuracy_reward, when it has one

    def metrics(self) -> dict[str, float]:
        out = {"reward": self.mean, "reward_std": self.std, "frac_reward_zero_std": self.frac_zero_std}
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        for name in self.function_means:
            out[f"rewards/{name}/mean"] = self.function_means[name]
            out[f"rewards/{name}/std"] = self.function_stds[name]
        return out


@dataclass(frozen=True)
class LengthStats:
    """Completion lengths of the global batch, in tokens up to and including EOS."""

    mean: float
    min: float
    max: float
    clipped_ratio: float  # completions that never emitted EOS
    mean_terminated: float  # mean length of those that did (0 when none did, as in TRL)
    min_terminated: float = 0.0
    max_terminated: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "completions/mean_length": self.mean,
            "completions/min_length": self.min,
            "completions/max_length": self.max,
            "completions/clipped_ratio": self.clipped_ratio,
            "completions/mean_terminated_length": self.mean_terminated,
            "completions/min_terminated_length": self.min_terminated,
            "completions/max_terminated_length": self.max_terminated,
        }


@dataclass(frozen=True)
class UpdateStats:
    """The policy update: token means over the loss tokens of the global batch."""

    loss: float
    entropy: float
    clip_low: float | None = None  # tokens clipped below 1 - epsilon with a negative advantage (clipping terms)
    clip_high: float | None = None  # tokens clipped above 1 + epsilon_high with a positive advantage
    clip_region: float | None = None  # either
    clip_low_min: float = float("nan")  # the lowest share of low-clipped tokens of one completion (TRL's low_min)
    clip_high_max: float = float("nan")  # the highest share of high-clipped tokens of one completion
    grad_norm: float = float("nan")  # the global gradient norm before clipping (last optimiser step of the step)
    loss_tokens: float = 0.0  # tokens in the loss, all ranks (the dapo normaliser's count)
    kl: float | None = None  # to the reference; None when beta = 0 (not computed)
    trained_entropy: float | None = None  # entropy of the tokens trained on, with top_entropy_quantile < 1
    term: dict[str, float] = field(default_factory=dict)  # the policy term's own (cispo_clip_ratio, vespo/...)

    def metrics(self) -> dict[str, float]:
        out = {"loss": self.loss, "entropy": self.entropy, "grad_norm": self.grad_norm, **self.term}
        if self.clip_low is not None:  # the clipped surrogate's (not CISPO's, SAPO's or VESPO's)
            out |= {
                "clip_ratio/low_mean": self.clip_low,
                "clip_ratio/high_mean": self.clip_high,
                "clip_ratio/region_mean": self.clip_region,
                "clip_ratio/low_min": self.clip_low_min,
                "clip_ratio/high_max": self.clip_high_max,
            }
        if self.kl is not None:
            out["kl"] = self.kl
        if self.trained_entropy is not None:
            out["entropy/trained_mean"] = self.trained_entropy
        return out


@dataclass(frozen=True)
class MismatchStats:
    """How far the sampler's log-probs (another engine: vLLM) are from the trainer's, over the loss tokens of the
    global batch. ``targets.correction.mismatch_stats`` defines each number."""

    token_mult_prob_error: float  # mean exp(|trainer - sampler logp|) per token, 1 when equal (NeMo-RL's)
    kl: float  # KL(sampler || trainer), k3 estimator on the sampled tokens
    logp_diff_mean: float  # mean |trainer - sampler logp| (TRL's sampling_logp_difference/mean)
    logp_diff_max: float
    ratio_p5: float  # percentiles of the token ratio trainer/sampler
    ratio_p50: float
    ratio_p95: float
    ess_token: float  # normalised effective sample size of the token ratios, in (0, 1]
    ess_sequence: float  # of the completions' ratios (product over their tokens)
    anchored: bool = False  # the loss's ratio and clip are taken against the sampler (bypass): no weight applied

    def metrics(self) -> dict[str, float]:
        return {
            "sampling/token_mult_prob_error": self.token_mult_prob_error,
            "sampling/kl": self.kl,
            "sampling/sampling_logp_difference/mean": self.logp_diff_mean,
            "sampling/sampling_logp_difference/max": self.logp_diff_max,
            "sampling/token_ratio/p5": self.ratio_p5,
            "sampling/token_ratio/p50": self.ratio_p50,
            "sampling/token_ratio/p95": self.ratio_p95,
            "sampling/ess/token": self.ess_token,
            "sampling/ess/sequence": self.ess_sequence,
        }


@dataclass(frozen=True)
class DistillStats:
    """How far the student is from the teacher on its own sampled tokens (``distill:``), over the loss tokens of
    the global batch. ``loss.distill.distill_stats`` defines each number."""

    reverse_kl: float  # mean log p_student(y_t) - log p_teacher(y_t): the one-sample KL(student || teacher) per token
    reverse_kl_std: float  # its spread over the tokens
    tokens: int  # loss tokens it is taken over
    top_agreement: float | None = None  # share of positions whose most likely token is the teacher's (gkd: logits)

    def metrics(self) -> dict[str, float]:
        out = {"distill/reverse_kl": self.reverse_kl, "distill/reverse_kl_std": self.reverse_kl_std}
        return out | ({} if self.top_agreement is None else {"distill/top_agreement": self.top_agreement})


@dataclass(frozen=True)
class StepStats:
    """Every number a training step reports. ``metrics()`` names them as TRL does (``reward``, ``kl`` ...)."""

    rewards: RewardStats
    lengths: LengthStats
    update: UpdateStats
    num_tokens: int  # prompt + completion tokens trained on so far, all ranks
    learning_rate: float
    skipped_steps: int  # steps skipped so far for non-finite numbers
    truncated_prompts: int  # prompts of this rank's batch cut to max_prompt_length
    step_time: float  # seconds
    reward_errors: dict[str, int] = field(default_factory=dict)  # failed rows per function (skip / zero)
    extra: dict[str, float] = field(default_factory=dict)  # the rollout engine's and reward functions' own metrics
    mismatch: MismatchStats | None = None  # when another engine sampled; its metrics come through ``extra``
    distill: DistillStats | None = None  # with a teacher (``distill:``); its metrics come through ``extra``

    def metrics(self) -> dict[str, float]:
        return {
            **self.update.metrics(),
            **self.rewards.metrics(),
            **self.lengths.metrics(),
            **self.extra,
            "num_tokens": float(self.num_tokens),
            "lr": self.learning_rate,
            "skipped_steps": float(self.skipped_steps),
            "prompts/truncated": float(self.truncated_prompts),
            "step_time": self.step_time,
            **{f"reward_errors/{name}": float(count) for name, count in self.reward_errors.items()},
        }


@dataclass(frozen=True)
class StepRecord:
    """What one training step did, published as ``training_step``'s output ``{"loss", "record"}``.

    Callbacks read it with ``step_record(outputs)`` and then by attribute, so a renamed field breaks them
    loudly (AttributeError, caught by the tests) instead of silently disabling an alert.
    """

    rollout: Rollout  # this rank's N completions
    scores: RewardScores  # [N, F] this rank's
    advantages: Tensor  # [N], or [N, T] per token (REINFORCE++)
    stats: StepStats  # of the global batch


def to_host(record: Any) -> Any:
    """``record`` (dataclasses, dicts, lists and tuples, nested) with every one-element tensor replaced by its
    Python float, the device's read in one transfer.

    Why: each ``.item()`` on a GPU tensor is a host sync that drains the launch queue. A step's statistics are
    computed as device tensors and read here, once, at its end.

    >>> to_host({"mean": torch.tensor(0.5), "n": [torch.tensor([2])], "name": "x"})
    {'mean': 0.5, 'n': [2.0], 'name': 'x'}
    """
    leaves = _tensor_leaves(record)
    read = {}
    if leaves:  # one stack and one copy to the host for all of them
        values = torch.stack([t.detach().reshape(()).to(leaves[0].device, torch.float64) for t in leaves]).tolist()
        read = {id(t): v for t, v in zip(leaves, values)}
    return _replace_leaves(record, read)


def _tensor_leaves(record: Any) -> list[Tensor]:
    if isinstance(record, Tensor):
        return [record] if record.numel() == 1 else []
    if isinstance(record, dict):
        record = list(record.values())
    elif _is_record(record):
        record = [getattr(record, f.name) for f in fields(record)]
    elif not isinstance(record, (list, tuple)):
        return []
    return [leaf for item in record for leaf in _tensor_leaves(item)]


def _replace_leaves(record: Any, read: dict[int, float]) -> Any:
    if isinstance(record, Tensor):
        return read[id(record)] if record.numel() == 1 else record
    if isinstance(record, dict):
        return {k: _replace_leaves(v, read) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return type(record)(_replace_leaves(v, read) for v in record)
    if _is_record(record):
        return replace(record, **{f.name: _replace_leaves(getattr(record, f.name), read) for f in fields(record)})
    return record


def _is_record(value: Any) -> bool:
    return hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type)


def step_record(outputs: Any) -> StepRecord | None:
    """The record in a ``training_step`` output; ``None`` for a skipped step (it returns nothing)."""
    return outputs.get("record") if isinstance(outputs, dict) else None
