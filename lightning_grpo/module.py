"""GRPOModule: the LightningModule that wires the stages, and nothing else.

rollout (engine) -> rewards -> targets (advantages, reference and sampler log-probs) -> loss -> optimiser;
callbacks observe the step record. Manual optimisation: one ``training_step`` samples a generation batch, then
takes ``update.num_iterations`` passes of ``update.steps_per_generation`` optimiser steps on it, each accumulating
gradients over micro-batches. Every setting is checked by its section before any model loads (``settings.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from typing_extensions import override

from lightning_grpo.advantages import AdvantageConfig
from lightning_grpo.checkpoints import load_run_state, save_run_state
from lightning_grpo.distill.config import DistillConfig
from lightning_grpo.distill.targets import dataset_rollout, no_reward, off_policy_step
from lightning_grpo.engines import default_engine, engine_for
from lightning_grpo.engines.base import RolloutEngine, Sampled
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.groups import GroupBuffer
from lightning_grpo.loss import LossConfig
from lightning_grpo.loss.entropy import EntropyController
from lightning_grpo.metrics import (
    StageClock,
    StepCounters,
    StepValues,
    eval_metrics,
    staleness_metrics,
    step_stats,
)
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.teacher import TeacherModel
from lightning_grpo.optim import OptimConfig, build_optimizer, optimizer_steps_of, scheduler
from lightning_grpo.ranks import Ranks, destroy_process_group_at_exit
from lightning_grpo.rewards.calls import RewardCallConfig
from lightning_grpo.rewards.combine import import_paths
from lightning_grpo.rewards.scoring import RewardSet, trl_trainer_state
from lightning_grpo.seeding import seeded, step_seed
from lightning_grpo.settings import GRPOSettings
from lightning_grpo.steplog import log_train_metrics
from lightning_grpo.targets import UpdateConfig, build_targets
from lightning_grpo.types import PromptBatch, RewardScores, Rollout, StepRecord
from lightning_grpo.update import TrainedStep, Update, grad_scaler

PROGRESS_BAR = ("train/reward", "train/reward_std", "train/kl")


class GRPOModule(L.LightningModule):
    """Fine-tune a causal LM with GRPO and its family (DAPO, Dr. GRPO, GSPO, CISPO, SAPO, RLOO, REINFORCE++ ...).

    A step on one rank takes B prompts from the data module, samples ``num_generations`` (G) completions for
    each, scores them with ``reward_funcs``, and updates the policy. With the default ``update.num_iterations=1``
    the importance ratio is exactly 1, so the logged ``loss`` stays near 0 while its gradient does not: watch
    ``reward``, not ``loss``. Settings come in sections with TRL's names inside them; YAML nests them
    (``model: {loss: {beta: 0.04}}``), the command line dots them (``--model.loss.beta 0.04``).

    Args:
        model: Hugging Face model name or local path (``AutoModelForCausalLM``), a GGUF file (``*.gguf``, converted
            once under ``LIGHTNING_GRPO_HOME/gguf/``; ``lightning-grpo/smollm2-135m-instruct``), or a built model.
        reward_funcs: callables ``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``,
            or their import paths in YAML (``trl.rewards.accuracy_reward``). Empty with a ``distill.teacher``: every
            reward is 0 and the teacher alone trains.
        reward_weights: one weight per reward function; the reward is their weighted sum (default all 1.0).
        reward_preset: a named set of weighted reward functions added to ``reward_funcs``: math_reasoning,
            code_generation, summarization or qa (``lightning_grpo.rewards.PRESETS``).
        accuracy_reward: name of the reward function whose full marks (>= 1.0) count as ``accuracy`` (train and
            validation); ``None`` picks the correctness reward when exactly one of ``reward_funcs`` is one.
        num_generations: completions per prompt (G), >= 2.
        num_generations_eval: completions per validation prompt, sampled; logs ``val/pass@k`` and ``val/mean@k``
            besides the means. ``None``: one greedy completion per prompt.
        sampling: how completions are sampled (temperature, top_p, max_completion_length ...).
        loss: the policy loss (loss_type, beta, epsilon, epsilon_high, importance_sampling_level, entropy ...).
        advantages: how rewards become advantages (adv_estimator, scale_rewards, filter_groups ...).
        optim: AdamW and its schedule (learning_rate, warmup, lr_scheduler_type, max_grad_norm).
        policy: how the model is loaded and run (tokenizer, dtype, peft_config, load_in_4bit,
            gradient_checkpointing, share_prompt_prefix, logprob_chunk_size, TR-DPO ...).
        update: how a generation batch is trained on (num_iterations, steps_per_generation, micro_batch_size,
            mask_truncated_completions, sampling_correction).
        reward_calls: what a failing or overdue reward call does (on_error, timeout).
        distill: on-policy distillation from a frozen teacher (``references/distillation.md``).
        max_bad_steps: a step whose rewards, advantages or gradients are not finite is skipped (counted in
            ``train/skipped_steps``); this many in a row stop training with an error and a checkpoint.
        rollout_engine: what turns prompts into completions (``class_path`` in YAML): ``None`` is
            ``lightning_grpo.engines.LeanDecode`` (``HFGenerate`` when ``sampling.generation_kwargs`` is set, said
            in one line); see ``lightning_grpo.engines`` for the others (ToolCalling, RolloutFunction,
            VLLMColocate, VLLMServer, OpenAIAgent, AsyncRollouts).
        optimizer: optional optimiser factory ``params -> Optimizer`` replacing AdamW (``class_path`` in YAML).
        seed: base of the per-rank, per-step sampling seed.
    """

    def __init__(
        self,
        model: str | nn.Module = "lightning-grpo/tiny-qwen2",
        reward_funcs: Sequence[Callable] | None = None,
        reward_weights: list[float] | None = None,
        reward_preset: Literal["math_reasoning", "code_generation", "summarization", "qa"] | None = None,
        accuracy_reward: str | None = None,
        num_generations: int = 8,
        num_generations_eval: int | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        loss: LossConfig = LossConfig(),
        advantages: AdvantageConfig = AdvantageConfig(),
        optim: OptimConfig = OptimConfig(),
        policy: PolicyConfig = PolicyConfig(),
        update: UpdateConfig = UpdateConfig(),
        reward_calls: RewardCallConfig = RewardCallConfig(),
        distill: DistillConfig = DistillConfig(),
        max_bad_steps: int = 3,
        rollout_engine: RolloutEngine | None = None,
        optimizer: OptimizerCallable | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.engine = rollout_engine or default_engine(sampling)
        s = self.settings = GRPOSettings.build(
            self.engine,
            model,
            num_generations=num_generations,
            num_generations_eval=num_generations_eval,
            max_bad_steps=max_bad_steps,
            seed=seed,
            **dict(sampling=sampling, loss=loss, advantages=advantages, optim=optim),
            **dict(policy=policy, update=update, reward_calls=reward_calls, distill=distill),
        )
        if s.distill.enabled and not (reward_funcs or reward_preset):  # the teacher alone: every reward is 0
            reward_funcs = [no_reward]
        self.rewards = RewardSet.build(reward_funcs, reward_weights, reward_preset, accuracy_reward, s.reward_calls)
        objects = ["reward_funcs", "optimizer", "rollout_engine", *([] if isinstance(model, str) else ["model"])]
        self.save_hyperparameters(ignore=objects)  # config values only: LightningCLI parses them back on resume
        self.save_hyperparameters({**self.hparams, **s.hparams()})  # the sections as plain dicts, logged ones too
        if import_paths(reward_funcs or []):  # so that load_from_checkpoint(path) imports them again
            self.hparams["reward_funcs"] = import_paths(reward_funcs)
        self.automatic_optimization = False
        self.optimizer_factory = optimizer
        d = s.distill
        teacher = TeacherModel(d.teacher, d.teacher_dtype, d.teacher_init_kwargs, d.teacher_server)
        self.policy = Policy(
            model,
            s.policy,
            s.reference,
            s.sampling.temperature,
            s.loss.router_aux_loss_coef,
            teacher if s.distill.enabled else None,
        )
        self.engine = engine_for(self.engine, self.policy, chosen=rollout_engine is not None)
        self.targets = s.targets(self.policy.shares_prompt_prefix)
        self.entropy = EntropyController.from_config(s.loss)
        self.group_buffer = GroupBuffer.of(s.advantages, self.policy.tokenizer.pad_token_id, self.engine.max_staleness)
        self.counters = StepCounters()
        self.update = Update(self.targets, s.loss, s.update.num_iterations, s.optim.max_grad_norm, max_bad_steps)

    @override
    def setup(self, stage: str) -> None:
        """The rollout engine's own set-up, once Lightning has started the processes (vLLM joins their group)."""
        destroy_process_group_at_exit(self.trainer)
        self.engine.setup(self.policy, self.trainer, self.settings.seed)
        if stage == "fit":
            self.engine.use_rewards(self.rewards)

    @override
    def teardown(self, stage: str) -> None:
        self.engine.teardown()

    # ---- training -----------------------------------------------------------------------------------------

    @override
    def training_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, Any] | None:
        """Every random draw of the step (sampling, dropout) comes from a seed of (seed, rank, step), so a
        resumed run repeats the uninterrupted one with no RNG state saved; the global RNG is left as it was."""
        waited = self.group_buffer.num_gen_batches  # filter_groups: batches drawn without an update yet
        with seeded(step_seed(self.settings.seed, self.global_rank, self.global_step, waited), self.device):
            return self._training_step(batch)

    def _training_step(self, batch: PromptBatch) -> dict[str, Any] | None:
        start, ranks, clock = time.perf_counter(), Ranks(self.trainer), StageClock()
        sampled = self._rollout(batch)
        if sampled is None:  # an engine sampling ahead fills its pipeline: no update yet
            return None
        clock.lap("generation")
        rollout, batch = sampled.rollout, sampled.batch  # the batch it answers (an earlier one when sampled ahead)
        scores = sampled.scores or self._score(rollout, batch)  # the engine's own when it scores as it samples
        kept = self._filter_groups(rollout, scores, len(batch), ranks, sampled)
        if kept is None:  # filter_groups: no update this batch, waiting for more groups with signal
            return {"drawn": self.group_buffer.drawn(rollout, scores)}  # what it showed, for NoSignalAlert
        rollout, scores, extra = kept
        extra |= staleness_metrics(sampled.staleness(rollout))
        every_rank = ranks.gather_rows(scores.per_function)  # [W*N, F] identical on every rank: a batch std is global
        clock.lap("scoring")
        targets = build_targets(self.policy, rollout, scores, every_rank, self.targets, ranks)
        clock.lap("logprobs")
        loss, taken, fault = self.update.run(self, self.policy, rollout, targets, self.entropy)
        if fault is not None:
            if taken:  # the optimiser steps before the bad one moved the weights: the engine samples from them
                self.engine.sync_weights(self.policy)
            return self.update.skip(self, self.counters, fault, taken)
        targets = targets.settled(ranks)
        clock.lap("update")
        self.engine.sync_weights(self.policy)
        clock.lap("sync")
        self.counters.good_step(ranks.sum(rollout.attention_mask.sum()))
        trained = TrainedStep(rollout, scores, every_rank, targets, loss.over_ranks(ranks), extra | clock.metrics())
        return self._publish(trained, ranks, start)

    def _rollout(self, batch: PromptBatch) -> Sampled | None:
        """The engine's rollout of ``batch``; on GKD's off-policy steps (``distill.lmbda < 1``), the batch's own
        completions from the dataset."""
        s = self.settings
        if off_policy_step(s.distill, s.seed, self.global_step, batch):
            column = s.distill.completion_column
            return Sampled(dataset_rollout(self.policy, batch, column, s.num_generations, s.sampling), batch)
        return self.engine.rollout(self.policy, batch, s.num_generations, s.sampling)

    def _publish(self, step: TrainedStep, ranks: Ranks, start: float) -> dict[str, Any]:
        """Log the step's metrics and return its record for the callbacks."""
        update = step.loss.stats(self.update.grad_norm, self.settings.loss.top_entropy_quantile < 1)
        lr = self.optimizers().param_groups[0]["lr"]
        extra = step.extra | step.targets.metrics() | self.entropy.metrics()
        seconds, lengths = time.perf_counter() - start, ranks.lengths(step.rollout)
        values = StepValues(step.rollout, step.scores, step.every_rank, lengths, update, lr, seconds, extra)
        stats = step.targets.typed(step_stats(values, self.counters, self.rewards.accuracy))
        log_train_metrics(self, {f"train/{k}": v for k, v in stats.metrics().items()}, PROGRESS_BAR)
        record = StepRecord(step.rollout, step.scores, step.targets.advantages, stats)
        return {"loss": torch.tensor(stats.update.loss), "record": record}

    def _filter_groups(
        self, rollout: Rollout, scores: RewardScores, num_prompts: int, ranks: Ranks, sampled: Sampled
    ) -> tuple[Rollout, RewardScores, dict[str, float]] | None:
        """The rollout to train on, with its scores and metrics; with ``filter_groups``, the groups with signal
        gathered over batches (their staleness counted from ``sampled``'s version), ``None`` while too few have
        come."""
        buffer = self.group_buffer
        filtered = buffer.next_update(rollout, scores, num_prompts, ranks, self.global_step, sampled.staleness)
        if filtered is None and buffer.num_gen_batches:
            self.log("train/filter_groups/num_gen_batches", float(buffer.num_gen_batches), batch_size=1)
        return filtered

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if grad_scaler(self.trainer) is not None:  # the fp16 GradScaler has just unscaled the gradients
            self.update.clip(self.policy, self.trainer)

    # ---- sampling, scoring, held-out evaluation -----------------------------------------------------------

    def sample(self, prompts: list, num_generations: int, greedy: bool = False, columns: dict | None = None) -> Rollout:
        """Completions for ``prompts`` (their other dataset ``columns`` go to the engine, for environments)."""
        s = self.settings.sampling
        return self.engine.generate(self.policy, prompts, num_generations, s, greedy, columns=columns)

    def _score(self, rollout: Rollout, batch: PromptBatch) -> RewardScores:
        state = trl_trainer_state(self.global_step, self.trainer.max_steps, self.current_epoch)  # as TRL passes it
        return self.rewards.score(rollout, batch.columns, state)

    @override
    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    @override
    def test_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    @override
    def predict_step(self, batch: PromptBatch, batch_idx: int) -> list[dict[str, Any]]:
        """Greedy completions of the batch's prompts: ``{"prompt", "completion"}`` per row."""
        rollout = self.sample(batch.prompts, num_generations=1, greedy=True, columns=batch.columns)
        return [{"prompt": p, "completion": c} for p, c in zip(rollout.prompts, rollout.completions)]

    def _evaluate(self, batch: PromptBatch, stage: str) -> None:
        """Per held-out prompt one greedy completion, or ``num_generations_eval`` sampled ones: mean reward,
        per-function means, accuracy, and with several samples pass@k / mean@k of the accuracy reward."""
        k = self.settings.num_generations_eval
        rollout = self.sample(batch.prompts, num_generations=k or 1, greedy=k is None, columns=batch.columns)
        metrics = eval_metrics(self._score(rollout, batch), rollout, self.rewards.accuracy, k)
        self.log_dict({f"{stage}/{k}": v for k, v in metrics.items()}, batch_size=len(batch), sync_dist=True)

    # ---- models, optimiser, checkpoints -------------------------------------------------------------------

    @override
    def configure_model(self) -> None:
        """The policy places its weights for the strategy (FSDP2 shards here; load_from_checkpoint: no trainer)."""
        self.policy.configure(self._strategy(), self.device_mesh)

    def _strategy(self) -> Any:
        try:
            return self.trainer.strategy
        except RuntimeError:  # not attached to a Trainer (load_from_checkpoint)
            return None

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        s, amp = self.settings, grad_scaler(self.trainer) is not None
        optimizer = build_optimizer(self.policy.model, s.optim, self.optimizer_factory, amp)
        steps = optimizer_steps_of(self.trainer, s.update.optimizer_steps_per_batch)
        schedule = {"scheduler": scheduler(optimizer, s.optim, steps), "interval": "step"}  # stepped by Update
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        save_run_state(checkpoint, self.counters, self.entropy, self.engine, self.group_buffer)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        load_run_state(checkpoint, self.counters, self.entropy, self.engine, self.group_buffer)

    def save_pretrained(self, path: str, merged: bool = False) -> None:
        """The policy and tokenizer in Hugging Face format: ``AutoModelForCausalLM.from_pretrained(path)``.

        Every rank calls it; global rank 0 writes. A LoRA policy writes its adapter
        (``PeftModel.from_pretrained(base, path)``) and, with ``merged``, the merged model (base + adapter in
        full weights) in ``path/merged``. An FSDP2-sharded policy is gathered first (a collective).
        """
        self.policy.save_pretrained(path, self.global_rank == 0, merged)
