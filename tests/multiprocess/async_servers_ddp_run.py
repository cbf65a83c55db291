"""A 2-process DDP (gloo) asynchronous GRPO run (``AsyncRollouts``, one step off) whose producers sample from two
vLLM servers (``VLLMServer``, full weights through the ``disk`` transfer): each rank's producer process holds its own
copy of the engine and sends that rank's prompts, while the trainers' engines push every update (a collective of
both ranks). With ``KILL`` = ``kill``, rank 0 ends the second server (``POST /exit``) after step 1, and both ranks
wait for it before going on, so that both ranks' next batch meets a dead server.

Run by tests/engines/asynchronous/test_async_rollouts_servers.py as
``async_servers_ddp_run.py MODEL_DIR DATA OUT_DIR URL,URL [KILL]``; each rank writes its trained steps' metrics and
rewards, its producer's process id, the weights folder and its final weights to OUT_DIR/rank<k>.pt. Lightning's
launcher starts rank 1 by re-running this script.
"""

import os
import sys
from pathlib import Path

import lightning as L
import requests
import torch
from quiet_trainer import quiet_trainer  # this script's folder is on the path

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import AsyncRollouts, VLLMServer


def length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


class Probe(L.Callback):
    """Each trained step's metrics (the rollout's, from the producer, and the step's) and rewards; ends
    ``kill_url``'s server after step 1 (rank 0), every rank waiting for it."""

    def __init__(self, kill_url: str | None) -> None:
        self.steps, self.kill_url = [], kill_url
        self.weights_dir = None  # the "disk" transfer's folder (rank 0's; a temporary one, removed by the fit's end)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not outputs:  # the pipeline filling: no update
            return
        record = outputs["record"]
        producer = pl_module.engine.process.pid  # this rank's producer process
        self.weights_dir = pl_module.engine.engine.weights_dir
        rewards = record.scores.total.tolist()
        self.steps.append({"metrics": record.stats.metrics(), "rewards": rewards, "producer": producer})
        if self.kill_url and trainer.global_step == 1:
            if trainer.global_rank == 0:
                requests.post(f"{self.kill_url}/exit", timeout=10)
            trainer.strategy.barrier()  # rank 1's next batch is submitted once the server is gone


def main(model_dir: str, data_path: str, out_dir: str, urls: str, kill: str = "") -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    engine = VLLMServer(
        urls.split(","), weight_transfer="disk", connection_timeout=60, request_timeout=60, sync_timeout=120
    )
    rollouts = AsyncRollouts(engine=engine, max_staleness=1)
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[length_reward],
        num_generations=4,
        rollout_engine=rollouts,
        sampling={"max_completion_length": 6, "temperature": 0.9},
        optim={"learning_rate": 1e-2},
    )
    probe = Probe(urls.split(",")[1] if kill == "kill" else None)
    trainer = quiet_trainer(out_dir, 3, [probe])
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    state = {k: v.detach().clone() for k, v in module.policy.model.state_dict().items()}
    report = {"global_step": trainer.global_step, "steps": probe.steps, "state": state}
    report |= {"pid": os.getpid(), "live": sorted(engine.pool.live), "weights_dir": probe.weights_dir}
    torch.save(report, Path(out_dir) / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
