"""Dataset rows -> prompt batches: ``PromptDataModule``, the LightningDataModule that loads, checks, holds out and
batches them. Every column other than the prompt is forwarded, per row, to the reward functions (``answer``,
``solution``, test cases ...); the chat template is applied later, by the rollout stage, which owns the tokenizer.
Validation rows are never training rows: without a validation split, some training rows are held out."""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_grpo.checks import listing
from lightning_grpo.data.files import load_any
from lightning_grpo.data.rows import (
    PROMPT_TYPES,
    as_chat,
    check_few_shot,
    held_out_size,
    mixed_kinds,
    prompt_characters,
    prompt_problems,
)
from lightning_grpo.images import IMAGE_TYPES, image_column, image_problems
from lightning_grpo.types import PromptBatch

if TYPE_CHECKING:
    from datasets import Dataset


class PromptDataModule(L.LightningDataModule):
    """Prompts for GRPO from any dataset, with every other column kept for the reward functions.

    Validation rows are never training rows. With the default settings, a dataset without a ``validation``
    split (a single file, a plain ``save_to_disk`` Dataset) holds out 5% of its training rows for validation
    and says so in one line; ``val_size`` sets how many; ``val_split: null`` without ``val_size`` turns
    validation off (said in one line too).

    Args:
        dataset: Hugging Face dataset name, a ``save_to_disk`` directory, a JSON/JSONL/CSV/Parquet file, or a
            directory holding ``train.jsonl`` (and ``validation.jsonl``).
        batch_size: prompts per step on each rank (B). Each prompt is sampled ``num_generations`` times, so a
            step on one rank holds ``batch_size * num_generations`` completions.
        prompt_column: the column holding a string or a list of chat messages (``[{role, content}, ...]``).
        system_prompt: a system message put in front of every prompt. A plain-text prompt then becomes the
            user message of a chat, formatted by the tokenizer's chat template (which it must have); a chat
            prompt that has its own system message keeps it.
        few_shot: example turns put after the system message and before the prompt, e.g.
            ``[{role: user, content: "1+1="}, {role: assistant, content: "2"}]``; plain-text prompts become chat
            messages, as with ``system_prompt``.
        config_name: the dataset's configuration name on the hub (e.g. ``"main"`` for gsm8k).
        train_split: split to train on.
        val_split: split to validate on. When the dataset has no such split, ``val_size`` training rows are
            held out instead. ``null``: do not look for one (validation only from ``val_size``).
        val_size: training rows held out for validation when ``val_split`` is missing or ``null``: a number of
            rows, or a fraction below 1. Unset: 5% of the rows (at least 1, at most 500), or none when
            ``val_split`` is ``null``. 0: no validation.
        max_val_prompts: use at most this many validation prompts.
        test_split: split ``trainer.test`` scores (held-out reward and accuracy, like validation) and
            ``trainer.predict`` completes (it falls back to the validation rows when the split is missing).
        num_workers: DataLoader workers.
        split_seed: shuffling seed for the held-out split.
        shuffle_dataset: shuffle the training prompts each epoch (TRL's option). ``false`` takes them in the
            dataset's order (a curriculum).
    """

    def __init__(
        self,
        dataset: str,
        batch_size: int = 8,
        prompt_column: str = "prompt",
        system_prompt: str | None = None,
        few_shot: list[dict[str, str]] | None = None,
        config_name: str | None = None,
        train_split: str = "train",
        val_split: str | None = "validation",
        val_size: int | float | None = None,
        max_val_prompts: int | None = None,
        test_split: str = "test",
        num_workers: int = 0,
        split_seed: int = 0,
        shuffle_dataset: bool = True,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size (prompts per step) must be >= 1, got {batch_size}")
        if val_split is not None and val_split == train_split:
            raise ValueError(
                f"val_split and train_split are both {val_split!r}: validation rows must not be training rows; "
                "set val_split: null and val_size to hold some out"
            )
        if val_size is not None and val_size < 0:
            raise ValueError(f"val_size must be a number of rows, a fraction below 1, or 0, got {val_size}")
        check_few_shot(few_shot)
        self.save_hyperparameters()
        self.train_data: Dataset | None = None
        self.val_data: Dataset | None = None
        self.prompt_sizes: list[int] = []
        """[rows] characters of each training prompt, row i of the train split as loaded (before any hold-out)."""
        self.test_data: Dataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_data is not None:
            return
        hp = self.hparams
        train = self._checked(load_any(hp.dataset, hp.train_split, hp.config_name, hp.prompt_column), hp.train_split)
        self.prompt_sizes = prompt_characters(train, hp.prompt_column)
        val = None
        if hp.val_split is not None:
            try:
                val = load_any(hp.dataset, hp.val_split, hp.config_name, hp.prompt_column)
            except (FileNotFoundError, ValueError, KeyError):  # no such split; a broken one fails below
                val = None
        if val is None:
            train, val = self._held_out(train)
        else:
            val = self._checked(val, hp.val_split)
        if val is not None and hp.max_val_prompts:
            val = val.select(range(min(hp.max_val_prompts, len(val))))
        self._check_one_batch(train, val)
        self.train_data, self.val_data = train, val

    def _check_one_batch(self, train: Dataset, val: Dataset | None) -> None:
        """Every rank draws at least one full batch of prompts: fewer rows would train on short batches."""
        hp, ranks = self.hparams, self.trainer.world_size if self.trainer is not None else 1
        if len(train) >= hp.batch_size * ranks:
            return
        held = f" ({len(val)} more are held out for validation: data.val_size)" if val is not None else ""
        per_rank = f" on each of {ranks} processes" if ranks > 1 else ""
        raise ValueError(
            f"dataset {hp.dataset!r} has {len(train)} training rows{held}, fewer than one batch: data.batch_size="
            f"{hp.batch_size} prompts{per_rank}. Lower data.batch_size or add rows"
        )

    def _held_out(self, train: Dataset) -> tuple[Dataset, Dataset | None]:
        """``(train, val)`` with ``val`` carved out of ``train``, or ``(train, None)`` said out loud."""
        hp = self.hparams
        missing = f"dataset {hp.dataset!r} has no {hp.val_split!r} split" if hp.val_split else "val_split is null"
        opted_out = hp.val_split is None and not hp.val_size
        size = 0 if opted_out else held_out_size(hp.val_size, len(train))
        if size < 1:  # loud unless asked for
            say = rank_zero_info if opted_out else rank_zero_warn
            say(f"No validation: {missing} and no rows are held out (set data.val_size to hold some out).")
            return train, None
        parts = train.train_test_split(test_size=size, seed=hp.split_seed)
        rank_zero_info(
            f"Validation: {missing}, so {size} of its {len(train)} training rows are held out for validation "
            "(data.val_size; 0 for none)."
        )
        return parts["train"], parts["test"]

    def _checked(self, data: Dataset, split: str) -> Dataset:
        column = self.hparams.prompt_column
        if column not in data.column_names:
            raise ValueError(
                f"prompt_column {column!r} is not a column of dataset {self.hparams.dataset!r} ({split} split); "
                f"its columns are {data.column_names}"
            )
        if len(data) == 0:
            raise ValueError(f"dataset {self.hparams.dataset!r} has no rows in its {split!r} split")
        problems = prompt_problems(data, column)
        if problems:
            raise ValueError(
                f"dataset {self.hparams.dataset!r} ({split} split) has {len(problems)} rows whose data.prompt_column "
                f"{column!r} is not a prompt; all of them:\n{listing(problems)}\nA prompt is {PROMPT_TYPES}"
            )
        self._check_mixed(data, split)
        self._check_images(data, split)
        return data

    def _check_mixed(self, data: Dataset, split: str) -> None:
        """One split's prompts are all plain text or all chat messages (a JSON column can hold both)."""
        column = self.hparams.prompt_column
        if getattr(data.features.get(column), "dtype", None) in ("string", "large_string"):
            return  # a text column: one kind, and reading it costs time
        mixed = mixed_kinds(data[column])
        if mixed:
            raise ValueError(
                f"dataset {self.hparams.dataset!r} ({split} split) mixes plain-text and chat prompts in "
                f"data.prompt_column {column!r}: {mixed}. A step renders its prompts one way: give every row chat "
                'messages ([{"role": "user", "content": TEXT}] for a text row), or every row plain text'
            )

    def _check_images(self, data: Dataset, split: str) -> None:
        """Every image of an ``image``/``images`` column opens, and chat prompts have one image part per image."""
        column = image_column(data.column_names)
        problems = image_problems(data, column, self.hparams.prompt_column) if column else []
        if problems:
            raise ValueError(
                f"dataset {self.hparams.dataset!r} ({split} split) has {len(problems)} image problems; all of them:\n"
                f"{listing(problems)}\nAn image is {IMAGE_TYPES}"
            )

    def collate(self, rows: list[dict[str, Any]]) -> PromptBatch:
        hp = self.hparams
        column = hp.prompt_column
        prompts = [as_chat(r[column], hp.system_prompt, hp.few_shot) for r in rows]
        columns = {k: [r[k] for r in rows] for k in rows[0] if k != column}
        return PromptBatch(prompts=prompts, columns=columns)

    def train_dataloader(self) -> StatefulDataLoader:
        # Stateful: a checkpoint holds the position in the epoch and the shuffling generator, so a resumed
        # run continues with the very next batch instead of restarting the epoch.
        sampler = self._distributed_sampler()
        with warnings.catch_warnings():  # torchdata calls a deprecated torch API when built: not the user's concern
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            return StatefulDataLoader(
                self.train_data,
                batch_size=self.hparams.batch_size,
                shuffle=self.hparams.shuffle_dataset if sampler is None else None,
                sampler=sampler,
                drop_last=len(self.train_data) >= self.hparams.batch_size,
                collate_fn=self.collate,
                num_workers=self.hparams.num_workers,
            )

    def _distributed_sampler(self) -> DistributedSampler | None:
        """Each rank's share of a permutation that depends only on the seed and the epoch, so that a run resumed
        mid-epoch on several ranks draws the same one and skips what it had taken (torchdata counts the samples
        yielded). Lightning would otherwise wrap torchdata's shuffling sampler, not a ``RandomSampler``, in a
        ``DistributedSamplerWrapper`` whose permutation comes from the global RNG: another one after a resume."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return None
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # Lightning's own choice for the samplers it makes
        return DistributedSampler(
            self.train_data,
            num_replicas=trainer.world_size,
            rank=trainer.global_rank,
            shuffle=self.hparams.shuffle_dataset,
            seed=seed,
        )

    def val_dataloader(self) -> DataLoader | list:
        return [] if self.val_data is None else self._evaluation_loader(self.val_data)

    def test_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self._test_rows(fall_back=False))

    def predict_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self._test_rows(fall_back=True))

    def _test_rows(self, fall_back: bool) -> Dataset:
        """The ``test_split`` rows; for predict, the validation rows when there is no such split."""
        hp = self.hparams
        if self.test_data is None:
            try:
                self.test_data = self._checked(
                    load_any(hp.dataset, hp.test_split, hp.config_name, hp.prompt_column), hp.test_split
                )
            except (FileNotFoundError, ValueError, KeyError) as err:
                if fall_back and self.val_data is not None:
                    return self.val_data
                raise ValueError(
                    f"test_split {hp.test_split!r} cannot be read from dataset {hp.dataset!r} ({err}): set "
                    "data.test_split to a split the dataset has"
                ) from err
        return self.test_data

    def _evaluation_loader(self, rows: Dataset) -> DataLoader:
        return DataLoader(
            rows, batch_size=self.hparams.batch_size * 4, collate_fn=self.collate, num_workers=self.hparams.num_workers
        )
