"""One TRL run: ``trl.GRPOTrainer`` with the settings of a lightning-grpo run, timed by a TrainerCallback.

Imported only by the worker process of a "trl" run, so lightning is never imported next to it. TRL 1.16's
defaults that differ from a plain fp32 CPU run are overridden: ``bf16`` (defaults on), ``gradient_checkpointing``
(defaults on), ``logging_steps`` (10), vLLM (off by default; stays off). ``per_device_train_batch_size`` counts
completions, so it is B * G, and ``steps_per_generation=1`` makes one generation batch one optimiser step.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from bench_assets import RunResult, RunSpec, StepLog, lora_config, read_rows, reward_for, rss_mb, run_result
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer


class RewardProbe:
    """Wraps a reward function to see what TRL scored: the tokens of the ``completion_ids`` it passes (cut
    after the first EOS, as in its ``completion_mask``) and the rewards. TRL's own ``num_tokens`` adds prompt
    tokens and its per-step metrics are only readable through logging, which is off here."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = fn.__name__  # TRL names the reward metrics after it
        self.tokens = 0
        self.rewards: list[float] = []

    def __call__(self, completions: list, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        values = self.fn(completions=completions, completion_ids=completion_ids, **kwargs)
        self.tokens += sum(len(ids) for ids in completion_ids)
        self.rewards += values
        return values

    def take(self) -> tuple[int, float]:
        """Completion tokens and mean reward since the last call."""
        tokens, mean = self.tokens, sum(self.rewards) / len(self.rewards)
        self.tokens, self.rewards = 0, []
        return tokens, mean


class StepClock(TrainerCallback):
    """Stamps the end of every optimiser step; prompt tokens are TRL's ``num_input_tokens_seen`` (prompt plus
    completion tokens) minus the probe's completion tokens."""

    def __init__(self, steps: StepLog, probe: RewardProbe) -> None:
        self.steps = steps
        self.probe = probe
        self.tokens_seen = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        completion, reward = self.probe.take()
        seen, self.tokens_seen = state.num_input_tokens_seen - self.tokens_seen, state.num_input_tokens_seen
        self.steps.step(completion, int(seen) - completion, reward)


def config(spec: RunSpec, output_dir: str) -> GRPOConfig:
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=spec.device == "cpu",
        bf16=spec.bf16,
        fp16=False,
        gradient_checkpointing=False,
        use_vllm=spec.vllm,
        **({"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3} if spec.vllm else {}),
        per_device_train_batch_size=spec.prompts_per_step * spec.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=spec.num_generations,
        max_completion_length=spec.max_completion_length,
        temperature=1.0,
        loss_type=spec.loss_type,
        beta=spec.beta,
        learning_rate=spec.learning_rate,
        lr_scheduler_type=spec.lr_scheduler_type,
        warmup_steps=spec.warmup_ratio,  # transformers 5: a float below 1 is a ratio of the training steps
        max_steps=spec.warmup_steps + spec.timed_steps,
        seed=spec.seed,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )


def run(spec: RunSpec) -> RunResult:
    start = time.perf_counter()
    probe = RewardProbe(reward_for(spec))
    log = StepLog()
    with tempfile.TemporaryDirectory() as output_dir:
        grpo = GRPOTrainer(
            model=spec.task.model_dir,
            reward_funcs=[probe],
            args=config(spec, output_dir),
            train_dataset=Dataset.from_list(read_rows(spec.task.data_dir, "train")),
            callbacks=[StepClock(log, probe)],
            peft_config=LoraConfig(**lora_config(spec.lora_r)) if spec.lora_r else None,
        )
        setup_s, rss_before = time.perf_counter() - start, rss_mb()
        grpo.train()
    return run_result(spec, log, grpo.model, grpo.processing_class, setup_s, rss_before)
