"""A 2-process DDP GRPO run whose completions come from a vLLM server (tests/engines/vllm/test_server.py starts the fake
one); each rank writes what it saw to OUT/rank<k>.pt.

``python vllm_server_run.py MODEL DATA OUT URL[,URL] GROUP_PORT [KILL_URL]``, with ``tests/engines/vllm/vllm_stand_in``
on ``PYTHONPATH`` (TRL's client imports vLLM); with ``KILL_URL`` rank 0 ends that server (``POST /exit``) after step 1.
Lightning's launcher starts rank 1 by re-running this script.
"""

import sys
from pathlib import Path

import lightning as L
import torch

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import VLLMServer

STEPS = 3


class CPUVLLMServer(VLLMServer):
    """The engine with the one thing CPU cannot do replaced: TRL's ``init_communicator`` refuses a non-CUDA device
    (vLLM's transport is NCCL), so its steps are taken here, joining the stand-in's TCP stream instead. The
    weights then go through the client's own ``weight_update`` / ``update_named_params`` as on GPUs."""

    def machine_problems(self) -> list[str]:
        return [p for p in super().machine_problems() if "CUDA" not in p]

    def open_weight_channel(self, client, device: torch.device) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        assert client.get_server_info()["weight_transfer_config"] is not None
        info = {"master_address": "127.0.0.1", "master_port": client.group_port, "rank_offset": 1, "packed": True}
        info["world_size"] = client.get_world_size() + 1
        with ThreadPoolExecutor(max_workers=1) as pool:
            url = f"{client.base_url}/init_weight_transfer_engine"
            answer = pool.submit(client._post, url, json={"init_info": info})
            client.communicator = trainer_init(info)
            answer.result()


def length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


class Recorder(L.Callback):
    def __init__(self, kill_url: str | None = None):
        self.steps, self.batches, self.kill_url = [], [], kill_url

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(list(batch.prompts))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        record = outputs["record"]
        self.steps.append(
            {"rollout": record.rollout, "metrics": record.stats.metrics(), "rewards": record.scores.total}
        )
        if self.kill_url and trainer.global_step == 1 and trainer.global_rank == 0:
            import requests

            requests.post(f"{self.kill_url}/exit", timeout=10)


def main(model_dir: str, data_path: str, out_dir: str, url: str, group_port: str, kill_url: str = "") -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    engine = CPUVLLMServer(
        base_url=url, connection_timeout=60, group_port=int(group_port), weight_transfer="nccl", request_timeout=60
    )
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[length_reward],
        num_generations=4,
        rollout_engine=engine,
        update={"sampling_correction": "token_truncate"},
        sampling={"max_completion_length": 6, "temperature": 0.9, "generation_kwargs": {"skip_special_tokens": False}},
        optim={"learning_rate": 1e-2},
    )
    recorder = Recorder(kill_url or None)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=out_dir,
        callbacks=[recorder],
    )
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in module.policy.model.state_dict().items()}
    torch.save(
        {
            "steps": recorder.steps,
            "batches": recorder.batches,
            "state": state,
            "global_step": trainer.global_step,
            "live": sorted(engine.pool.live),
        },  # fmt: skip
        Path(out_dir) / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
