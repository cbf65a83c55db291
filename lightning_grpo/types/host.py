"""What the host knows of a rollout's rows without reading the device again (``HostRows``, ``pad_rows``), and
the one read of a step's statistics at its end (``to_host``). Each read of a GPU tensor makes the host wait for
every queued kernel, so the rows are read once and a step's numbers once."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor


def parting(a: list[int], b: list[int]) -> int:
    """The first position where two id lists differ (the shorter one's length where one extends the other).

    >>> parting([1, 2, 3], [1, 5, 3]), parting([1, 2], [1, 2, 3])
    (1, 2)
    """
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


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
    >>> rows.prompt_ids[0], rows.completion_ids, rows.lengths, rows.prompt_of
    ([5, 6], [[3, 4], [3], []], [(2, 2), (2, 1), (3, 0)], [0, 0, 2])
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
    def lengths(self) -> list[tuple[int, int]]:
        """[N] real (prompt, completion) tokens of each row."""
        return [(len(p), len(c)) for p, c in zip(self.prompt_ids, self.completion_ids)]

    @property
    def width(self) -> int:
        """The longest completion, at least 1: columns past it are padding in every row."""
        return max(max(self.completion_end, default=0), 1)


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
