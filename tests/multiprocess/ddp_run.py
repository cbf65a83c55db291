"""A 2-process CPU (gloo) GRPO run; each rank writes what it saw to OUT_DIR/rank<k>.json.

Run by tests/test_ranks_ddp.py as a subprocess: Lightning's DDP launcher starts rank 1 by re-running this script.
"""

import atexit
import json
import sys

import lightning as L
import torch
import torch.distributed as dist
from quiet_trainer import quiet_trainer  # this script's folder is on the path

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks.alerts import Alert, Signal


def length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


class Probe(L.Callback):
    """Records each rank's completions and the loss normaliser's global token count."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        record = outputs["record"]
        self.seen.append(
            {
                "completions": record.rollout.completions,
                "local_tokens": int(record.rollout.completion_mask.sum()),
                "global_tokens": record.stats.update.loss_tokens,
                "reward": record.stats.rewards.mean,
            }
        )


class CountBarriers(L.Callback):
    """Counts the barriers within each training step, up to the callbacks' batch end (each barrier, under NCCL, a
    wait of the host for the device; the callbacks' own stop decisions are theirs)."""

    def __init__(self):
        self.counts, self.inside, self.barrier = [], False, dist.barrier

    def on_train_start(self, trainer, pl_module):
        def counted(*args, **kwargs):
            if self.inside:
                self.counts[-1] += 1
            return self.barrier(*args, **kwargs)

        dist.barrier = counted  # Lightning's collectives call it through the module

    def on_train_batch_start(self, trainer, *args):
        self.counts.append(0)
        self.inside = True

    def on_train_batch_end(self, trainer, *args):
        self.inside = False


class RankZeroAlert(Alert):
    """A signal only rank 0 sees: the stop decision must still reach rank 1."""

    def signals(self, trainer, record):
        return [Signal("rank0_only", 1.0, 0.0, ">", "nothing")] if trainer.global_rank == 0 else []


def record_group_at_exit(trainer: L.Trainer, out_dir: str) -> None:
    """Whether the process group is still alive once the interpreter exits (it must not be: a gloo group left to
    finalisation can abort the process after a fit that succeeded)."""
    with open(f"{out_dir}/exit{trainer.global_rank}.json", "w") as f:
        json.dump({"group_alive": dist.is_initialized()}, f)


def main(model_dir: str, data_path: str, out_dir: str, scale_rewards: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[length_reward],
        num_generations=4,
        update={"micro_batch_size": 5},
        sampling={"max_completion_length": 6},
        optim={"learning_rate": 1e-2},
        advantages={"scale_rewards": scale_rewards},
    )
    probe, alert, barriers = Probe(), RankZeroAlert(patience=2, action="stop"), CountBarriers()
    trainer = quiet_trainer(out_dir, 6, [barriers, probe, alert])  # first: its batch end runs before the others
    # registered before the fit, so it runs after the package's own exit handler (atexit runs last-in first-out)
    atexit.register(record_group_at_exit, trainer, out_dir)
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    flat = torch.cat([p.detach().flatten() for p in module.policy.model.parameters()])
    with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(
            {
                "global_step": trainer.global_step,
                "alert_firings": len(alert.firings),
                "param_sum": flat.sum().item(),
                "param_head": flat[:64].tolist(),
                "seen": probe.seen,
                "barriers": barriers.counts,
            },
            f,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
