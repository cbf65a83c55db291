"""A 2-process CPU (gloo) GRPO run with the agent endpoint (``OpenAIAgent``), where rank 0's agents ask 3 times an
episode and rank 1's once.

STRATEGY is ``ddp`` or ``fsdp2`` (``ModelParallelStrategy``: FSDP2 ``fully_shard``, whose forwards are collectives
of their own); SAMPLER is ``HFGenerate`` or ``LeanDecode``. Generation is synced across ranks (as under sharding), so
rank 1 must step dummy sampler calls while rank 0's agents play on; each rank writes its sampler calls' budgets,
its requests, first parameters and endpoint port (the engine's fixed PORT, + local rank) to OUT_DIR/rank<k>.json.
Run by tests/engines/agents/test_engine_ddp.py as ``agents_ddp_run.py MODEL_DIR DATA OUT_DIR STRATEGY SAMPLER PORT``;
Lightning's launcher starts rank 1 by re-running this script.
"""

import json
import sys

import lightning as L
import torch
import torch.distributed as dist
from tools_ddp_run import param_head, synced_fit  # this script's folder is on the path

from lightning_grpo import GRPOModule
from lightning_grpo.engines import HFGenerate, LeanDecode, OpenAIAgent, agent_reward

SAMPLERS = {"HFGenerate": HFGenerate, "LeanDecode": LeanDecode}


def rank_agent(client, row: dict) -> float:
    """Rank 0's agents ask three times (a tool reply after each), rank 1's once; the reward is the last reply's
    length."""
    messages = list(row["prompt"])
    for turn in range(3 if dist.get_rank() == 0 else 1):
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": f"r{turn}"}]
    return len(reply.choices[0].message.content or "") / 4


def counting(sampler: type) -> type:
    class Counting(sampler):
        """Records each call's budgets (a dummy call's: [1], one row of one token)."""

        budgets: list[list[int]] = []

        def complete(self, policy, contexts, budgets, sampling, greedy):
            self.budgets = [*self.budgets, list(budgets)]
            return super().complete(policy, contexts, budgets, sampling, greedy)

    return Counting


class Probe(L.Callback):
    def __init__(self):
        self.requests = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.requests.append(outputs["record"].stats.extra["agents/requests"])


def main(model_dir: str, data_path: str, out_dir: str, strategy: str, sampler: str, port: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    sampler = counting(SAMPLERS[sampler])()
    engine = OpenAIAgent(rank_agent, sampler=sampler, timeout=300, on_error="raise", port=int(port))
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[agent_reward],
        num_generations=2,
        rollout_engine=engine,
        sampling={"max_completion_length": 48},
        optim={"learning_rate": 1e-3},
    )
    probe = Probe()
    trainer = synced_fit(module, data_path, out_dir, strategy, probe)
    with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(
            {
                "global_step": trainer.global_step,
                "budgets": engine.sampler.budgets,
                "requests": probe.requests,
                "param_head": param_head(module),
                "port": engine.endpoint.port,
            },
            f,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
