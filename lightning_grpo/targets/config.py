"""The ``update:`` settings: how one scored generation batch becomes optimiser steps. Checked once, here."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from lightning_grpo.checks import raise_problems
from lightning_grpo.targets.correction import BYPASS, CORRECTIONS, SAMPLING_CORRECTIONS, correction_bounds

AUTO_MICRO_BATCH_TOKENS = 16384  # verl's ppo_max_token_len_per_gpu: one pass of the prompt-and-completion tokens
AUTO = "auto"  # sampling_correction chosen by the engine: UpdateConfig.for_engine


@dataclass(frozen=True)
class UpdateConfig:
    """How a generation batch is trained on, TRL's names. ``update:`` in YAML.

    Attributes:
        num_iterations: passes over each generation batch (mu); > 1 keeps the sampling log-probs, and the later
            passes are off-policy (clipped).
        steps_per_generation: optimiser steps per generation batch, each on its share of the batch's groups
            (rollouts reused, the later steps off-policy); ``data.batch_size`` must be a multiple of it.
        micro_batch_size: completions per forward/backward pass; gradients accumulate over the optimiser step.
            ``None`` takes all at once (up to ``micro_batch_tokens``). Any value gives the same update.
        micro_batch_tokens: micro-batches of rows of similar lengths, each at most this many tokens as the padded
            forward holds them (rows x the longest row's prompt and completion; a longer row goes alone): verl's
            ``use_dynamic_bsz``. Rows are sorted by length, longest first, so little padding is computed and the
            first micro-batch shows the peak memory. Whole groups with ``policy.share_prompt_prefix``. The same
            update as any other split. ``"auto"`` (the default): 16384 (verl's ``ppo_max_token_len_per_gpu``),
            a batch within it goes in one pass, as before; none when ``micro_batch_size`` is set. ``None``: off.
        mask_truncated_completions: drop completions without EOS from the loss (DAPO).
        sampling_correction: when another engine sampled (vLLM), re-weight the policy term by the trainer/sampler
            probability ratio rho (``targets/correction.py``, defaults in brackets): TRL's token_truncate,
            token_mask, sequence_truncate, sequence_mask (TRL's default) [rho <= 3]; icepop, rho per token kept
            inside [0.5, 5] and 0 outside; geometric_mask, a completion kept (weight 1) while the geometric mean
            of its token ratios is inside [0.999, 1.001] (verl's preset) and dropped otherwise; decoupled, AReaL's
            behaviour weight, rho per token, 0 above the cap [5]; bypass, no weight: the loss's ratio and clip
            are taken against the sampler's log-probs (verl's ``bypass_mode``; for async, where the sampler is
            updates behind); ``"auto"`` (the default): ``bypass`` when the engine samples updates ahead
            (``AsyncRollouts`` with ``max_staleness`` > 0, where async then learns as synchronous does, and less
            with re-weighting only: ``references/scale.md``), TRL's ``sequence_mask`` otherwise; or ``None``
            (off). Weights logged as
            ``train/sampling/importance_sampling_ratio/*``; the mismatch itself as ``train/sampling/*``, with the
            correction off too.
        sampling_correction_min: the ratio's lower bound (TRL's ``vllm_importance_sampling_clip_min``); ``None``
            takes the correction's default (none for TRL's four).
        sampling_correction_max: the ratio's upper bound (TRL's ``vllm_importance_sampling_clip_max``: clamped
            for ``*_truncate``, zeroed above for the masks); ``None`` takes the correction's default, ``.inf`` none.
    """

    num_iterations: int = 1
    steps_per_generation: int = 1
    micro_batch_size: int | None = None
    micro_batch_tokens: int | Literal["auto"] | None = "auto"
    mask_truncated_completions: bool = False
    sampling_correction: Literal[(*SAMPLING_CORRECTIONS, AUTO)] | None = AUTO
    sampling_correction_min: float | None = None
    sampling_correction_max: float | None = None

    def __post_init__(self) -> None:
        corrections = [*SAMPLING_CORRECTIONS, AUTO, None]
        raise_problems(
            "update",
            [
                (self.num_iterations >= 1, f"update.num_iterations must be >= 1, got {self.num_iterations!r}"),
                (
                    self.steps_per_generation >= 1,
                    f"update.steps_per_generation must be >= 1, got {self.steps_per_generation!r}",
                ),
                (
                    self.micro_batch_size is None or self.micro_batch_size >= 1,
                    f"update.micro_batch_size must be None or >= 1, got {self.micro_batch_size!r}",
                ),
                (
                    self.micro_batch_tokens in (None, "auto")
                    or (isinstance(self.micro_batch_tokens, int) and self.micro_batch_tokens >= 1),
                    f"update.micro_batch_tokens must be an integer >= 1, 'auto' or None, got "
                    f"{self.micro_batch_tokens!r}",
                ),
                (
                    self.micro_batch_size is None or self.micro_batch_tokens in (None, "auto"),
                    f"update.micro_batch_size={self.micro_batch_size} and update.micro_batch_tokens="
                    f"{self.micro_batch_tokens} both split the batch: set one of them",
                ),
                (
                    self.sampling_correction in corrections,
                    f"update.sampling_correction must be one of {corrections}, got {self.sampling_correction!r}",
                ),
                *self._bound_checks(),
            ],
        )

    def for_engine(self, max_staleness: int) -> UpdateConfig:
        """These settings with ``sampling_correction: auto`` resolved for an engine whose samples are up to
        ``max_staleness`` updates behind (``RolloutEngine.max_staleness``): ``bypass`` when > 0, else
        ``sequence_mask``. Raises ``ValueError`` when the bounds are set and ``auto`` would be ``bypass``."""
        if self.sampling_correction != AUTO:
            return self
        ahead = max_staleness > 0
        if ahead and (self.sampling_correction_min, self.sampling_correction_max) != (None, None):
            raise ValueError(
                f"update.sampling_correction='auto' is 'bypass' for an engine sampling up to {max_staleness} "
                f"update(s) ahead, which applies no weight for update.sampling_correction_min/max (got "
                f"{self.sampling_correction_min!r}/{self.sampling_correction_max!r}) to bound: name the correction "
                f"they bound (one of {list(CORRECTIONS)}), or leave them unset"
            )
        return dataclasses.replace(self, sampling_correction=BYPASS if ahead else "sequence_mask")

    @property
    def token_budget(self) -> int | None:
        """The micro-batch token budget in effect: ``micro_batch_tokens``, with ``"auto"`` resolved."""
        if self.micro_batch_tokens == "auto":
            return AUTO_MICRO_BATCH_TOKENS if self.micro_batch_size is None else None
        return self.micro_batch_tokens

    def _bound_checks(self) -> list[tuple[bool, str]]:
        low, high = self.sampling_correction_min, self.sampling_correction_max
        checks = [
            (low is None or low >= 0, f"update.sampling_correction_min must be >= 0 (None: the default), got {low!r}"),
            (high is None or high > 0, f"update.sampling_correction_max must be > 0 (None: the default), got {high!r}"),
        ]
        if self.sampling_correction in (BYPASS, None):
            unused = self.sampling_correction_min is None and self.sampling_correction_max is None
            checks.append(
                (
                    unused,
                    f"update.sampling_correction_min/max bound a weight, and update.sampling_correction="
                    f"{self.sampling_correction!r} applies none: leave them unset",
                )
            )
        elif self.sampling_correction in CORRECTIONS:
            low, high = self.correction_bounds
            checks.append(
                (
                    low < high,
                    f"update.sampling_correction_min must be below update.sampling_correction_max for "
                    f"{self.sampling_correction!r}, got [{low!r}, {high!r}]",
                )
            )
        return checks

    @property
    def correction_bounds(self) -> tuple[float, float]:
        """[low, high] of ``sampling_correction``: the settings, or the correction's defaults where ``None``;
        unbounded when the correction is off. ``auto`` must be resolved first (``for_engine``)."""
        if self.sampling_correction == AUTO:
            raise ValueError("update.sampling_correction='auto' has no bounds until for_engine resolves it")
        if self.sampling_correction in (BYPASS, None):
            return 0.0, math.inf
        return correction_bounds(self.sampling_correction, self.sampling_correction_min, self.sampling_correction_max)

    @property
    def off_policy(self) -> bool:
        """Whether some optimiser step runs on weights that did not sample (the ratio is then not 1)."""
        return self.num_iterations > 1 or self.steps_per_generation > 1

    @property
    def optimizer_steps_per_batch(self) -> int:
        return self.num_iterations * self.steps_per_generation
