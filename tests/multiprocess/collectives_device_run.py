"""One rank of a 2-process GRPO run whose process group has a backend for one device type only (``BACKEND``,
``cpu:gloo`` or ``cuda:gloo``: the latter is what NCCL is, CUDA only, and lets two ranks share one GPU). Every
collective of the steps of the features that issue their own (the adaptive entropy bonus, gkd distillation, the
loss metrics over ranks) must hand the backend a tensor on the module's device; one on another device ends the step
with "No backend type associated with device type cpu". Writes OUT/rank<k>.json with the steps' entropy
coefficients and gkd agreements.

Run by tests/test_ranks_devices.py as two processes, ``collectives_device_run.py MODEL TEACHER DATA OUT BACKEND
ACCELERATOR``, with ``NODE_RANK`` 0 and 1, ``LOCAL_RANK=0``, ``WORLD_SIZE=2`` and a ``MASTER_PORT``: two "nodes" of
one device each, so both ranks may be on the one GPU a machine has.
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from quiet_trainer import quiet_trainer  # this script's folder is on the path

from lightning_grpo import GRPOModule, PromptDataModule


def length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


class Recorder(L.Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stats = outputs["record"].stats
        self.steps.append({"agreement": stats.distill.top_agreement, "entropy_coef": pl_module.entropy.coef})


def main(model_dir: str, teacher_dir: str, data_path: str, out_dir: str, backend: str, accelerator: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[length_reward],
        num_generations=4,
        sampling={"max_completion_length": 6},
        loss={"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_coef_delta": 0.01},
        distill={"teacher": teacher_dir, "objective": "gkd"},
    )
    recorder = Recorder()
    strategy = DDPStrategy(process_group_backend=backend)
    trainer = quiet_trainer(out_dir, 2, [recorder], strategy, accelerator=accelerator, devices=1, num_nodes=2)
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"rank{trainer.global_rank}.json").write_text(json.dumps({"steps": recorder.steps}))


if __name__ == "__main__":
    main(*sys.argv[1:])
