"""Checks that need both the model and the data, run by ``lightning-grpo fit`` before any process is launched or
step taken: the dataset read and validated (``PromptDataModule.setup``: files, columns, one batch per rank), chat
prompts with a chat template, whole groups per optimiser step, and reward functions that accept what they are
given. Each names the setting to change. Prompts longer than ``sampling.max_prompt_length`` are not an error (they
keep their last tokens, as TRL cuts them) but get one line at start.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from lightning_grpo.data import PromptDataModule
from lightning_grpo.module import GRPOModule
from lightning_grpo.rewards.convention import check_signatures
from lightning_grpo.rollout import encode_prompts

PROMPTS_MEASURED = 10_000  # training prompts whose length is measured at start (the first ones): ~1 s of tokenizing


def preflight(trainer: L.Trainer, model: GRPOModule, datamodule: Any) -> None:
    if not isinstance(datamodule, PromptDataModule):
        return
    datamodule.trainer = trainer  # the number of processes, for the one-batch-per-rank rule
    datamodule.setup("fit")
    batch = datamodule.collate([datamodule.train_data[i] for i in range(datamodule.hparams.batch_size)])
    check_chat_template(model, batch.prompts)
    check_steps_per_generation(model.settings.update.steps_per_generation, datamodule.hparams.batch_size)
    added = model.engine.reward_columns()
    check_signatures(model.rewards.funcs, list(batch.columns), complete=added is not None, engine_columns=added or ())
    report_long_prompts(model, datamodule)


def report_long_prompts(model: GRPOModule, datamodule: PromptDataModule) -> None:
    """One warning when training prompts are longer than ``sampling.max_prompt_length``: how many of the first
    ``PROMPTS_MEASURED``, the longest, and what to set (``train/truncated_prompts`` counts them as they come)."""
    sampling = model.settings.sampling
    if not sampling.max_prompt_length:
        return
    data = datamodule.train_data
    rows = datamodule.collate([data[i] for i in range(min(len(data), PROMPTS_MEASURED))])
    lengths = [len(ids) for ids in encode_prompts(model.policy.tokenizer, rows.prompts, sampling)]
    longer = sum(n > sampling.max_prompt_length for n in lengths)
    if longer:
        rank_zero_warn(
            f"{longer} of {len(lengths)} training prompts are longer than model.sampling.max_prompt_length="
            f"{sampling.max_prompt_length} tokens (the longest: {max(lengths)}): they keep their last "
            f"{sampling.max_prompt_length} tokens. Raise model.sampling.max_prompt_length to keep them whole"
        )


def check_chat_template(model: GRPOModule, prompts: list) -> None:
    tokenizer = model.policy.tokenizer
    if any(isinstance(p, list) for p in prompts) and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"the prompts are chat messages (or data.system_prompt / data.few_shot make them so), but tokenizer "
            f"{tokenizer.name_or_path!r} has no chat_template: give plain-text prompts, or a tokenizer with one "
            "(model.policy.tokenizer)"
        )


def check_steps_per_generation(steps: int, batch_size: int) -> None:
    """Each optimiser step of a generation batch takes whole groups: the rule ``optimiser_steps`` applies."""
    if batch_size % steps:
        raise ValueError(
            f"model.update.steps_per_generation={steps} must divide data.batch_size={batch_size} (the prompts of a "
            "generation batch on each rank): set data.batch_size to a multiple of it"
        )
