"""Checks of GRPOModule settings, run before any model is loaded. Lists every problem at once."""

from __future__ import annotations

from typing import Any

from lightning_grpo.advantages import SCALE_REWARDS
from lightning_grpo.loss import SAMPLING_CORRECTIONS, loss_config_problems
from lightning_grpo.models import DTYPES, cuda_package_problems
from lightning_grpo.rewards.scoring import ON_ERROR

# transformers.get_scheduler's schedules that need more than the warm-up and step counts GRPOModule passes.
NEEDS_MORE = {
    "cosine_with_min_lr": "min_lr or min_lr_rate (transformers' lr_scheduler_kwargs)",
    "cosine_warmup_with_min_lr": "min_lr or min_lr_rate (transformers' lr_scheduler_kwargs)",
    "warmup_stable_decay": "num_decay_steps (transformers' lr_scheduler_kwargs)",
    "reduce_lr_on_plateau": "a monitored metric at each step",
    "greedy": "a monitored metric at each step",
}
# Every other one (transformers.SchedulerType, which imports peft: listed here, checked by tests/test_library.py).
LR_SCHEDULERS = (
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt",
)  # fmt: skip


def _is_in(name: str, value: Any, allowed: tuple | list) -> str | None:
    return None if value in allowed else f"{name} must be one of {sorted(allowed, key=str)}, got {value!r}"


def _at_least(name: str, value: Any, low: float, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    return None if value is not None and value >= low else f"{name} must be >= {low}, got {value!r}"


def _scheduler(name: str) -> str | None:
    if name in NEEDS_MORE:
        return (
            f"lr_scheduler_type {name!r} needs {NEEDS_MORE[name]}, which GRPOModule does not pass; "
            f"choose one of {sorted(LR_SCHEDULERS)}"
        )
    return _is_in("lr_scheduler_type", name, LR_SCHEDULERS)


def _qlora_runs_here(load_in_4bit: bool, peft_config: dict | None) -> str | None:
    if not load_in_4bit:
        return None
    problems = cuda_package_problems("bitsandbytes", "bitsandbytes 4-bit layers")
    problems += [] if peft_config else ["4-bit weights cannot train: give a peft_config adapter"]
    return f"load_in_4bit (QLoRA) cannot run: {'; '.join(problems)}" if problems else None


def settings_problems(s: dict[str, Any]) -> list[str]:
    """Every invalid setting in ``s`` (GRPOModule's constructor arguments), as messages."""
    epsilon_high = s["epsilon"] if s["epsilon_high"] is None else s["epsilon_high"]
    checks = [
        _at_least("num_generations", s["num_generations"], 2),
        _at_least("max_completion_length", s["max_completion_length"], 1),
        _at_least("max_prompt_length", s["max_prompt_length"], 1, optional=True),
        _at_least("num_iterations", s["num_iterations"], 1),
        _at_least("micro_batch_size", s["micro_batch_size"], 1, optional=True),
        _at_least("logprob_chunk_size", s["logprob_chunk_size"], 1, optional=True),
        _at_least("top_k", s["top_k"], 0),
        _at_least("max_bad_steps", s["max_bad_steps"], 1),
        _is_in("on_reward_error", s["on_reward_error"], list(ON_ERROR)),
        _is_in("sampling_correction", s["sampling_correction"], [*SAMPLING_CORRECTIONS, None]),
        _qlora_runs_here(s["load_in_4bit"], s["peft_config"]),
        _at_least("repetition_penalty", s["repetition_penalty"], 1e-6),
        _is_in("scale_rewards", s["scale_rewards"], SCALE_REWARDS),
        _scheduler(s["lr_scheduler_type"]),
        _is_in("dtype", s["dtype"], list(DTYPES)),
        None if s["temperature"] > 0 else f"temperature must be > 0, got {s['temperature']!r}",
        None if 0 < s["top_p"] <= 1 else f"top_p must be in (0, 1], got {s['top_p']!r}",
        None if 0 < s["epsilon"] < 1 else f"epsilon must be in (0, 1), got {s['epsilon']!r}",
        None if s["learning_rate"] > 0 else f"learning_rate must be > 0, got {s['learning_rate']!r}",
        None if 0 <= s["warmup_ratio"] < 1 else f"warmup_ratio must be in [0, 1), got {s['warmup_ratio']!r}",
        None
        if s["delta"] is None or s["delta"] > 1 + epsilon_high
        else f"delta must be None or > 1 + epsilon_high = {1 + epsilon_high}, got {s['delta']!r}",
        None
        if s["reward_timeout"] is None or s["reward_timeout"] > 0
        else f"reward_timeout must be None or > 0 seconds, got {s['reward_timeout']!r}",
        None
        if s["max_grad_norm"] is None or s["max_grad_norm"] > 0
        else f"max_grad_norm must be None or > 0, got {s['max_grad_norm']!r}",
    ]
    return [c for c in checks if c] + loss_config_problems(s)


def check_settings(s: dict[str, Any]) -> None:
    problems = settings_problems(s)
    if problems:
        raise ValueError("invalid GRPOModule settings:\n  - " + "\n  - ".join(problems))
