"""Dataset rows -> prompt batches. Knows files and Hugging Face datasets; nothing about models or tokenizers.

- ``files.py``: a source (a file, a saved dataset, a hub name, an embedded demo) -> a ``Dataset``, a text file's bad
  line named before it loads;
- ``rows.py``: what a prompt is, each bad row named, chat messages with a system prompt and few-shot examples;
- ``module.py``: ``PromptDataModule``, the LightningDataModule that loads, checks, holds out and batches them.

This file only hands their names on.
"""

from lightning_grpo.data.files import load_any
from lightning_grpo.data.module import PromptDataModule
from lightning_grpo.data.rows import PROMPT_TYPES, prompt_problem, prompt_problems

__all__ = ["PROMPT_TYPES", "PromptDataModule", "load_any", "prompt_problem", "prompt_problems"]
