"""A 2-process CPU (gloo) GRPO run with the tool engine, where rank 0's episodes take 4 turns and rank 1's take 1.

STRATEGY is ``ddp`` or ``fsdp2`` (``ModelParallelStrategy``: FSDP2 ``fully_shard``, whose generate calls are
collectives of their own).

Generation is synced across ranks (as under sharding), so rank 1 must step dummy generate calls while rank 0
plays on; each rank writes its turns and generate-call counts to OUT_DIR/rank<k>.json. Run by
tests/engines/multiturn/test_tool_calling_ddp.py as ``tools_ddp_run.py MODEL_DIR DATA OUT_DIR STRATEGY``;
Lightning's launcher starts rank 1 by re-running this script.
"""

import json
import sys

import lightning as L
import torch
import torch.distributed as dist
from quiet_trainer import quiet_trainer  # this script's folder is on the path
from torch.distributed.tensor import DTensor

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import ToolCall, ToolCalling


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


class RankParser:
    """Rank 0's every turn calls a tool (cut at 3 rounds: 4 turns); rank 1's never does (1 turn)."""

    def parse(self, text):
        return text, [ToolCall("add", {"a": 1, "b": 2})] if dist.get_rank() == 0 else []


class CountingToolCalling(ToolCalling):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.generate_calls = 0

    def _generate_turn(self, *args, **kw):
        self.generate_calls += 1
        return super()._generate_turn(*args, **kw)


def last_length_reward(completions, **kwargs):
    return [len(c[-1]["content"]) / 4 for c in completions]


class SyncedGeneration(L.Callback):
    """Every generate call is a collective, as under FSDP: what makes unequal turns deadlock-prone."""

    def on_fit_start(self, trainer, pl_module):
        pl_module.policy.synced_generation = True


class Probe(L.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append({"turns_max": outputs["record"].stats.extra["turns/max"]})


def main(model_dir: str, data_path: str, out_dir: str, strategy: str = "ddp") -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    engine = CountingToolCalling(tools=[add], parser=RankParser(), max_tool_calling_iterations=3)
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[last_length_reward],
        num_generations=2,
        rollout_engine=engine,
        sampling={"max_completion_length": 16},
        optim={"learning_rate": 1e-3},
    )
    probe = Probe()
    trainer = synced_fit(module, data_path, out_dir, strategy, probe)
    with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(
            {
                "global_step": trainer.global_step,
                "generate_calls": engine.generate_calls,
                "param_head": param_head(module),
                "seen": probe.seen,
            },
            f,
        )


def synced_fit(module: GRPOModule, data_path: str, out_dir: str, strategy: str, probe: L.Callback) -> L.Trainer:
    """2 steps on 2 CPU processes (``ddp`` or ``fsdp2``), 2 prompts a rank, generation synced across the ranks."""
    trainer = quiet_trainer(out_dir, 2, [SyncedGeneration(), probe], strategy)
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    return trainer


def param_head(module: GRPOModule) -> list[float]:
    """The policy's first 64 parameter values, whole under FSDP2: equal on every rank after synced updates."""
    params = [p.full_tensor() if isinstance(p, DTensor) else p for p in module.policy.model.parameters()]
    return torch.cat([p.detach().flatten() for p in params])[:64].tolist()


if __name__ == "__main__":
    main(*sys.argv[1:])
