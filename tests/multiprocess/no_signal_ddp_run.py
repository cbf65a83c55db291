"""A 2-process CPU (gloo) run whose rank 1 alone has groups with signal for its first 3 generation batches, then no
rank has any; each rank writes what NoSignalAlert did to OUT_DIR/rank<k>.json.

Run by tests/callbacks/test_no_signal.py as ``no_signal_ddp_run.py MODEL_DIR DATA OUT_DIR FILTER`` (FILTER: 1 for
``advantages.filter_groups``, no limit on generation batches; 0 without).
"""

import json
import sys

import lightning as L
import torch
import torch.distributed as dist
from quiet_trainer import quiet_trainer  # this script's folder is on the path

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks import NoSignalAlert

CALLS = [0]  # generation batches this process scored


def late_flat_reward(completions, **kwargs):
    """Rank 1: the completions' lengths for 3 batches (signal), then 0; rank 0: always 0 (none)."""
    CALLS[0] += 1
    varies = dist.get_rank() == 1 and CALLS[0] <= 3
    return [len(c) / 8 if varies else 0.0 for c in completions]


def main(model_dir: str, data_path: str, out_dir: str, filtering: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[late_flat_reward],
        num_generations=4,
        sampling={"max_completion_length": 6},
        advantages={"filter_groups": filtering == "1", "max_num_gen_batches": 0},
    )
    alert = NoSignalAlert(patience=2)  # stop
    trainer = quiet_trainer(out_dir, 20, [alert], max_epochs=3)  # the epochs bound a filter that never updates
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(
            {
                "global_step": trainer.global_step,
                "batches": trainer.fit_loop.epoch_loop.batch_progress.total.completed,
                "firings": [(f.step, f.message) for f in alert.firings],
            },
            f,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
