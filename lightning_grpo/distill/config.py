"""The ``distill:`` settings: on-policy distillation's section, each option checked once, beside its field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lightning_grpo.checks import raise_problems
from lightning_grpo.distill.loss import OBJECTIVES
from lightning_grpo.docstrings import field_help
from lightning_grpo.model.loading import DTYPES


@field_help
@dataclass(frozen=True)
class DistillConfig:
    """On-policy distillation from a frozen teacher. ``distill:`` in YAML; off while ``teacher`` is ``None``.

    The student samples (as in GRPO), the teacher scores the sampled tokens, and the student learns from the
    teacher's judgement, alone (``reward_weight: 0``, or no reward functions) or mixed with the rewards'
    advantages. ``beta``, ``lmbda`` and ``temperature`` are TRL's GKD names. references/distillation.md says when to
    distil and how to mix.
    """

    teacher: str | None = None
    """Hugging Face name or local path of the teacher (``AutoModelForCausalLM``); it must share the student's
    tokenizer. ``None``: no distillation."""
    teacher_dtype: Literal[tuple(DTYPES)] = "float32"
    """The teacher's weights dtype, its own (a bf16 teacher beside an fp32 student)."""
    teacher_init_kwargs: dict[str, Any] | None = None
    """More ``from_pretrained`` arguments for the teacher (``{attn_implementation: sdpa}``)."""
    teacher_server: str | None = None
    """URL of a ``vllm serve`` of the teacher (``http://host:8000``) that scores the sampled tokens in place of a
    copy loaded here (its tokenizer is still read from ``teacher``): reverse_kl at sampling temperature 1 only."""
    objective: Literal[tuple(OBJECTIVES)] = "reverse_kl"
    """reverse_kl: the per-token advantage ``-(log p_student - log p_teacher)`` of each sampled token (Thinking
    Machines' on-policy distillation); gkd: GKD's generalised JSD over the whole vocabulary at each completion
    position, added to the loss (a full-logit forward of both models per micro-batch)."""
    teacher_weight: float = 1.0
    """Weight of the teacher's signal: of its advantage (reverse_kl) or of the JSD term (gkd)."""
    reward_weight: float = 1.0
    """Weight of the reward functions' advantages; 0 trains on the teacher alone (the rewards are still logged)."""
    beta: float = 0.5
    """gkd: the JSD's interpolation, in [0, 1]: 0 the forward KL(teacher || student), 1 the reverse KL."""
    lmbda: float = 1.0
    """TRL's share of on-policy steps: each step, with probability ``1 - lmbda``, trains on the dataset's own
    completions (``completion_column``) in place of the student's samples (gkd only; TRL's GKD default is 0.5)."""
    completion_column: str = "completion"
    """The dataset column of the off-policy completions (``lmbda < 1``): a text, or chat messages."""
    temperature: float = 1.0
    """gkd: both models' logits are divided by it inside the divergence."""

    def __post_init__(self) -> None:
        raise_problems("distill", distill_checks(self))

    @property
    def enabled(self) -> bool:
        return self.teacher is not None


def distill_checks(c: DistillConfig) -> list[tuple[bool, str]]:
    """(ok, message) for every option of ``c``, each message naming the option, the value and what is allowed."""
    return [
        (c.objective in OBJECTIVES, f"distill.objective must be one of {sorted(OBJECTIVES)}, got {c.objective!r}"),
        (c.teacher_dtype in DTYPES, f"distill.teacher_dtype must be one of {sorted(DTYPES)}, got {c.teacher_dtype!r}"),
        (c.teacher_weight >= 0, f"distill.teacher_weight must be >= 0, got {c.teacher_weight!r}"),
        (c.reward_weight >= 0, f"distill.reward_weight must be >= 0, got {c.reward_weight!r}"),
        (0 <= c.beta <= 1, f"distill.beta must be in [0, 1], got {c.beta!r}"),
        (0 <= c.lmbda <= 1, f"distill.lmbda must be in [0, 1], got {c.lmbda!r}"),
        (
            c.lmbda == 1.0 or (c.objective == "gkd" and c.reward_weight == 0),
            f"distill.lmbda {c.lmbda!r} < 1 trains some steps on the dataset's completions, which the student did "
            f"not sample: only GKD's divergence is a valid objective there, not a policy gradient. Needs objective "
            f"gkd and reward_weight 0, got objective {c.objective!r}, reward_weight {c.reward_weight!r}; or lmbda 1.0",
        ),
        (c.temperature > 0, f"distill.temperature must be > 0, got {c.temperature!r}"),
        (
            c.teacher_server is None or c.teacher is not None,
            f"distill.teacher_server {c.teacher_server!r} needs distill.teacher: the teacher's name or path, whose "
            "tokenizer is checked against the student's",
        ),
        (
            c.teacher_server is None or not OBJECTIVES.get(c.objective, OBJECTIVES["reverse_kl"]).needs_logits,
            f"distill.objective {c.objective!r} needs the teacher's whole vocabulary at every position, which a "
            "server's log-probs do not give: use objective reverse_kl with distill.teacher_server, or unset "
            "teacher_server to load the teacher here",
        ),
    ]
