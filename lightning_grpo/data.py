"""Dataset rows -> prompt batches. Knows files and Hugging Face datasets; nothing about models or tokenizers.

Every column other than the prompt is forwarded, per row, to the reward functions (``answer``, ``solution``,
test cases ...). The chat template is applied later, by the rollout stage, which owns the tokenizer.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_grpo import demo
from lightning_grpo.types import PromptBatch

if TYPE_CHECKING:
    from datasets import Dataset

FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_any(source: str, split: str, name: str | None = None) -> Dataset:
    """A split from a hub name, a ``save_to_disk`` directory, a JSON/JSONL/CSV/Parquet file, or a directory
    of ``<split>.<ext>`` files."""
    from datasets import DatasetDict, load_dataset, load_from_disk  # pandas and pyarrow: only when data loads

    if source in demo.EMBEDDED:
        source = str(demo.materialize(source))
    path = Path(source)
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()):
        loaded = load_from_disk(str(path))
        return loaded[split] if isinstance(loaded, DatasetDict) else loaded
    if path.is_dir():
        files = sorted(p for p in path.glob(f"{split}.*") if p.suffix in FILE_FORMATS)
        if not files:
            raise FileNotFoundError(f"dataset directory {source!r} has no {split}.(json|jsonl|csv|parquet) file")
        return load_dataset(FILE_FORMATS[files[0].suffix], data_files=str(files[0]), split="train")
    if path.suffix in FILE_FORMATS:
        if not path.exists():
            raise FileNotFoundError(f"dataset file {source!r} does not exist")
        if path.stat().st_size == 0:
            raise ValueError(f"dataset {source!r} has no rows: the file is empty")
        if split != "train":  # a single file is one split, which the datasets library names "train"
            raise FileNotFoundError(f"dataset file {source!r} holds only the 'train' split, not {split!r}")
        return load_dataset(FILE_FORMATS[path.suffix], data_files=str(path), split="train")
    return load_dataset(source, name, split=split)


def with_system_prompt(prompt: Any, system_prompt: str | None) -> Any:
    """Prepend a system message to a chat prompt; plain text prompts are left as they are."""
    if system_prompt is None or not isinstance(prompt, list) or (prompt and prompt[0].get("role") == "system"):
        return prompt
    return [{"role": "system", "content": system_prompt}, *prompt]


class PromptDataModule(L.LightningDataModule):
    """Prompts for GRPO from any dataset, with every other column kept for the reward functions.

    Args:
        dataset: Hugging Face dataset name, a ``save_to_disk`` directory, a JSON/JSONL/CSV/Parquet file, or a
            directory holding ``train.jsonl`` (and ``validation.jsonl``).
        batch_size: prompts per step on each rank (B). Each prompt is sampled ``num_generations`` times, so a
            step on one rank holds ``batch_size * num_generations`` completions.
        prompt_column: the column holding a string or a list of chat messages.
        system_prompt: prepended as a system message to chat prompts.
        config_name: the dataset's configuration name on the hub (e.g. ``"main"`` for gsm8k).
        train_split: split to train on.
        val_split: split reported on during validation; ``None`` for no validation.
        val_size: when ``val_split`` is absent from the dataset, hold out this many training rows instead.
        max_val_prompts: use at most this many validation prompts.
        num_workers: DataLoader workers.
        split_seed: shuffling seed for the held-out split.
    """

    def __init__(
        self,
        dataset: str,
        batch_size: int = 8,
        prompt_column: str = "prompt",
        system_prompt: str | None = None,
        config_name: str | None = None,
        train_split: str = "train",
        val_split: str | None = "validation",
        val_size: int = 0,
        max_val_prompts: int | None = None,
        num_workers: int = 0,
        split_seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size (prompts per step) must be >= 1, got {batch_size}")
        self.save_hyperparameters()
        self.train_data: Dataset | None = None
        self.val_data: Dataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_data is not None:
            return
        hp = self.hparams
        train = self._checked(load_any(hp.dataset, hp.train_split, hp.config_name), hp.train_split)
        val = None
        if hp.val_split is not None:
            try:
                val = self._checked(load_any(hp.dataset, hp.val_split, hp.config_name), hp.val_split)
            except (FileNotFoundError, ValueError, KeyError):
                if hp.val_size:
                    parts = train.train_test_split(test_size=hp.val_size, seed=hp.split_seed)
                    train, val = parts["train"], parts["test"]
        if val is not None and hp.max_val_prompts:
            val = val.select(range(min(hp.max_val_prompts, len(val))))
        self.train_data, self.val_data = train, val

    def _checked(self, data: Dataset, split: str) -> Dataset:
        column = self.hparams.prompt_column
        if column not in data.column_names:
            raise ValueError(
                f"prompt_column {column!r} is not a column of dataset {self.hparams.dataset!r} ({split} split); "
                f"its columns are {data.column_names}"
            )
        if len(data) == 0:
            raise ValueError(f"dataset {self.hparams.dataset!r} has no rows in its {split!r} split")
        return data

    def collate(self, rows: list[dict[str, Any]]) -> PromptBatch:
        column, system = self.hparams.prompt_column, self.hparams.system_prompt
        prompts = [with_system_prompt(r[column], system) for r in rows]
        columns = {k: [r[k] for r in rows] for k in rows[0] if k != column}
        return PromptBatch(prompts=prompts, columns=columns)

    def train_dataloader(self) -> StatefulDataLoader:
        # Stateful: a checkpoint holds the position in the epoch and the shuffling generator, so a resumed
        # run continues with the very next batch instead of restarting the epoch.
        with warnings.catch_warnings():  # torchdata calls a deprecated torch API when built: not the user's concern
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            return StatefulDataLoader(
                self.train_data,
                batch_size=self.hparams.batch_size,
                shuffle=True,
                drop_last=len(self.train_data) >= self.hparams.batch_size,
                collate_fn=self.collate,
                num_workers=self.hparams.num_workers,
            )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_data is None:
            return []
        return DataLoader(
            self.val_data,
            batch_size=self.hparams.batch_size * 4,
            collate_fn=self.collate,
            num_workers=self.hparams.num_workers,
        )
