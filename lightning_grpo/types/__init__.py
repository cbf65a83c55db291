"""The dataclasses passed between stages and the rules every stage shares; no logic beyond shape bookkeeping.

- ``text.py``: ``Prompt``, and the text of any completion (``completion_text``);
- ``signal.py``: the two reward rules, their weighted sum and when a group "has no signal";
- ``host.py``: a rollout's rows as the host knows them (``HostRows``, ``pad_rows``), the step's one read
  (``to_host``);
- ``records.py``: ``PromptBatch``, ``Rollout``, ``RewardScores``, what the stages hand each other;
- ``stats.py``: the step record (``StepRecord``, ``StepStats`` and its parts) and ``DrawnBatch``, what callbacks read.

This file only hands their names on.

Dimensions used across the package:
    B  prompts in a step on one rank (the data module's ``batch_size``)
    G  completions per prompt (``num_generations``)
    N  completions in a step on one rank, ``B * G``
    P  prompt length in tokens (left-padded)
    T  completion length in tokens (right-padded, trimmed to the longest completion)
    F  reward functions
    W  data-parallel ranks (world size)
"""

from lightning_grpo.types.host import HostRows, pad_rows, parting, to_host
from lightning_grpo.types.records import Collectives, PromptBatch, RewardScores, Rollout, fields_of, vision_rows
from lightning_grpo.types.signal import SIGNAL_ATOL, nanstd, weighted_total, without_signal, zero_std_fraction
from lightning_grpo.types.stats import (
    DistillStats,
    DrawnBatch,
    LengthStats,
    MismatchStats,
    RewardStats,
    StepRecord,
    StepStats,
    UpdateStats,
    drawn_batch,
    step_record,
)
from lightning_grpo.types.text import Prompt, completion_text

__all__ = [
    "Collectives",
    "DistillStats",
    "DrawnBatch",
    "HostRows",
    "LengthStats",
    "MismatchStats",
    "Prompt",
    "PromptBatch",
    "RewardScores",
    "RewardStats",
    "Rollout",
    "SIGNAL_ATOL",
    "StepRecord",
    "StepStats",
    "UpdateStats",
    "completion_text",
    "drawn_batch",
    "fields_of",
    "nanstd",
    "pad_rows",
    "parting",
    "step_record",
    "to_host",
    "vision_rows",
    "weighted_total",
    "without_signal",
    "zero_std_fraction",
]
