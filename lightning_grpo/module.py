"""GRPOModule: the LightningModule that wires the stages, and nothing else.

rollout (engine) -> rewards -> advantages -> targets -> loss -> optimiser; callbacks observe the step record.
Manual optimisation: one ``training_step`` samples a generation batch, then takes ``num_iterations`` optimiser
steps on it, each accumulating gradients over micro-batches of ``micro_batch_size`` completions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from transformers import PreTrainedTokenizerBase
from typing_extensions import override

from lightning_grpo.advantages import compute_advantages
from lightning_grpo.engines import HFGenerate
from lightning_grpo.loss import LossOutput, grpo_loss
from lightning_grpo.metrics import accuracy, length_stats, reward_stats, update_stats
from lightning_grpo.optim import clip_gradients, param_groups, scheduler
from lightning_grpo.policy import Policy
from lightning_grpo.ranks import Ranks
from lightning_grpo.rewards.combine import import_paths, reward_set
from lightning_grpo.rewards.scoring import default_accuracy_reward, score_rollout, trl_trainer_state
from lightning_grpo.rollout import RolloutEngine, SamplingConfig
from lightning_grpo.settings import check_settings
from lightning_grpo.targets import Targets, TargetSettings, build_targets, rows_of
from lightning_grpo.types import PromptBatch, RewardScores, Rollout, StepRecord, StepStats

LOSS_SETTINGS = ("beta", "loss_type", "epsilon", "epsilon_high", "delta", "importance_sampling_level")
PROGRESS_BAR = ("reward", "reward_std", "kl")


class GRPOModule(L.LightningModule):
    """Fine-tune a causal LM with GRPO and its variants (DAPO, Dr. GRPO, GSPO, BNPO).

    A step on one rank takes B prompts from the data module, samples ``num_generations`` (G) completions for
    each, scores them with ``reward_funcs``, and updates the policy. With the default ``num_iterations=1`` the
    importance ratio is exactly 1, so the logged ``loss`` stays near 0 while its gradient does not: watch
    ``reward``, not ``loss``.

    Args:
        model: Hugging Face model name or local path (``AutoModelForCausalLM``), or a built model.
        reward_funcs: callables ``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``,
            or their import paths in YAML (``trl.rewards.accuracy_reward``).
        reward_weights: one weight per reward function; the reward is their weighted sum (default all 1.0).
        reward_preset: a named set of weighted reward functions added to ``reward_funcs``: math_reasoning,
            code_generation, summarization or qa (``lightning_grpo.rewards.PRESETS``).
        tokenizer: name, path or tokenizer; defaults to ``model``'s.
        dtype: weights dtype when loading by name: float32, bfloat16, float16 or auto.
        num_generations: completions per prompt (G), >= 2.
        max_prompt_length: prompts longer than this keep their last tokens; ``None`` keeps all.
        max_completion_length: most tokens sampled per completion.
        temperature: sampling temperature; log-probs use the same temperature.
        top_p: nucleus sampling mass.
        top_k: top-k sampling; 0 disables it.
        min_p: min-p sampling; ``None`` disables it.
        repetition_penalty: 1.0 disables it.
        loss_type: aggregation of per-token losses: dapo (TRL's default), grpo, bnpo, dr_grpo.
        scale_rewards: advantage normalisation: group (std of the group), batch, none (Dr. GRPO).
        beta: KL penalty weight; > 0 loads a frozen reference copy of the initial policy.
        epsilon: lower clip of the ratio, 1 - epsilon.
        epsilon_high: upper clip, 1 + epsilon_high; defaults to epsilon (DAPO recommends 0.28).
        delta: optional cap on the unclipped ratio (two-sided clipping); > 1 + epsilon_high.
        importance_sampling_level: token (GRPO) or sequence (GSPO).
        num_iterations: optimiser steps per generation batch (mu); > 1 stores the sampling log-probs.
        mask_truncated_completions: drop completions without EOS from the loss (DAPO).
        micro_batch_size: completions per forward/backward pass; gradients accumulate over the step.
            ``None`` takes all ``B * G`` at once. Any value gives the same update.
        logprob_chunk_size: token positions per LM-head chunk when computing log-probs; ``None`` sizes chunks
            to ~32M logits (128 MB in fp32): 220 positions at Qwen2.5's 151,936-token vocabulary.
        share_prompt_prefix: the log-prob forward encodes each group's shared prompt once (Prefix Grouper):
            the same log-probs and gradients for P + G * T token positions a group instead of G * (P + T); a
            large saving when prompts are long and completions short. Not with gradient checkpointing or FSDP2.
        learning_rate: AdamW learning rate (TRL's default 1e-6 suits pretrained models; tiny ones want 1e-3).
        weight_decay: AdamW weight decay of weight matrices; biases, norm weights and embeddings take none.
        warmup_ratio: fraction of optimiser steps with linear warm-up.
        lr_scheduler_type: a ``transformers.get_scheduler`` schedule (``settings.LR_SCHEDULERS``). Cosine by
            default; linear, constant, constant_with_warmup, cosine_with_restarts, polynomial, inverse_sqrt.
        optimizer: optional optimiser factory ``params -> Optimizer`` replacing AdamW (``class_path`` in YAML).
        max_grad_norm: clip the gradient norm; ``None`` disables clipping.
        accuracy_reward: name of the reward function whose full marks (>= 1.0) count as ``accuracy`` (train and
            validation); ``None`` picks the correctness reward when exactly one of ``reward_funcs`` is one.
        gradient_checkpointing: recompute activations in the backward pass (off while generating).
        peft_config: LoRA settings (``peft.LoraConfig`` arguments, e.g. ``{r: 16, lora_alpha: 32,
            target_modules: all-linear}``): only the adapter trains; the reference for ``beta > 0`` is the
            policy with its adapter disabled (no second model in memory); checkpoints hold only the adapter.
        load_in_4bit: QLoRA: load the base model in 4-bit NF4 (bitsandbytes, CUDA) under a ``peft_config``
            adapter; ``dtype`` is the compute dtype. Refused at config time where it cannot run.
        on_reward_error: a reward function that raises: ``raise`` (naming the function and the sample),
            ``skip`` (failing rows count as not applicable) or ``zero`` (they score 0); counted in
            ``train/reward_errors/<fn>``.
        reward_timeout: seconds one call of one reward function may take; an overdue call fails all its rows,
            handled by ``on_reward_error``. A sync function is abandoned on a daemon thread, not killed.
        max_bad_steps: a step whose rewards, advantages or gradients are not finite is skipped (counted in
            ``train/skipped_steps``); this many in a row stop training with an error and a checkpoint.
        rollout_engine: what turns prompts into completions (``class_path`` in YAML): ``None`` is
            ``lightning_grpo.engines.HFGenerate`` (``generate`` on the policy); ``lightning_grpo.engines.VLLMColocate``
            runs a vLLM engine per rank (CUDA, ``pip install vllm``; weights copied in after each training step).
        sampling_correction: when another engine sampled (vLLM), re-weight the loss by the policy/sampler
            probability ratio: token_truncate, token_mask, sequence_truncate, sequence_mask (TRL's default) or
            ``None`` (off). Logged as ``train/sampling/importance_sampling_ratio/*`` (TRL's name).
        sampling_correction_max: the ratio's upper bound (clamped for ``*_truncate``, zeroed for ``*_mask``).
        seed: base of the per-rank, per-step sampling seed.
    """

    def __init__(
        self,
        model: str | nn.Module = "lightning-grpo/tiny-qwen2",
        reward_funcs: Sequence[Callable] | None = None,
        reward_weights: list[float] | None = None,
        reward_preset: str | None = None,
        tokenizer: str | PreTrainedTokenizerBase | None = None,
        dtype: str = "float32",
        num_generations: int = 8,
        max_prompt_length: int | None = 512,
        max_completion_length: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float | None = None,
        repetition_penalty: float = 1.0,
        loss_type: str = "dapo",
        scale_rewards: str = "group",
        beta: float = 0.0,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        delta: float | None = None,
        importance_sampling_level: str = "token",
        num_iterations: int = 1,
        mask_truncated_completions: bool = False,
        micro_batch_size: int | None = None,
        logprob_chunk_size: int | None = None,
        share_prompt_prefix: bool = False,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.0,
        lr_scheduler_type: str = "cosine",
        optimizer: OptimizerCallable | None = None,
        max_grad_norm: float | None = 1.0,
        accuracy_reward: str | None = None,
        gradient_checkpointing: bool = False,
        peft_config: dict[str, Any] | None = None,
        load_in_4bit: bool = False,
        on_reward_error: str = "raise",
        reward_timeout: float | None = None,
        max_bad_steps: int = 3,
        rollout_engine: RolloutEngine | None = None,
        sampling_correction: str | None = "sequence_mask",
        sampling_correction_max: float = 3.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        settings = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        check_settings(settings)
        self.reward_funcs, self.reward_weights = reward_set(reward_funcs, reward_weights, reward_preset)
        self.accuracy_reward = default_accuracy_reward(self.reward_funcs, accuracy_reward)
        # Only config values: LightningCLI parses them back when resuming with --ckpt_path.
        objects = [k for k in ("model", "tokenizer") if not isinstance(settings[k], str | None)]
        self.save_hyperparameters(ignore=["reward_funcs", "optimizer", "rollout_engine", *objects])
        restorable = import_paths(reward_funcs or [])
        if restorable:  # by import path, so that load_from_checkpoint(path) imports them again
            self.hparams["reward_funcs"] = restorable
        self.automatic_optimization = False
        self.optimizer_factory = optimizer
        self.engine = rollout_engine or HFGenerate()
        self.sampling = SamplingConfig(
            temperature, top_p, top_k, min_p, repetition_penalty, max_completion_length, max_prompt_length
        )
        self.loss_settings = {k: settings[k] for k in LOSS_SETTINGS}
        self.target_settings = TargetSettings(
            beta,
            num_iterations,
            mask_truncated_completions,
            micro_batch_size,
            max_completion_length,
            sampling_correction,
            sampling_correction_max,
        )
        self.policy = Policy(
            model,
            tokenizer,
            dtype,
            load_in_4bit,
            peft_config,
            gradient_checkpointing,
            reference=beta > 0,
            temperature=temperature,
            logprob_chunk_size=logprob_chunk_size,
            shared_prefix=share_prompt_prefix,
        )
        self.num_tokens_seen = 0
        self.skipped_steps = 0
        self.bad_steps_in_a_row = 0
        self.grad_norm = torch.tensor(float("nan"))  # the last optimiser step's, before clipping: train/grad_norm

    @override
    def setup(self, stage: str) -> None:
        """The rollout engine's own set-up, once Lightning has started the processes (vLLM joins their group)."""
        self.engine.setup(self.policy, self.trainer, self.hparams.seed)

    # ---- training -----------------------------------------------------------------------------------------

    @override
    def training_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, Any] | None:
        """Every random draw of the step (sampling, dropout) comes from a seed of (seed, rank, step), so a
        resumed run repeats the uninterrupted one with no RNG state saved; the global RNG is left as it was."""
        with torch.random.fork_rng(devices=self._cuda_devices()):
            torch.manual_seed(self._step_seed())
            return self._training_step(batch)

    def _training_step(self, batch: PromptBatch) -> dict[str, Any] | None:
        start, hp, ranks = time.perf_counter(), self.hparams, Ranks(self.trainer)
        rollout = self.sample(batch.prompts, hp.num_generations, columns=batch.columns)  # the step's RNG is seeded
        scores = self._score(rollout, batch)
        all_scores = ranks.gather_rows(scores.per_function)  # [W*N, F] identical on every rank: a batch std is global
        totals = RewardScores(all_scores, scores.names, scores.weights).total  # [W*N]
        advantages = ranks.own_rows(compute_advantages(totals, hp.num_generations, hp.scale_rewards).advantages)
        if all_scores.isinf().any() or not advantages.isfinite().all():  # NaN rewards are "not applicable"
            return self._skip_step("rewards or advantages are infinite or NaN")
        targets = build_targets(self.policy, rollout, advantages, self.target_settings, ranks)
        for _ in range(hp.num_iterations):
            loss = self._optimizer_step(rollout, targets)
            if loss is None:
                return self._skip_step("gradients are infinite or NaN")
        self.engine.sync_weights(self.policy)
        self.bad_steps_in_a_row = 0
        self.num_tokens_seen += int(ranks.sum(rollout.attention_mask.sum()))
        stats = StepStats(
            rewards=reward_stats(all_scores, scores.weights, scores.names, rollout.group_size, self.accuracy_reward),
            lengths=length_stats(*ranks.lengths(rollout)),
            update=update_stats(ranks.loss(loss), targets.sampling_weights, targets.mask, self.grad_norm.item()),
            num_tokens=self.num_tokens_seen,
            learning_rate=self.optimizers().param_groups[0]["lr"],
            skipped_steps=self.skipped_steps,
            truncated_prompts=rollout.num_truncated_prompts,
            step_time=time.perf_counter() - start,
            reward_errors=scores.errors,
            extra={**rollout.metrics, **scores.metrics},
        )
        self._log_step(stats)
        return {"loss": torch.tensor(stats.update.loss), "record": StepRecord(rollout, scores, advantages, stats)}

    def sample(
        self,
        prompts: list,
        num_generations: int,
        seed: int | None = None,
        greedy: bool = False,
        columns: dict[str, list] | None = None,
    ) -> Rollout:
        """Completions for ``prompts`` (their other dataset ``columns`` go to the engine, for environments); a seed
        makes sampling reproducible and distinct per rank and step."""
        with torch.random.fork_rng(devices=self._cuda_devices(), enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            return self.engine.generate(self.policy, prompts, num_generations, self.sampling, greedy, columns=columns)

    def _score(self, rollout: Rollout, batch: PromptBatch) -> RewardScores:
        hp = self.hparams
        state = trl_trainer_state(self.global_step, self.trainer.max_steps, self.current_epoch)  # as TRL passes it
        return score_rollout(
            self.reward_funcs, self.reward_weights, rollout, batch.columns, hp.on_reward_error, hp.reward_timeout, state
        )

    def _cuda_devices(self) -> list[torch.device]:
        return [self.device] if self.device.type == "cuda" else []

    def _step_seed(self) -> int:
        return (self.hparams.seed * 1_000_003 + self.global_rank * 7_919 + self.global_step) % 2**63

    def _optimizer_step(self, rollout: Rollout, targets: Targets) -> LossOutput | None:
        """One optimiser step over the generation batch, gradients accumulated across micro-batches; ``None``
        when the gradients are not finite and the step was not taken."""
        optimizer = self.optimizers()
        optimizer.zero_grad()
        total: LossOutput | None = None
        for rows in targets.micro_batches:
            token = self.policy.token_logps(rollout, rows)
            out = grpo_loss(
                token.logps,
                rows_of(targets.old_logps, rows),
                targets.advantages[rows],
                targets.mask[rows],
                ref_logps=rows_of(targets.ref_logps, rows),
                normalizer=targets.normalizer,
                sampling_weights=rows_of(targets.sampling_weights, rows),
                **self.loss_settings,
            )
            self.manual_backward(out.loss)
            entropy = (token.entropy * targets.mask[rows]).sum()
            out = LossOutput(
                out.loss.detach(), {**out.token_sums, "entropy": entropy}, out.num_tokens, extremes=out.extremes
            )
            total = out if total is None else total + out
        # fp16 AMP: gradients are unscaled inside optimizer.step (clipped there, in on_before_optimizer_step), and
        # the GradScaler skips steps with overflowing gradients and lowers its scale by itself
        if self._grad_scaler() is None and not self._clip_gradients().isfinite():
            optimizer.zero_grad()
            return None
        optimizer.step()
        self.lr_schedulers().step()
        return total

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._grad_scaler() is not None:  # the fp16 GradScaler has just unscaled the gradients
            self._clip_gradients()

    def _grad_scaler(self) -> Any:
        return getattr(self.trainer.precision_plugin, "scaler", None)

    def _clip_gradients(self) -> Tensor:
        """Clip to ``max_grad_norm``; the pre-clip global gradient norm, the same on every rank, logged as TRL's
        (and Hugging Face Trainer's) ``grad_norm``."""
        strategy = self.trainer.strategy
        root = strategy.model if isinstance(strategy, FSDPStrategy) else None  # FSDP1 clips at its root
        self.grad_norm = clip_gradients(self.policy.trainable_parameters(), self.hparams.max_grad_norm, root).detach()
        return self.grad_norm

    def _skip_step(self, reason: str) -> None:
        """Skip an optimiser step with a warning; ``max_bad_steps`` in a row stop training, a checkpoint kept."""
        self.skipped_steps += 1
        self.bad_steps_in_a_row += 1
        self.log("train/skipped_steps", float(self.skipped_steps), on_step=True, batch_size=1)
        if self.bad_steps_in_a_row < self.hparams.max_bad_steps:
            rank_zero_warn(f"GRPO step skipped at global step {self.global_step}: {reason}")
            return None
        path = Path(self.trainer.log_dir or self.trainer.default_root_dir) / "checkpoints" / "numerical-abort.ckpt"
        self.trainer.save_checkpoint(path)
        raise FloatingPointError(
            f"{self.bad_steps_in_a_row} GRPO steps in a row skipped ({reason}); training stopped at global step "
            f"{self.global_step} with a checkpoint at {path}. Try a lower learning_rate, max_grad_norm, or "
            "reward functions that return finite numbers"
        )

    def _log_step(self, stats: StepStats) -> None:
        """Every metric every step, so that ``ModelCheckpoint``/``EarlyStopping`` can monitor any of them; the
        loggers write on their ``log_every_n_steps``."""
        metrics = {f"train/{k}": v for k, v in stats.metrics().items()}
        shown = {k: metrics.pop(f"train/{k}") for k in PROGRESS_BAR if f"train/{k}" in metrics}
        self.log_dict({f"train/{k}": v for k, v in shown.items()}, prog_bar=True, on_step=True, batch_size=1)
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    # ---- validation ---------------------------------------------------------------------------------------

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
        """Greedy completion per held-out prompt: mean reward, per-function means and accuracy."""
        rollout = self.sample(batch.prompts, num_generations=1, greedy=True, columns=batch.columns)
        scores = self._score(rollout, batch)
        metrics = {"reward": scores.total.nanmean().nan_to_num(0.0).item()}
        for i, name in enumerate(scores.names):
            metrics[f"rewards/{name}/mean"] = scores.per_function[:, i].nanmean().item()  # NaN: never applied
        if self.accuracy_reward:
            metrics["accuracy"] = accuracy(scores.per_function, scores.names, self.accuracy_reward)
        metrics["completions/mean_length"] = rollout.completion_mask.sum(1).float().mean().item()
        self.log_dict({f"{stage}/{k}": v for k, v in metrics.items()}, batch_size=len(batch), sync_dist=True)

    # ---- models, optimiser, checkpoints -------------------------------------------------------------------

    @override
    def configure_model(self) -> None:
        """Sharding: FSDP2 (``ModelParallelStrategy``) shards the policy here; Lightning's FSDP wraps it itself."""
        trainer = self._attached_trainer()
        strategy = trainer.strategy if trainer is not None else None  # load_from_checkpoint: no trainer
        if isinstance(strategy, ModelParallelStrategy):
            mesh = self.device_mesh
            if mesh["tensor_parallel"].size() != 1:
                raise ValueError(
                    "ModelParallelStrategy tensor_parallel_size must be 1 for GRPOModule (FSDP2 data parallelism "
                    f"only), got {mesh['tensor_parallel'].size()}: set data_parallel_size to the number of processes"
                )
            self.policy.shard(mesh["data_parallel"], trainer.world_size)
        elif isinstance(strategy, FSDPStrategy):
            self.policy.shard(None, trainer.world_size)

    def _attached_trainer(self) -> L.Trainer | None:
        try:
            return self.trainer
        except RuntimeError:  # not attached to a Trainer
            return None

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        groups = param_groups(self.policy.model, hp.weight_decay)  # no decay on biases, norms, embeddings
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(groups)
        else:
            # Fused: one kernel over all parameters (on CPU ~10x faster than the per-tensor loop); FSDP2's
            # sharded DTensor parameters, and fp16 AMP (it unscales before clipping), take the default one.
            params = self.policy.trainable_parameters()
            fused = not any(isinstance(p, DTensor) for p in params) and self._grad_scaler() is None
            optimizer = torch.optim.AdamW(groups, lr=hp.learning_rate, fused=fused)
        steps = self.trainer.estimated_stepping_batches
        if self.trainer.max_steps == -1:  # counted in batches; each batch takes num_iterations optimiser steps
            steps *= hp.num_iterations
        schedule = scheduler(optimizer, hp.lr_scheduler_type, hp.warmup_ratio, steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["grpo_counters"] = {"num_tokens_seen": self.num_tokens_seen, "skipped_steps": self.skipped_steps}

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        counters = checkpoint.get("grpo_counters", {})
        self.num_tokens_seen = counters.get("num_tokens_seen", 0)
        self.skipped_steps = counters.get("skipped_steps", 0)

    def save_pretrained(self, path: str, merged: bool = False) -> None:
        """The policy and tokenizer in Hugging Face format: ``AutoModelForCausalLM.from_pretrained(path)``.

        Every rank calls it; global rank 0 writes. A LoRA policy writes its adapter
        (``PeftModel.from_pretrained(base, path)``) and, with ``merged``, the merged model (base + adapter in
        full weights) in ``path/merged``. An FSDP2-sharded policy is gathered first (a collective).
        """
        self.policy.save_pretrained(path, self.global_rank == 0, merged)
