"""The ``update:`` settings: how one scored generation batch becomes optimiser steps. Checked once, here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from lightning_grpo.checks import raise_problems
from lightning_grpo.docstrings import field_help
from lightning_grpo.targets.correction import (
    AUTO,
    SAMPLING_CORRECTIONS,
    SamplerCorrection,
    correction_problems,
    resolve_auto,
    resolved_bounds,
)

AUTO_MICRO_BATCH_TOKENS = 16384  # verl's ppo_max_token_len_per_gpu: one pass of the prompt-and-completion tokens


@field_help
@dataclass(frozen=True)
class UpdateConfig:
    """How a generation batch is trained on, TRL's names. ``update:`` in YAML."""

    num_iterations: int = 1
    """Passes over each generation batch (mu); > 1 keeps the sampling log-probs, and the later passes are
    off-policy (clipped)."""
    steps_per_generation: int = 1
    """Optimiser steps per generation batch, each on its share of the batch's groups (rollouts reused, the later
    steps off-policy); ``data.batch_size`` must be a multiple of it."""
    micro_batch_size: int | None = None
    """Completions per forward/backward pass; gradients accumulate over the optimiser step. ``None`` takes all at
    once (up to ``micro_batch_tokens``). Any value gives the same update."""
    micro_batch_tokens: int | Literal["auto"] | None = "auto"
    """Most padded tokens per micro-batch (verl's ``use_dynamic_bsz``). Micro-batches of rows of similar lengths, each
    at most this many tokens as the padded forward holds them (rows x (the longest prompt + the longest completion), so
    a long prompt beside a long completion counts both; a longer row goes alone). Rows are sorted by length, longest
    first, so little padding is computed and the first micro-batch shows the peak memory. Whole groups with
    ``policy.share_prompt_prefix``. The same update as any other split. ``"auto"`` (the default): 16384 (verl's
    ``ppo_max_token_len_per_gpu``), a batch within it goes in one pass, as before; none when ``micro_batch_size`` is
    set. ``None``: off."""
    mask_truncated_completions: bool = False
    """Drop completions without EOS from the loss (DAPO)."""
    sampling_correction: Literal[(*SAMPLING_CORRECTIONS, AUTO)] | None = AUTO
    """Re-weighting of another engine's samples (vLLM, async). The policy term is weighted by the
    trainer/sampler probability ratio rho (``targets/correction.py`` owns the choices; default bounds in
    brackets): TRL's token_truncate, token_mask, sequence_truncate, sequence_mask (TRL's default) [rho <= 3];
    icepop, token_mask [0.5, 5]; geometric_mask, a completion kept (weight 1) while the geometric mean of its
    token ratios is inside [0.999, 1.001] (verl's preset) and dropped otherwise; decoupled, AReaL's behaviour
    weight, token_mask [5]; bypass, no weight: the loss's ratio and clip are taken against the sampler's
    log-probs (verl's ``bypass_mode``; for async, where the sampler is updates behind); ``"auto"`` (the
    default): ``bypass`` when the engine samples updates ahead (``AsyncRollouts`` with ``max_staleness`` > 0,
    where async then learns as synchronous does, and less with re-weighting only: ``references/scale.md``),
    TRL's ``sequence_mask`` otherwise; or ``None`` (off). Weights logged as
    ``train/sampling/importance_sampling_ratio/*``; the mismatch itself as ``train/sampling/*``, with the
    correction off too."""
    sampling_correction_min: float | None = None
    """The ratio's lower bound (TRL's ``vllm_importance_sampling_clip_min``); ``None`` takes the correction's
    default (none for TRL's four)."""
    sampling_correction_max: float | None = None
    """The ratio's upper bound (TRL's ``vllm_importance_sampling_clip_max``): clamped for ``*_truncate``, zeroed
    above for the masks; ``None`` takes the correction's default, ``.inf`` none."""

    def __post_init__(self) -> None:
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
                *correction_problems(*self._correction_settings),
            ],
        )

    def for_engine(self, max_staleness: int) -> UpdateConfig:
        """These settings with ``sampling_correction: auto`` resolved for an engine whose samples are up to
        ``max_staleness`` updates behind (``RolloutEngine.max_staleness``), by the rule of
        ``targets.correction.resolve_auto``."""
        name = resolve_auto(*self._correction_settings, max_staleness)
        return self if name == self.sampling_correction else dataclasses.replace(self, sampling_correction=name)

    @property
    def token_budget(self) -> int | None:
        """The micro-batch token budget in effect: ``micro_batch_tokens``, with ``"auto"`` resolved."""
        if self.micro_batch_tokens == "auto":
            return AUTO_MICRO_BATCH_TOKENS if self.micro_batch_size is None else None
        return self.micro_batch_tokens

    @property
    def correction(self) -> SamplerCorrection:
        """The sampler correction these settings name, its bounds resolved; ``auto`` must be resolved first
        (``for_engine``)."""
        return SamplerCorrection(self.sampling_correction, *self.correction_bounds)

    @property
    def correction_bounds(self) -> tuple[float, float]:
        """[low, high] of ``sampling_correction``: the settings, or the correction's defaults where ``None``;
        unbounded when the correction is off."""
        return resolved_bounds(*self._correction_settings)

    @property
    def _correction_settings(self) -> tuple[str | None, float | None, float | None]:
        return self.sampling_correction, self.sampling_correction_min, self.sampling_correction_max

    @property
    def off_policy(self) -> bool:
        """Whether some optimiser step runs on weights that did not sample (the ratio is then not 1)."""
        return self.num_iterations > 1 or self.steps_per_generation > 1

    @property
    def optimizer_steps_per_batch(self) -> int:
        return self.num_iterations * self.steps_per_generation
