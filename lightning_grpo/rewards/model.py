"""Prompt + completion -> a learned reward model's score. Any ``AutoModelForSequenceClassification`` works.

The model loads on first call (so configs can name one without paying for it at start-up) and scores
batches under ``torch.no_grad``. Chat-format samples go through the tokenizer's chat template when it has
one; otherwise prompt and completion texts are concatenated.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from lightning_grpo.rewards.text import completion_text


def _messages(sample: Any, role: str) -> list[dict[str, Any]]:
    """Chat messages of a prompt or completion; a plain string becomes one message of ``role``."""
    if isinstance(sample, list):
        return [m for m in sample if isinstance(m, dict)]
    return [{"role": role, "content": sample if isinstance(sample, str) else ""}]


class RewardModel:
    """A sequence-classification model as a reward function: the score is the logit of ``label_index``.

    Args:
        model_name_or_path: Hugging Face model name or local directory, with its tokenizer.
        batch_size: samples per forward pass.
        device: ``"cuda"``, ``"cpu"``...; ``None`` picks CUDA when available. ``to(device)`` moves it later.
        max_length: longest input in tokens; longer ones lose their beginning, so the completion's end stays.
        label_index: which output logit is the reward (reward models have one label: 0).
        empty_score: the score of an empty completion, which is not shown to the model.
        name: the ``__name__`` metrics use; default ``reward_model_<last path part>``.

    >>> RewardModel("Skywork/Skywork-Reward-V2-Qwen3-0.6B").__name__  # nothing is loaded yet
    'reward_model_Skywork-Reward-V2-Qwen3-0.6B'
    """

    is_slow = False  # compute-bound on the same device as training: threads would only contend for it

    def __init__(
        self,
        model_name_or_path: str,
        batch_size: int = 8,
        device: str | torch.device | None = None,
        max_length: int = 2048,
        label_index: int = 0,
        empty_score: float = 0.0,
        name: str | None = None,
    ) -> None:
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}")
        self.model_name_or_path = model_name_or_path
        self.batch_size, self.max_length, self.label_index = batch_size, max_length, label_index
        self.empty_score = empty_score
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        base = re.sub(r"[^\w.\-]", "_", str(model_name_or_path).rstrip("/").split("/")[-1])
        self.__name__ = name or f"reward_model_{base}"
        self.model: Any = None
        self.tokenizer: Any = None

    def to(self, device: str | torch.device) -> RewardModel:
        """Move the model (now, or when it loads) to ``device``."""
        self.device = torch.device(device)
        if self.model is not None:
            self.model.to(self.device)
        return self

    def load(self) -> None:
        """Load tokenizer and model; called by the first ``__call__``."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer  # slow import, first use only

        tokenizer = AutoTokenizer.from_pretrained(self.model_name_or_path)
        tokenizer.truncation_side = "left"  # the completion is at the end: keep it
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(self.model_name_or_path)
        num_labels = model.config.num_labels
        if not -num_labels <= self.label_index < num_labels:
            raise ValueError(f"label_index must be in [0, {num_labels}) for this model, got {self.label_index}")
        # The classifier reads the last non-pad token, so the model must know the pad id.
        model.config.pad_token_id = tokenizer.pad_token_id
        self.tokenizer, self.model = tokenizer, model.to(self.device).eval()

    def uses_template(self, prompt: Any, completion: Any) -> bool:
        """Chat-format samples go through the tokenizer's chat template, if it has one."""
        chat = isinstance(prompt, list) or isinstance(completion, list)
        return chat and bool(getattr(self.tokenizer, "chat_template", None))

    def text(self, prompt: Any, completion: Any) -> str:
        """The string the model scores: chat template over prompt + completion messages, or plain concatenation."""
        if self.uses_template(prompt, completion):
            messages = _messages(prompt, "user") + _messages(completion, "assistant")
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return completion_text(prompt) + completion_text(completion)

    @torch.no_grad()
    def score(self, texts: list[str], add_special_tokens: bool = True) -> list[float]:
        """The ``label_index`` logit of each text, ``batch_size`` texts per forward pass.

        Args:
            texts: [n] strings to score.
            add_special_tokens: False for chat-templated texts, which already contain them.
        """
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
                add_special_tokens=add_special_tokens,
            ).to(self.device)
            logits = self.model(**batch).logits  # [batch, num_labels]
            scores.extend(logits[:, self.label_index].float().tolist())
        return scores

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts for {len(completions)} completions: give one per completion")
        if self.model is None:
            self.load()
        keep = [i for i, c in enumerate(completions) if completion_text(c).strip()]
        texts = [self.text(prompts[i], completions[i]) for i in keep]
        templated = any(self.uses_template(prompts[i], completions[i]) for i in keep)
        scored = self.score(texts, add_special_tokens=not templated)
        scores: list[float | None] = [self.empty_score] * len(completions)
        for i, value in zip(keep, scored):
            scores[i] = value
        return scores
