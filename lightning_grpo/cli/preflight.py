"""Checks that need both the model and the data, run by ``lightning-grpo fit`` before any process is launched or
step taken: the dataset read and validated (``PromptDataModule.setup``: files, columns, images, one batch per rank),
chat prompts with a chat template, images with a vision-language model, whole groups per optimiser step, and reward
functions that accept what they are given. Each names the setting to change. Prompts longer than
``sampling.max_prompt_length`` are not an error (they keep their last tokens, as TRL cuts them) but get one line at
start, and so do rows so long that tokenizing them costs more memory than the model's whole training state: the cut
comes after tokenizing, so it saves nothing there.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines.prompts import encode_prompts
from lightning_grpo.images import image_column
from lightning_grpo.module import GRPOModule
from lightning_grpo.rewards.convention import check_signatures

PROMPTS_MEASURED = 10_000  # training prompts whose length is measured at start (the first ones): ~1 s of tokenizing
# A fast tokenizer holds ~330 bytes per token while it encodes (ids, offsets, type ids, the token strings): a 5 MB
# prompt raised a tiny run's peak memory from 550 MB to 1,556 MB. One token a character: an upper bound.
TOKENIZING_BYTES_PER_CHARACTER = 330


def check_data_first(data: dict[str, Any]) -> None:
    """The ``data:`` section's dataset read and checked before the model loads (``lightning-grpo fit`` runs it
    first): its files line by line, every row's prompt, one batch; each problem of a file named at once. The
    processes are not known yet: ``preflight`` checks one batch on each of them again."""
    PromptDataModule(**data).setup("fit")


def preflight(trainer: L.Trainer, model: GRPOModule, datamodule: Any) -> None:
    if not isinstance(datamodule, PromptDataModule):
        return
    datamodule.trainer = trainer  # the number of processes, for the one-batch-per-rank rule
    datamodule.setup("fit")
    batch = datamodule.collate([datamodule.train_data[i] for i in range(datamodule.hparams.batch_size)])
    check_chat_template(model, batch.prompts)
    check_images(model, batch.columns)
    check_steps_per_generation(model.settings.update.steps_per_generation, datamodule.hparams.batch_size)
    added = model.engine.reward_columns()
    check_signatures(model.rewards.funcs, list(batch.columns), complete=added is not None, engine_columns=added or ())
    report_long_prompts(model, datamodule)
    report_costly_rows(model, datamodule)


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


def training_state_bytes(model: nn.Module) -> int:
    """The memory a run holds whatever its data: every weight, and for a trained one its gradient and AdamW's two
    moments."""
    return sum(p.numel() * p.element_size() * (4 if p.requires_grad else 1) for p in model.parameters())


def report_costly_rows(model: GRPOModule, datamodule: PromptDataModule) -> None:
    """One warning naming the longest training row when tokenizing a row costs more memory than the model's
    training state (``training_state_bytes``): the run's budget, which no ``max_prompt_length`` cut protects."""
    sizes, budget = datamodule.prompt_sizes, training_state_bytes(model.policy.model)
    costly = [i for i, n in enumerate(sizes) if n * TOKENIZING_BYTES_PER_CHARACTER > budget]
    if not costly:
        return
    row = max(costly, key=sizes.__getitem__)
    cost = sizes[row] * TOKENIZING_BYTES_PER_CHARACTER
    rank_zero_warn(
        f"{len(costly)} training row(s) are so long that tokenizing one costs more memory than the model's training "
        f"state ({megabytes(budget)}: weights, gradients, optimiser moments). The longest, row {row} of "
        f"{datamodule.hparams.dataset!r} (data.prompt_column {datamodule.hparams.prompt_column!r}), holds "
        f"{sizes[row]:,} characters: up to {megabytes(cost)} each time it is drawn, even though "
        f"model.sampling.max_prompt_length={model.settings.sampling.max_prompt_length} cuts it after tokenizing. "
        "Drop or shorten such rows in the data (e.g. datasets' filter on the prompt's length)"
    )


def megabytes(n: int) -> str:
    """
    >>> megabytes(1_650_000_000)
    '1,574 MB'
    """
    return f"{n / 2**20:,.0f} MB"


def check_chat_template(model: GRPOModule, prompts: list) -> None:
    tokenizer = model.policy.tokenizer
    if any(isinstance(p, list) for p in prompts) and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"the prompts are chat messages (or data.system_prompt / data.few_shot make them so), but tokenizer "
            f"{tokenizer.name_or_path!r} has no chat_template: give plain-text prompts, or a tokenizer with one "
            "(model.policy.tokenizer)"
        )


def check_images(model: GRPOModule, columns: dict[str, Any]) -> None:
    """Images in the data need a vision-language policy: a text model would train without ever seeing them."""
    column = image_column(columns)
    if column is not None and not model.policy.is_multimodal:
        raise ValueError(
            f"the dataset has an {column!r} column, but model.model {model.hparams.get('model')!r} is a text model "
            f"({type(model.policy.model).__name__}): give an AutoModelForImageTextToText model (references/vision.md), "
            "or drop the column"
        )


def check_steps_per_generation(steps: int, batch_size: int) -> None:
    """Each optimiser step of a generation batch takes whole groups: the rule ``optimiser_steps`` applies."""
    if batch_size % steps:
        raise ValueError(
            f"model.update.steps_per_generation={steps} must divide data.batch_size={batch_size} (the prompts of a "
            "generation batch on each rank): set data.batch_size to a multiple of it"
        )
