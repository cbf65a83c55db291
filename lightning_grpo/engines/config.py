"""The ``sampling:`` section -> ``SamplingConfig``: how completions are sampled, in TRL's names, honoured by every
engine. Knows ``GenerationConfig``; nothing of a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import GenerationConfig, PreTrainedTokenizerBase

from lightning_grpo.checks import raise_problems
from lightning_grpo.docstrings import field_help


@field_help
@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled, TRL's names; every engine honours all of them. ``sampling:`` in YAML."""

    temperature: float = 1.0
    """Sampling temperature (> 0); log-probs are computed at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = 0
    """Top-k sampling; 0 disables it."""
    min_p: float | None = None
    """Min-p sampling; ``None`` disables it."""
    repetition_penalty: float = 1.0
    """1.0 disables it."""
    max_completion_length: int = 256
    """Most tokens sampled per completion. Tool episodes: every token the model wrote."""
    max_prompt_length: int | None = 512
    """Longer prompts keep their last tokens; ``None``: all. Counted in ``train/truncated_prompts``; TRL 1.16 has
    no such limit."""
    generation_kwargs: dict[str, Any] | None = None
    """More arguments of the engine's sampler. ``transformers.GenerationConfig`` for Hugging Face ``generate``,
    ``vllm.SamplingParams`` for vLLM: ``{no_repeat_ngram_size: 3}``."""
    chat_template_kwargs: dict[str, Any] | None = None
    """More arguments of the tokenizer's chat template for chat prompts. Qwen3's ``{enable_thinking: false}``."""

    def __post_init__(self) -> None:
        checks = [
            (self.temperature > 0, f"sampling.temperature must be > 0, got {self.temperature!r}"),
            (0 < self.top_p <= 1, f"sampling.top_p must be in (0, 1], got {self.top_p!r}"),
            (self.top_k >= 0, f"sampling.top_k must be >= 0 (0 disables it), got {self.top_k!r}"),
            (
                self.min_p is None or 0 <= self.min_p <= 1,
                f"sampling.min_p must be None or in [0, 1], got {self.min_p!r}",
            ),
            (self.repetition_penalty > 0, f"sampling.repetition_penalty must be > 0, got {self.repetition_penalty!r}"),
            (
                self.max_completion_length >= 1,
                f"sampling.max_completion_length must be >= 1, got {self.max_completion_length!r}",
            ),
            (
                self.max_prompt_length is None or self.max_prompt_length >= 1,
                f"sampling.max_prompt_length must be None or >= 1, got {self.max_prompt_length!r}",
            ),
        ]
        raise_problems("sampling", checks)

    def generation_config(self, tokenizer: PreTrainedTokenizerBase, greedy: bool = False) -> GenerationConfig:
        sampling = (
            {}
            if greedy
            else {
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "min_p": self.min_p,
            }
        )
        return GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=self.max_completion_length,
            repetition_penalty=self.repetition_penalty,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=True,
            **sampling,
            **(self.generation_kwargs or {}),
        )
