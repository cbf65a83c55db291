"""One GRPO run as tests/model/test_sharding.py needs it; each rank writes what it saw to OUT/rank<k>.pt.

``python parallel_run.py MODEL DATA OUT MODE`` with MODE:
- ``ddp``: 2 processes, Lightning's DDP; each rank also saves its rollouts, to be replayed.
- ``fsdp2``: 2 processes, ``ModelParallelStrategy(data_parallel_size=2)``: FSDP2 ``fully_shard``.
- ``fsdp1``: 2 GPUs, Lightning's ``FSDPStrategy`` wrapping each decoder layer (FSDP1 refuses CPU).
- ``replay``: 1 process, batch 2x, whose generation returns the two DDP ranks' rollouts of that step and the
  prompt batches they answer (their columns score them), concatenated in rank order: the same global batch as the
  DDP run, through a single process.
- ``nodes``: DDP as 2 nodes x 1 process (``trainer.num_nodes=2``), started by 2 ``torchrun --nnodes 2`` calls.
- ``fsdp2meta``: FSDP2 with the module built under ``trainer.init_module(empty_init=True)``: on the meta device,
  each rank then reads only its own shard of the weights from MODEL's files.
- ``ddp+lora``, ``fsdp2+lora``, ``fsdp2meta+lora``: the same with a LoRA adapter (``LORA``): only the adapter
  trains, the reference is the adapter-off policy; each rank also exports the merged model to OUT/hf (rank 0 writes).
- ``+prefix`` (``fsdp2+prefix``, ``fsdp2+lora+prefix`` ...): with ``share_prompt_prefix``: the log-prob forward
  encodes each group's prompt once.
- ``+match`` (``ddp+match``, ``replay+match``): rewarded by ``exact_match_reward`` against the data's ``answer``
  instead of the completion's length (the colour task's one-letter answers all have one length).

``... MODE STEPS STOP [CKPT]`` (resume runs): AdamW, so that there is optimiser state to checkpoint; a run of
STEPS steps, resumed from CKPT when given, stopped after step STOP (0: not stopped) with a checkpoint at
OUT/last.ckpt (under FSDP2 a distributed checkpoint: a directory with each rank's shard).

Lightning's launcher starts rank 1 by re-running this script.
"""

import contextlib
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from quiet_trainer import quiet_trainer  # this script's folder is on the path
from torch.distributed.tensor import DTensor
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import HFGenerate
from lightning_grpo.engines.base import Sampled
from lightning_grpo.rewards import exact_match_reward
from lightning_grpo.types import PromptBatch

STEPS, PROMPTS_PER_RANK = 3, 2
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


def length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


class Recorder(L.Callback):
    """Per step: the rollout, the logged metrics, and the gradients the optimiser is about to apply."""

    def __init__(self):
        self.steps = []
        self.grads = []
        self.start = None

    def on_train_start(self, trainer, pl_module):
        self.start = torch.cat([full(p).flatten().cpu() for p in pl_module.policy.model.parameters()])

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [full(p.grad).flatten().cpu() for p in pl_module.policy.model.parameters() if p.grad is not None]
        self.grads.append(torch.cat(grads))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        record = outputs["record"]
        self.steps.append({"rollout": record.rollout, "batch": batch, "metrics": record.stats.metrics()})


class StopAt(L.Callback):
    """Saves OUT/last.ckpt after optimiser step ``step`` and stops, as a preemption would: mid-fit (the data
    loader's position is saved too; after ``fit`` it is not) and with the schedule of the whole run."""

    def __init__(self, step: int, path: Path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


class ReplayEngine(HFGenerate):
    """Training rollouts are the ones the 2 DDP ranks sampled at the same step, concatenated in rank order;
    greedy (validation) generation is HFGenerate's."""

    def __init__(self, ddp_dir: str):
        super().__init__()
        self.recorded = [torch.load(Path(ddp_dir) / f"rank{r}.pt", weights_only=False)["steps"] for r in (0, 1)]
        self.step = 0

    def rollout(self, policy, batch, num_generations, sampling):
        (first, a), (second, b) = ((steps[self.step]["rollout"], steps[self.step]["batch"]) for steps in self.recorded)
        self.step += 1
        batch = PromptBatch(a.prompts + b.prompts, {k: a.columns[k] + b.columns[k] for k in a.columns})  # scored on
        return Sampled(first.cat(second, policy.tokenizer.pad_token_id), batch)  # each rank trimmed its own padding


def main(
    model_dir: str, data_path: str, out_dir: str, mode: str, steps: str = "", stop: str = "0", ckpt: str = ""
) -> None:
    torch.set_num_threads(1)
    mode, *options = mode.split("+")
    lora = "lora" in options
    L.seed_everything(0)
    settings = dict(
        model=model_dir,
        reward_funcs=[exact_match_reward if "match" in options else length_reward],
        num_generations=4,
        sampling={"max_completion_length": 6},
        loss={"beta": 0.1, "loss_type": "dapo"},  # dapo: normalised by the tokens of all ranks, needs a global count
        # micro-batches split differently per rank and in one process: the same update
        update={"micro_batch_tokens": 40} if "tokens" in options else {"micro_batch_size": 5},
        optim={"max_grad_norm": None},  # compare raw gradients
        # SGD: parameters move linearly with gradients; resume runs: AdamW, whose state must be checkpointed
        optimizer=(lambda p: torch.optim.AdamW(p, lr=1e-2)) if steps else (lambda p: torch.optim.SGD(p, lr=0.5)),
        policy={
            "peft_config": LORA if lora else None,
            "share_prompt_prefix": "prefix" in options,
            "padding_free": "packed" in options,
        },
    )
    strategy = {
        "ddp": "ddp",
        "nodes": "ddp",
        "fsdp2": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        "fsdp2meta": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        "fsdp1": FSDPStrategy(auto_wrap_policy={Qwen2DecoderLayer}),
    }
    recorder = Recorder()
    stops = [StopAt(int(stop), Path(out_dir) / "last.ckpt")] if int(stop) else []
    trainer = quiet_trainer(
        out_dir, int(steps or STEPS), [recorder, *stops], strategy.get(mode, "auto"),
        accelerator="gpu" if mode == "fsdp1" else "cpu", devices=1 if mode in ("replay", "nodes") else 2,
        num_nodes=2 if mode == "nodes" else 1,
    )  # fmt: skip
    meta = trainer.init_module(empty_init=True) if mode == "fsdp2meta" else contextlib.nullcontext()
    with meta:  # the meta device: each rank loads only its own shard, in configure_model
        engine = ReplayEngine(out_dir.replace("replay", "ddp")) if mode == "replay" else None
        module = GRPOModule(**settings, rollout_engine=engine)
    built_on_meta = all(p.is_meta for n, p in module.policy.model.named_parameters() if "lora_" not in n)
    batch_size = PROMPTS_PER_RANK * (2 if mode == "replay" else 1)
    trainer.fit(module, PromptDataModule(data_path, batch_size=batch_size, val_split=None), ckpt_path=ckpt or None)
    params = torch.cat([full(p).flatten().cpu() for p in module.policy.model.parameters()])
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    if lora:
        module.save_pretrained(str(Path(out_dir) / "hf"), merged=True)
    torch.save(
        {
            "steps": recorder.steps,
            "grads": recorder.grads,
            "start": recorder.start,
            "params": params,
            "global_step": trainer.global_step,
            "built_on_meta": built_on_meta,
        },
        Path(out_dir) / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
