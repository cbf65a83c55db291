"""A 2-process DDP GRPO run whose completions come from a vLLM server (tests/engines/vllm/test_server.py starts the fake
one); each rank writes what it saw to OUT/rank<k>.pt.

``python vllm_server_run.py MODEL DATA OUT URL[,URL] GROUP_PORT [KILL_URL [RESTARTS]]``, with
``tests/engines/vllm/vllm_stand_in`` on ``PYTHONPATH`` (TRL's client imports vLLM); with ``KILL_URL`` rank 0 ends that
server (``POST /exit``) after step 1. ``RESTARTS``, comma-separated ``serve`` or ``plain`` (started without a
weight-transfer config): rank 0 starts a fake server on its port again at once, then after each next step ends it and
starts the next one listed; ``unnoticed``: it ends the server and starts another in step 2 instead, after every
rank's requests (at its optimiser step), so that only the sync can notice; ``stall``: it ends nothing but has the
server hang the run's first weight update, before step 1's requests (``POST /stall``), with ``sync_timeout`` 5 s;
``gone``: it ends the server as step 2 starts, after the sync (a ``FaultCheckpoint`` in OUT/ckpt; each rank's report
is then the ``NoServerLeft`` it raised).
At the end it saves the last one's ``/stats`` and weights (OUT/restarted.json, .pt) and ends it. The run lasts 3
steps, or one more than the restarts.
Lightning's launcher starts rank 1 by re-running this script.
"""

import atexit
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
import requests
import torch
from quiet_trainer import quiet_trainer  # this script's folder is on the path

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks import FaultCheckpoint
from lightning_grpo.engines import VLLMServer
from lightning_grpo.engines.vllm.control import NoServerLeft

FAKE_SERVER = Path(__file__).parents[1] / "engines" / "vllm" / "vllm_fake_server.py"


class CPUVLLMServer(VLLMServer):
    """The engine with the one thing CPU cannot do replaced: TRL's ``init_communicator`` refuses a non-CUDA device
    (vLLM's transport is NCCL), so its steps are taken here, joining the stand-in's TCP stream instead. The
    weights then go through the client's own ``weight_update`` / ``update_named_params`` as on GPUs."""

    def machine_problems(self) -> list[str]:
        return [p for p in super().machine_problems() if "CUDA" not in p]

    def open_weight_channel(self, client, device: torch.device) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        if client.get_server_info()["weight_transfer_config"] is None:  # TRL's check, its words
            raise RuntimeError(f"The vLLM server at {client.base_url} has no weight-transfer engine")
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
    def __init__(self):
        self.steps, self.batches = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(list(batch.prompts))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        record = outputs["record"]
        self.steps.append(
            {"rollout": record.rollout, "metrics": record.stats.metrics(), "rewards": record.scores.total}
        )


class Outage(L.Callback):
    """Rank 0 ends the server at ``url`` after step 1 and starts ``restarts[0]`` on its port at once; after step k
    ends it and starts ``restarts[k - 1]`` (``["unnoticed"]``: one swap, in step 2 before its update). ``save``
    keeps the last one's stats and weights, then ends it."""

    def __init__(self, url: str, restarts: list[str], model_dir: str):
        self.url, self.restarts, self.model_dir, self.proc = url, restarts, model_dir, None
        self.unnoticed, self.stall, self.gone = restarts == ["unnoticed"], restarts == ["stall"], restarts == ["gone"]
        atexit.register(self.end)  # a failed run leaves no server behind

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.stall and trainer.global_rank == 0 and trainer.global_step == 0:
            requests.post(f"{self.url}/stall", timeout=10)  # the run's first push, before step 1's requests, hangs
        if self.gone and trainer.global_rank == 0 and trainer.global_step == 1:
            self.swap(None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.stall or self.gone:
            return
        if not self.unnoticed and trainer.global_rank == 0 and 1 <= step <= max(1, len(self.restarts)):
            self.swap(self.restarts[step - 1] if step <= len(self.restarts) else None)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.unnoticed and trainer.global_rank == 0 and trainer.global_step == 1 and self.proc is None:
            self.swap("serve")  # step 2's requests all served: the ranks' gather of rewards came before the update

    def swap(self, kind: str | None) -> None:
        """The server ended (the test's by ``POST /exit``), another of ``kind`` started on its port."""
        if self.proc is None:
            requests.post(f"{self.url}/exit", timeout=10)
            while self.answers():  # it ends right after its answer: the next /health must be the new one's
                time.sleep(0.05)
        self.end()
        if kind is not None:
            self.start(kind)

    def start(self, kind: str) -> None:
        flags = {"serve": [], "plain": ["--no-weight-transfer"]}[kind]
        command = [sys.executable, str(FAKE_SERVER), self.model_dir, str(urlparse(self.url).port), *flags]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        for _ in range(1200):
            if self.answers():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the fake server on {self.url} did not start again")

    def answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def save(self, out_dir: Path) -> None:
        if self.proc is not None:
            (out_dir / "restarted.json").write_text(json.dumps(requests.get(f"{self.url}/stats", timeout=10).json()))
            requests.post(f"{self.url}/save", json={"path": str(out_dir / "restarted.pt")}, timeout=30)
            self.end()


def main(
    model_dir: str, data_path: str, out_dir: str, url: str, group_port: str, kill_url: str = "", restarts: str = ""
) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    engine = CPUVLLMServer(
        base_url=url,
        connection_timeout=60,
        group_port=int(group_port),
        weight_transfer="nccl",
        request_timeout=60,
        sync_timeout=5 if restarts == "stall" else 600,
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
    recorder, kinds = Recorder(), [kind for kind in restarts.split(",") if kind]
    outages = [Outage(kill_url, kinds, model_dir)] if kill_url else []
    faults = [FaultCheckpoint(str(Path(out_dir) / "ckpt"))] if kinds == ["gone"] else []
    trainer = quiet_trainer(out_dir, max(3, len(kinds) + 2), [recorder, *outages, *faults])
    try:
        trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    except NoServerLeft as err:
        report = {"error": str(err), "every_rank": err.every_rank, "checkpoint": getattr(err, "checkpoint_path", None)}
        torch.save({**report, "steps": len(recorder.steps)}, Path(out_dir) / f"rank{trainer.global_rank}.pt")
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    if outages and trainer.global_rank == 0:
        outages[0].save(Path(out_dir))
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
