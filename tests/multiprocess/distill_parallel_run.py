"""A distillation run on 2 CPU processes for tests/distill/test_targets_parallel.py; each rank writes OUT/rank<k>.pt.

``python distill_parallel_run.py MODEL TEACHER DATA OUT MODE`` with MODE ``ddp`` or ``fsdp2``
(``ModelParallelStrategy(data_parallel_size=2)``: the policy and the teacher are both ``fully_shard``-ed).
Lightning's launcher starts rank 1 by re-running this script.
"""

import sys
from pathlib import Path

import lightning as L
import torch
from quiet_trainer import quiet_trainer  # this script's folder is on the path
from torch.distributed.tensor import DTensor

from lightning_grpo import GRPOModule, PromptDataModule


class Recorder(L.Callback):
    """Per step: the reverse KL to the teacher and the teacher's log-probs of the sampled tokens; whether the
    teacher's weights are sharded."""

    def __init__(self):
        self.steps, self.sharded = [], None

    def on_train_start(self, trainer, pl_module):
        self.sharded = all(isinstance(p, DTensor) for p in pl_module.policy.teacher.parameters())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        record = outputs["record"]
        self.steps.append({"reverse_kl": record.stats.distill.reverse_kl, "advantages": record.advantages.cpu()})


def main(model_dir: str, teacher_dir: str, data_path: str, out_dir: str, mode: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    module = GRPOModule(
        model=model_dir,
        reward_funcs=None,
        num_generations=4,
        sampling={"max_completion_length": 6},
        distill={"teacher": teacher_dir, "reward_weight": 0.0},
        optim={"max_grad_norm": None},
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
    )
    recorder = Recorder()
    trainer = quiet_trainer(out_dir, 3, [recorder], "fsdp2" if mode == "fsdp2" else "ddp")
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"steps": recorder.steps, "sharded": recorder.sharded}, out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
