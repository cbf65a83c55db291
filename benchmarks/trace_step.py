"""Follow one GRPO training step (the tiny model, 4 prompts x 4, beta 0.04) call by call: the package files it
visits, how often control comes back to module.py, and the calls module.py makes into other files.

    python benchmarks/trace_step.py          # this checkout; PYTHONPATH=<other checkout> to compare one
"""

import os
import sys

import lightning as L
import torch

from lightning_grpo import GRPOModule, OptimConfig, PromptDataModule, SamplingConfig
from lightning_grpo.rewards import exact_match_reward

torch.set_num_threads(1)
pkg = os.path.dirname(__import__("lightning_grpo").__file__)
seq = []
direct = []


class Trace(L.Callback):
    def on_train_batch_start(self, *a):
        if a[-1] == 1:
            sys.setprofile(prof)

    def on_train_batch_end(self, *a):
        sys.setprofile(None)


def prof(frame, event, arg):
    if event != "call":
        return
    f = frame.f_code.co_filename
    back = frame.f_back.f_code.co_filename if frame.f_back else ""
    if back.endswith("lightning_grpo/module.py") and f.startswith(pkg) and not f.endswith("module.py"):
        direct.append(os.path.relpath(f, pkg))
    if f.startswith(pkg) and "/callbacks/" not in f:
        rel = os.path.relpath(f, pkg)
        if not seq or seq[-1] != rel:
            seq.append(rel)


m = GRPOModule(
    reward_funcs=[exact_match_reward],
    num_generations=4,
    sampling=SamplingConfig(max_completion_length=3),
    optim=OptimConfig(learning_rate=1e-3),
    loss={"beta": 0.04},
)
d = PromptDataModule("lightning-grpo/tiny-max", batch_size=4)
L.Trainer(
    max_steps=2,
    accelerator="cpu",
    limit_val_batches=0,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    callbacks=[Trace()],
).fit(m, d)
print("stops (file changes):", len(seq))
print("files:", len(set(seq)), sorted(set(seq)))
print("returns to module.py:", sum(1 for s in seq[1:] if s == "module.py"))
print("calls out of module.py:", len(direct), "into", len(set(direct)), "files:", sorted(set(direct)))
