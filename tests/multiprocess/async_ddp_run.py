"""A 2-process CPU (gloo) asynchronous GRPO run (one producer per rank); each rank writes what it saw to
OUT_DIR/rank<k>.json and rank 0 a checkpoint with every rank's queue. A 4th argument ``producer`` scores in the
producers (``score_in_producer``); a 5th, ``fsdp2``, shards the policy (``ModelParallelStrategy``) instead of DDP,
and ``fsdp2+lora`` with a LoRA adapter. A 6th, STOP > 0, saves OUT_DIR/stop.ckpt after update STOP and stops (as a
preemption would); a 7th resumes from that checkpoint.

Run by tests/engines/asynchronous/test_async_rollouts.py as a subprocess: Lightning's DDP launcher starts rank 1 by
re-running this script.
"""

import json
import sys

import lightning as L
import torch
from parallel_run import StopAt  # this script's folder is on the path
from quiet_trainer import quiet_trainer  # this script's folder is on the path
from torch.distributed.tensor import DTensor

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import AsyncRollouts


def length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


class Probe(L.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if outputs:  # {} while the pipeline fills
            rollout = outputs["record"].rollout
            self.seen.append(
                {
                    "completions": rollout.completions,
                    "staleness": outputs["record"].stats.metrics()["async/staleness/max"],
                    "producer_scored": "async/scoring_s" in rollout.metrics,
                    "rewards": outputs["record"].scores.total.tolist(),
                    "sampler_logps": None if rollout.sampling_logps is None else rollout.sampling_logps.sum().item(),
                }
            )


def main(
    model_dir: str,
    data_path: str,
    out_dir: str,
    scoring: str = "trainer",
    strategy: str = "ddp",
    stop: str = "0",
    ckpt: str = "",
) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    lora = {"peft_config": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}} if "lora" in strategy else {}
    module = GRPOModule(
        model=model_dir,
        policy=lora,
        reward_funcs=[length_reward],
        num_generations=4,
        sampling={"max_completion_length": 6},
        optim={"learning_rate": 1e-2},
        rollout_engine=AsyncRollouts(max_staleness=1, score_in_producer=scoring == "producer"),
    )
    probe = Probe()
    stops = [StopAt(int(stop), f"{out_dir}/stop.ckpt")] if int(stop) else []
    trainer = quiet_trainer(out_dir, 3, [probe, *stops], "fsdp2" if strategy.startswith("fsdp2") else "ddp")
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None), ckpt_path=ckpt or None)
    if not int(stop):
        trainer.save_checkpoint(f"{out_dir}/last.ckpt")  # every rank's queue, gathered to rank 0
    whole = [p.full_tensor() if isinstance(p, DTensor) else p for p in module.policy.model.parameters()]
    flat = torch.cat([p.detach().flatten() for p in whole if p.requires_grad])
    with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
        json.dump({"global_step": trainer.global_step, "param_head": flat[:64].tolist(), "seen": probe.seen}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
