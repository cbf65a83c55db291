"""Checks of GRPOModule's top-level settings, run before any model is loaded; each section (``sampling``,
``loss``, ``advantages``, ``optim``) checks itself when it is built. Lists every problem at once."""

from __future__ import annotations

from typing import Any

from lightning_grpo.checks import raise_problems
from lightning_grpo.loss.grpo import SAMPLING_CORRECTIONS
from lightning_grpo.model.loading import DTYPES, cuda_package_problems
from lightning_grpo.rewards.scoring import ON_ERROR


def _at_least(name: str, value: Any, low: float, optional: bool = False) -> tuple[bool, str]:
    ok = (value is None and optional) or (value is not None and value >= low)
    return ok, f"{name} must be {'None or ' if optional else ''}>= {low}, got {value!r}"


def _qlora_runs_here(load_in_4bit: bool, peft_config: dict | None) -> tuple[bool, str]:
    problems = cuda_package_problems("bitsandbytes", "bitsandbytes 4-bit layers") if load_in_4bit else []
    problems += ["4-bit weights cannot train: give a peft_config adapter"] if load_in_4bit and not peft_config else []
    return not problems, f"load_in_4bit (QLoRA) cannot run: {'; '.join(problems)}"


def check_settings(s: dict[str, Any], section_problems: list[str] = ()) -> None:
    """Every invalid top-level setting in ``s`` (GRPOModule's constructor arguments, sections already built),
    in one error with the sections' own (``section_problems``)."""
    reference = s["loss"].beta > 0 or s["advantages"].kl_coef > 0
    checks = [(False, problem.replace("\n  - ", "\n    - ")) for problem in section_problems]
    raise_problems(
        "GRPOModule",
        checks
        + [
            _at_least("num_generations", s["num_generations"], 2),
            _at_least("num_generations_eval", s["num_generations_eval"], 1, optional=True),
            _at_least("num_iterations", s["num_iterations"], 1),
            _at_least("steps_per_generation", s["steps_per_generation"], 1),
            _at_least("micro_batch_size", s["micro_batch_size"], 1, optional=True),
            _at_least("logprob_chunk_size", s["logprob_chunk_size"], 1, optional=True),
            _at_least("max_bad_steps", s["max_bad_steps"], 1),
            _at_least("ref_model_sync_steps", s["ref_model_sync_steps"], 1),
            (
                s["on_reward_error"] in ON_ERROR,
                f"on_reward_error must be one of {list(ON_ERROR)}, got {s['on_reward_error']!r}",
            ),
            (
                s["sampling_correction"] in (*SAMPLING_CORRECTIONS, None),
                f"sampling_correction must be one of {[*SAMPLING_CORRECTIONS, None]}, got {s['sampling_correction']!r}",
            ),
            (s["dtype"] in DTYPES, f"dtype must be one of {sorted(DTYPES)}, got {s['dtype']!r}"),
            _qlora_runs_here(s["load_in_4bit"], s["peft_config"]),
            (
                s["reward_timeout"] is None or s["reward_timeout"] > 0,
                f"reward_timeout must be None or > 0 seconds, got {s['reward_timeout']!r}",
            ),
            (
                0 <= s["ref_model_mixup_alpha"] <= 1,
                f"ref_model_mixup_alpha must be in [0, 1], got {s['ref_model_mixup_alpha']!r}",
            ),
            (
                not s["sync_ref_model"] or (reference and not s["peft_config"]),
                "sync_ref_model=True updates a reference copy: it needs loss.beta > 0 (or advantages.kl_coef > 0) "
                f"and no peft_config (the LoRA reference is the adapter switched off), got beta={s['loss'].beta} "
                f"and peft_config={s['peft_config']!r}",
            ),
        ],
    )
