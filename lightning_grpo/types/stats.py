"""The step record: what one training step did (``StepRecord``: its rollout, scores, advantages and ``StepStats``),
published by ``training_step`` and read by callbacks by attribute (``step_record``); and what a batch drawn without
an update showed (``DrawnBatch``, ``drawn_batch``: ``advantages.filter_groups`` waiting for groups with signal)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lightning_grpo.types.records import RewardScores, Rollout


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
    the global batch. ``distill.loss.distill_stats`` defines each number."""

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


def step_record(outputs: Any) -> StepRecord | None:
    """The record in a ``training_step`` output; ``None`` for a skipped step (it returns nothing)."""
    return outputs.get("record") if isinstance(outputs, dict) else None


@dataclass(frozen=True)
class DrawnBatch:
    """A generation batch that ``advantages.filter_groups`` scored and kept no update for (the buffer is filling),
    published as ``training_step``'s output ``{"drawn"}``: without it a run whose groups never differ would draw
    batches for ever with nothing to say so."""

    rollout: Rollout  # this rank's N completions of the batch, before its groups without signal were dropped
    scores: RewardScores  # [N, F] this rank's
    groups_with_signal: int  # of the batch's groups on every rank, those whose rewards differ (kept)


def drawn_batch(outputs: Any) -> DrawnBatch | None:
    """The drawn batch in a ``training_step`` output; ``None`` for a step that updated or was skipped."""
    return outputs.get("drawn") if isinstance(outputs, dict) else None
