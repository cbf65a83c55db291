"""The progress bar counts optimiser steps, as max_steps does; the data module's shuffle_dataset (TRL's name)."""

from __future__ import annotations

import lightning as L
import pytest
from helpers import make_module

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks.progress import StepProgressBar
from lightning_grpo.cli.help import GRPOArgumentParser
from lightning_grpo.cli.main import GRPOCLI


class Seen(L.Callback):
    def __init__(self, bar):
        self.bar, self.seen = bar, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append((self.bar.train_progress_bar.total, self.bar.train_progress_bar.desc))


@pytest.mark.parametrize(("num_iterations", "batches"), [(1, 4), (2, 2)])
def test_the_bar_ends_full_and_says_the_step(tiny_model_dir, arith_jsonl, tmp_path, num_iterations, batches):
    bar = StepProgressBar()
    seen = Seen(bar)
    trainer = L.Trainer(
        max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False, limit_val_batches=0,
        enable_model_summary=False, callbacks=[bar, seen], default_root_dir=tmp_path,
    )  # fmt: skip
    data = PromptDataModule(arith_jsonl, batch_size=2, val_split=None)  # 8 batches an epoch
    trainer.fit(make_module(tiny_model_dir, update={"num_iterations": num_iterations}), data)
    assert len(seen.seen) == batches and seen.seen[-1][0] == batches  # Lightning's own bar: total 4 for 2 batches
    assert seen.seen[-1][1].startswith("Epoch 0 · step 4/4")


def test_the_cli_uses_the_step_bar_unless_the_bar_is_off(tiny_model_dir):
    def trainer(*args):
        rewards = "[lightning_grpo.rewards.exact_match_reward]"
        settings = ["--model.model", tiny_model_dir, "--model.reward_funcs", rewards, "--data.dataset", "x",
                    "--trainer.logger", "false", *args]  # fmt: skip
        cli = GRPOCLI(GRPOModule, PromptDataModule, args=settings, run=False, parser_class=GRPOArgumentParser,
                      auto_configure_optimizers=False)  # fmt: skip
        return cli.trainer

    assert isinstance(trainer().progress_bar_callback, StepProgressBar)
    assert trainer("--trainer.enable_progress_bar", "false").progress_bar_callback is None


@pytest.mark.parametrize("shuffle", [True, False])
def test_shuffle_dataset(arith_jsonl, shuffle):
    data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None, shuffle_dataset=shuffle)
    data.setup("fit")
    L.seed_everything(0)
    first = next(iter(data.train_dataloader())).prompts
    assert (first == data.train_data["prompt"][:4]) == (not shuffle)
