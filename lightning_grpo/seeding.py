"""The seed of each training step, and a block whose random draws come from it. Knows torch's generators; nothing
about GRPO or Lightning.

Every random draw of a step (sampling, dropout) comes from a seed of (seed, rank, step), so ranks sample
differently and a resumed run repeats the uninterrupted one with no RNG state saved.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def step_seed(seed: int, rank: int, step: int, waited: int = 0) -> int:
    """The seed of one rank's training step (``waited``: generation batches drawn without an update yet, under
    ``filter_groups``), so every rank samples differently and a resumed run repeats the uninterrupted one."""
    return (seed * 1_000_003 + rank * 7_919 + step + waited * 104_729) % 2**63


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Every random draw inside (sampling, dropout) comes from ``seed``; the global RNG is left as it was. Seeds
    the CPU generator and ``device``'s GPU: what ``fork_rng`` restores (``torch.manual_seed`` also seeds every
    other accelerator type lazily, formatting a stack trace each time: ~0.5 ms a step)."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.manual_seed(seed)
        yield
