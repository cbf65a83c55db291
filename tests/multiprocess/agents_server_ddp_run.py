"""A 2-process DDP (gloo) GRPO run with the agent endpoint (``OpenAIAgent``) sampling from a vLLM server
(``VLLMServer``, full weights through the ``disk`` transfer), where rank 1's agents never ask: only rank 0's sampler
is called. The first weight push is a collective of both ranks (they agree on the live servers, rank 0 pushes, both
wait at a bounded barrier), so it must not wait for a rank's first request.

Run by tests/engines/agents/test_engine_ddp.py as ``agents_server_ddp_run.py MODEL_DIR DATA OUT_DIR URL``; each
rank writes its steps, requests per episode and first parameters to OUT_DIR/rank<k>.json. Lightning's launcher
starts rank 1 by re-running this script.
"""

import json
import sys

import lightning as L
import torch
import torch.distributed as dist
from quiet_trainer import quiet_trainer  # this script's folder is on the path
from tools_ddp_run import param_head  # this script's folder is on the path

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import OpenAIAgent, VLLMServer, agent_reward


def rank_zero_agent(client, row: dict) -> float:
    """Rank 0's agents ask once; rank 1's end without a request (an agent that found nothing to ask)."""
    if dist.get_rank() != 0:
        return 0.0
    reply = client.chat.completions.create(model="policy", messages=list(row["prompt"]))
    return len(reply.choices[0].message.content or "") / 4


class Probe(L.Callback):
    def __init__(self):
        self.requests = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.requests.append(outputs["record"].stats.extra["agents/requests"])


def main(model_dir: str, data_path: str, out_dir: str, url: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    sampler = VLLMServer(base_url=url, weight_transfer="disk", connection_timeout=60, sync_timeout=120)
    engine = OpenAIAgent(rank_zero_agent, sampler=sampler, timeout=120, on_error="raise", port=0)
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[agent_reward],
        num_generations=2,
        rollout_engine=engine,
        sampling={"max_completion_length": 8},
        update={"sampling_correction": "token_truncate"},
        optim={"learning_rate": 1e-3},
    )
    probe = Probe()
    trainer = quiet_trainer(out_dir, 2, [probe])
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
        json.dump({"global_step": trainer.global_step, "requests": probe.requests, "param_head": param_head(module)}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
