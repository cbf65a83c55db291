"""GRPOModule: the LightningModule that wires the stages, and nothing else.

rollout (engine) -> rewards -> advantages -> targets -> loss -> optimiser; callbacks observe the step record.
Manual optimisation: one ``training_step`` samples a generation batch, then takes ``num_iterations`` optimiser
steps on it, each accumulating gradients over micro-batches of ``micro_batch_size`` completions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from transformers import PreTrainedTokenizerBase
from typing_extensions import override

from lightning_grpo.advantages import AdvantageConfig, TokenRewards, kl_penalty, multi_objective_advantages
from lightning_grpo.dynamic import GroupBuffer
from lightning_grpo.engines import HFGenerate
from lightning_grpo.loss.entropy import EntropyController
from lightning_grpo.loss.grpo import LossConfig, LossOutput, grpo_loss
from lightning_grpo.metrics import eval_metrics, length_stats, reward_stats, update_stats
from lightning_grpo.model.logprobs import router_aux_coef
from lightning_grpo.model.policy import Policy
from lightning_grpo.optim import OptimConfig, clip_gradients, param_groups, scheduler
from lightning_grpo.ranks import Ranks
from lightning_grpo.rewards.combine import import_paths, reward_set
from lightning_grpo.rewards.scoring import default_accuracy_reward, score_rollout, trl_trainer_state
from lightning_grpo.rollout import RolloutEngine, SamplingConfig
from lightning_grpo.run import log_train_metrics
from lightning_grpo.settings import check_settings
from lightning_grpo.targets import OptimiserStep, Targets, TargetSettings, build_targets, optimiser_steps, rows_of
from lightning_grpo.types import PromptBatch, RewardScores, Rollout, StepRecord, StepStats

PROGRESS_BAR = ("train/reward", "train/reward_std", "train/kl")
SECTIONS = {"sampling": SamplingConfig, "loss": LossConfig, "advantages": AdvantageConfig, "optim": OptimConfig}


def section(kind: type, value: Any) -> Any:
    """A settings section given as the dataclass, or as the dict a checkpoint's hyper-parameters hold."""
    return kind(**value) if isinstance(value, dict) else value


class GRPOModule(L.LightningModule):
    """Fine-tune a causal LM with GRPO and its family (DAPO, Dr. GRPO, GSPO, CISPO, SAPO, RLOO, REINFORCE++ ...).

    A step on one rank takes B prompts from the data module, samples ``num_generations`` (G) completions for
    each, scores them with ``reward_funcs``, and updates the policy. With the default ``num_iterations=1`` the
    importance ratio is exactly 1, so the logged ``loss`` stays near 0 while its gradient does not: watch
    ``reward``, not ``loss``. Settings come in sections (``sampling``, ``loss``, ``advantages``, ``optim``) with
    TRL's names inside them; YAML nests them (``model: {loss: {beta: 0.04}}``), the command line dots them
    (``--model.loss.beta 0.04``).

    Args:
        model: Hugging Face model name or local path (``AutoModelForCausalLM``), or a built model.
        reward_funcs: callables ``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``,
            or their import paths in YAML (``trl.rewards.accuracy_reward``).
        reward_weights: one weight per reward function; the reward is their weighted sum (default all 1.0).
        reward_preset: a named set of weighted reward functions added to ``reward_funcs``: math_reasoning,
            code_generation, summarization or qa (``lightning_grpo.rewards.PRESETS``).
        accuracy_reward: name of the reward function whose full marks (>= 1.0) count as ``accuracy`` (train and
            validation); ``None`` picks the correctness reward when exactly one of ``reward_funcs`` is one.
        tokenizer: name, path or tokenizer; defaults to ``model``'s.
        dtype: weights dtype when loading by name: float32, bfloat16, float16 or auto.
        model_init_kwargs: more ``from_pretrained`` arguments (``{trust_remote_code: true, attn_implementation:
            sdpa}``).
        num_generations: completions per prompt (G), >= 2.
        num_generations_eval: completions per validation prompt, sampled; logs ``val/pass@k`` and ``val/mean@k``
            besides the means. ``None``: one greedy completion per prompt.
        sampling: how completions are sampled (``SamplingConfig``: temperature, top_p, top_k, min_p,
            repetition_penalty, max_completion_length, max_prompt_length, generation_kwargs,
            chat_template_kwargs).
        loss: the policy loss (``LossConfig``: loss_type, beta, epsilon, epsilon_high, importance_sampling_level,
            entropy options ...).
        advantages: how rewards become advantages (``AdvantageConfig``: adv_estimator, scale_rewards,
            multi_objective_aggregation, filter_groups ...).
        optim: AdamW and its schedule (``OptimConfig``: learning_rate, weight_decay, warmup, lr_scheduler_type,
            max_grad_norm).
        num_iterations: passes over each generation batch (mu); > 1 stores the sampling log-probs.
        steps_per_generation: optimiser steps per generation batch, each on its share of the batch's groups
            (TRL's option; rollouts reused, the later steps off-policy); ``data.batch_size`` must be a multiple.
        mask_truncated_completions: drop completions without EOS from the loss (DAPO).
        micro_batch_size: completions per forward/backward pass; gradients accumulate over the step.
            ``None`` takes all at once. Any value gives the same update.
        logprob_chunk_size: token positions per LM-head chunk when computing log-probs; ``None`` sizes chunks
            to ~32M logits (128 MB in fp32): 220 positions at Qwen2.5's 151,936-token vocabulary.
        share_prompt_prefix: the log-prob forward encodes each group's shared prompt once (Prefix Grouper):
            the same log-probs and gradients for P + G * T token positions a group instead of G * (P + T); a
            large saving when prompts are long and completions short; DDP and FSDP2 alike. Not with gradient
            checkpointing.
        gradient_checkpointing: recompute activations in the backward pass (off while generating).
        peft_config: LoRA settings (``peft.LoraConfig`` arguments, e.g. ``{r: 16, lora_alpha: 32,
            target_modules: all-linear}``): only the adapter trains; the reference for ``beta > 0`` is the
            policy with its adapter disabled (no second model in memory); checkpoints hold only the adapter.
        load_in_4bit: QLoRA: load the base model in 4-bit NF4 (bitsandbytes, CUDA) under a ``peft_config``
            adapter; ``dtype`` is the compute dtype. Refused at config time where it cannot run.
        disable_dropout: dropout off in the policy and reference (TRL's option; on-policy ratios are then
            exactly 1 for ``num_iterations > 1`` too).
        sync_ref_model: TR-DPO: every ``ref_model_sync_steps`` optimiser steps the reference moves towards the
            policy, ``ref = alpha * policy + (1 - alpha) * ref`` (needs loss.beta > 0, no LoRA).
        ref_model_mixup_alpha: that alpha.
        ref_model_sync_steps: optimiser steps between reference updates.
        on_reward_error: a reward function that raises: ``raise`` (naming the function and the sample),
            ``skip`` (failing rows count as not applicable) or ``zero`` (they score 0); counted in
            ``train/reward_errors/<fn>``.
        reward_timeout: seconds one call of one reward function may take; an overdue call fails all its rows,
            handled by ``on_reward_error``. A sync function is abandoned on a daemon thread, not killed.
        max_bad_steps: a step whose rewards, advantages or gradients are not finite is skipped (counted in
            ``train/skipped_steps``); this many in a row stop training with an error and a checkpoint.
        rollout_engine: what turns prompts into completions (``class_path`` in YAML): ``None`` is
            ``lightning_grpo.engines.HFGenerate``; see ``lightning_grpo.engines`` for the others (LeanDecode,
            ToolCalling, RolloutFunction, VLLMColocate).
        sampling_correction: when another engine sampled (vLLM), re-weight the loss by the policy/sampler
            probability ratio: token_truncate, token_mask, sequence_truncate, sequence_mask (TRL's default) or
            ``None`` (off). Logged as ``train/sampling/importance_sampling_ratio/*``.
        sampling_correction_max: the ratio's upper bound (clamped for ``*_truncate``, zeroed for ``*_mask``).
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
        tokenizer: str | PreTrainedTokenizerBase | None = None,
        dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32",
        model_init_kwargs: dict[str, Any] | None = None,
        num_generations: int = 8,
        num_generations_eval: int | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        loss: LossConfig = LossConfig(),
        advantages: AdvantageConfig = AdvantageConfig(),
        optim: OptimConfig = OptimConfig(),
        num_iterations: int = 1,
        steps_per_generation: int = 1,
        mask_truncated_completions: bool = False,
        micro_batch_size: int | None = None,
        logprob_chunk_size: int | None = None,
        share_prompt_prefix: bool = False,
        gradient_checkpointing: bool = False,
        peft_config: dict[str, Any] | None = None,
        load_in_4bit: bool = False,
        disable_dropout: bool = False,
        sync_ref_model: bool = False,
        ref_model_mixup_alpha: float = 0.6,
        ref_model_sync_steps: int = 512,
        on_reward_error: Literal["raise", "skip", "zero"] = "raise",
        reward_timeout: float | None = None,
        max_bad_steps: int = 3,
        rollout_engine: RolloutEngine | None = None,
        sampling_correction: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
        | None = "sequence_mask",
        sampling_correction_max: float = 3.0,
        optimizer: OptimizerCallable | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        settings = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        section_problems = []
        for name, kind in SECTIONS.items():
            try:
                settings[name] = section(kind, settings[name])
            except ValueError as err:  # listed with every other problem
                section_problems.append(str(err))
                settings[name] = kind()
        engine = rollout_engine or HFGenerate()
        check_settings(settings, section_problems + engine.problems(settings["sampling"]))
        self.reward_funcs, self.reward_weights = reward_set(reward_funcs, reward_weights, reward_preset)
        self.accuracy_reward = default_accuracy_reward(self.reward_funcs, accuracy_reward)
        # Only config values: LightningCLI parses them back when resuming with --ckpt_path.
        objects = [k for k in ("model", "tokenizer") if not isinstance(settings[k], str | None)]
        self.save_hyperparameters(ignore=["reward_funcs", "optimizer", "rollout_engine", *objects])
        restorable = import_paths(reward_funcs or [])
        if restorable:  # by import path, so that load_from_checkpoint(path) imports them again
            self.hparams["reward_funcs"] = restorable
        self.hparams.update({name: dataclasses.asdict(settings[name]) for name in SECTIONS})  # plain values
        self.automatic_optimization = False
        self.optimizer_factory = optimizer
        self.engine = engine
        self.sampling, self.loss_config = settings["sampling"], settings["loss"]
        self.advantage_config, self.optim_config = settings["advantages"], settings["optim"]
        self.target_settings = TargetSettings(
            reference=self.loss_config.beta > 0 or self.advantage_config.kl_coef > 0,
            num_iterations=num_iterations,
            steps_per_generation=steps_per_generation,
            mask_truncated_completions=mask_truncated_completions,
            micro_batch_size=micro_batch_size,
            max_completion_length=self.sampling.max_completion_length,
            sampling_correction=sampling_correction,
            sampling_correction_max=sampling_correction_max,
        )
        self.policy = Policy(
            model,
            tokenizer,
            dtype,
            load_in_4bit,
            peft_config,
            gradient_checkpointing,
            reference=self.target_settings.reference,
            temperature=self.sampling.temperature,
            logprob_chunk_size=logprob_chunk_size,
            shared_prefix=share_prompt_prefix,
            init_kwargs=model_init_kwargs,
            disable_dropout=disable_dropout,
        )
        self.entropy = EntropyController.from_config(self.loss_config)
        self.router_aux_coef = router_aux_coef(self.policy.model.config, self.loss_config.router_aux_loss_coef)
        self.group_buffer = GroupBuffer(self.policy.tokenizer.pad_token_id)
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
            self._seed(self._step_seed())
            return self._training_step(batch)

    def _training_step(self, batch: PromptBatch) -> dict[str, Any] | None:
        start, ranks = time.perf_counter(), Ranks(self.trainer)
        rollout = self.sample(batch.prompts, self.hparams.num_generations, columns=batch.columns)  # seeded RNG
        kept = self._filter_groups(rollout, self._score(rollout, batch), len(batch), ranks)
        if kept is None:  # filter_groups: no update this batch, waiting for more groups with signal
            return None
        rollout, scores, extra = kept
        all_scores = ranks.gather_rows(scores.per_function)  # [W*N, F] identical on every rank: a batch std is global
        if all_scores.isinf().any():  # NaN rewards are "not applicable"
            return self._skip_step("rewards are infinite")
        targets = build_targets(self.policy, rollout, self.target_settings, ranks)
        targets = targets.with_advantages(self._advantages(all_scores, scores.weights, rollout, targets, ranks))
        if not targets.advantages.isfinite().all():
            return self._skip_step("advantages are infinite or NaN")
        loss = self._update(rollout, targets, ranks)
        if loss is None:
            return self._skip_step("gradients are infinite or NaN")
        self.engine.sync_weights(self.policy)
        self.bad_steps_in_a_row = 0
        self.num_tokens_seen += int(ranks.sum(rollout.attention_mask.sum()))
        stats = self._step_stats(rollout, scores, all_scores, targets, loss, ranks, start, extra)
        self._log_step(stats)
        return {
            "loss": torch.tensor(stats.update.loss),
            "record": StepRecord(rollout, scores, targets.advantages, stats),
        }

    def _filter_groups(
        self, rollout: Rollout, scores: RewardScores, num_prompts: int, ranks: Ranks
    ) -> tuple[Rollout, RewardScores, dict[str, float]] | None:
        """The rollout to train on, with its scores and metrics; with ``filter_groups``, the groups with signal
        gathered over batches, ``None`` while too few have come."""
        if not self.advantage_config.filter_groups:
            return rollout, scores, {}
        buffer, cap = self.group_buffer, self.advantage_config.max_num_gen_batches
        filtered = buffer.next_update(rollout, scores, num_prompts, ranks, cap, self.global_step)
        if filtered is None and buffer.num_gen_batches:
            self.log("train/filter_groups/num_gen_batches", float(buffer.num_gen_batches), batch_size=1)
        return filtered

    def _update(self, rollout: Rollout, targets: Targets, ranks: Ranks) -> LossOutput | None:
        """``num_iterations`` passes over the generation batch's optimiser steps; the last step's loss, ``None``
        when one had gradients that are not finite (and was not taken)."""
        steps = optimiser_steps(targets, self.hparams.num_generations, self.target_settings, ranks)
        loss = None
        for _ in range(self.hparams.num_iterations):
            for step in steps:
                loss = self._optimizer_step(rollout, targets, step)
                if loss is None:
                    return None
        return loss

    def _step_stats(
        self,
        rollout: Rollout,
        scores: RewardScores,
        all_scores: Tensor,
        targets: Targets,
        loss: LossOutput,
        ranks: Ranks,
        start: float,
        extra: dict[str, float],
    ) -> StepStats:
        return StepStats(
            rewards=reward_stats(all_scores, scores.weights, scores.names, rollout.group_size, self.accuracy_reward),
            lengths=length_stats(*ranks.lengths(rollout)),
            update=update_stats(
                ranks.loss(loss),
                targets.sampling_weights,
                targets.mask,
                self.loss_config.top_entropy_quantile < 1,
                self.grad_norm.item(),
            ),
            num_tokens=self.num_tokens_seen,
            learning_rate=self.optimizers().param_groups[0]["lr"],
            skipped_steps=self.skipped_steps,
            truncated_prompts=rollout.num_truncated_prompts,
            step_time=time.perf_counter() - start,
            reward_errors=scores.errors,
            extra={**rollout.metrics, **scores.metrics, **extra, **self._entropy_metrics()},
        )

    def _advantages(
        self, all_scores: Tensor, weights: Tensor, rollout: Rollout, targets: Targets, ranks: Ranks
    ) -> Tensor:
        """This rank's advantages from every rank's rewards ([N], or [N, T] for REINFORCE++'s token returns)."""
        a, tokens = self.advantage_config, None
        if a.token_level:  # batch whitening is global: every rank's tokens are gathered
            kl = None
            if a.kl_coef > 0:
                old = targets.old_logps
                if old is None:
                    old = self.policy.logps(rollout, targets.micro_batches)
                kl = kl_penalty(old, targets.ref_logps)
            mask, kl = ranks.gather_padded(targets.mask), None if kl is None else ranks.gather_padded(kl)
            tokens = TokenRewards(mask, kl, a.kl_coef, a.gamma)
        out = multi_objective_advantages(
            all_scores,
            weights.to(all_scores),
            self.hparams.num_generations,
            a.multi_objective_aggregation,
            a.scale_rewards,
            a.adv_estimator,
            tokens,
        ).advantages
        out = ranks.own_rows(out)
        return out[:, : targets.mask.shape[1]] if out.ndim == 2 else out

    def _entropy_metrics(self) -> dict[str, float]:
        return {"entropy_coef": self.entropy.coef} if self.entropy.enabled else {}

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
                self._seed(seed)
            return self.engine.generate(self.policy, prompts, num_generations, self.sampling, greedy, columns=columns)

    def _score(self, rollout: Rollout, batch: PromptBatch) -> RewardScores:
        hp = self.hparams
        state = trl_trainer_state(self.global_step, self.trainer.max_steps, self.current_epoch)  # as TRL passes it
        return score_rollout(
            self.reward_funcs, self.reward_weights, rollout, batch.columns, hp.on_reward_error, hp.reward_timeout, state
        )

    def _cuda_devices(self) -> list[torch.device]:
        return [self.device] if self.device.type == "cuda" else []

    def _seed(self, seed: int) -> None:
        """Seeds the CPU generator and this module's GPU's: what ``fork_rng`` restores. (``torch.manual_seed``
        also seeds every other accelerator type lazily, formatting a stack trace each time: ~0.5 ms a step.)"""
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed)

    def _step_seed(self) -> int:
        waited = self.group_buffer.num_gen_batches  # filter_groups: batches drawn without an update yet
        return (self.hparams.seed * 1_000_003 + self.global_rank * 7_919 + self.global_step + waited * 104_729) % 2**63

    def _optimizer_step(self, rollout: Rollout, targets: Targets, step: OptimiserStep) -> LossOutput | None:
        """One optimiser step over ``step``'s rows, gradients accumulated across micro-batches; ``None`` when the
        gradients are not finite and the step was not taken."""
        optimizer = self.optimizers()
        optimizer.zero_grad()
        total: LossOutput | None = None
        for rows in step.micro_batches:
            token = self.policy.token_logps(
                rollout, rows, router_aux=self.router_aux_coef != 0, entropy_grad=self.entropy.enabled
            )
            out = grpo_loss(
                token.logps,
                rows_of(targets.old_logps, rows),
                targets.advantages[rows],
                targets.mask[rows],
                self.loss_config,
                ref_logps=rows_of(targets.ref_logps, rows),
                normalizer=step.normalizer,
                sampling_weights=rows_of(targets.sampling_weights, rows),
                entropies=token.entropy,
                entropy_coef=self.entropy.coef_to_apply(),
            )
            loss = out.loss
            if token.aux_loss is not None:  # weighted by the micro-batch's share, so micro-batching changes nothing
                loss = loss + self.router_aux_coef * token.aux_loss * len(token.logps) / step.normalizer.num_sequences
            self.manual_backward(loss)
            self.entropy.observe(out.trained_entropy, out.trained_tokens)
            out = dataclasses.replace(out, loss=out.loss.detach())
            total = out if total is None else total + out
        # fp16 AMP: gradients are unscaled inside optimizer.step (clipped there, in on_before_optimizer_step), and
        # the GradScaler skips steps with overflowing gradients and lowers its scale by itself
        if self._grad_scaler() is None and not self._clip_gradients().isfinite():
            optimizer.zero_grad()
            return None
        optimizer.step()
        self.lr_schedulers().step()
        self.entropy.update(Ranks(self.trainer).sum)  # the adaptive bonus moves once per optimiser step
        if self.hparams.sync_ref_model and self.global_step % self.hparams.ref_model_sync_steps == 0:
            self.policy.sync_reference(self.hparams.ref_model_mixup_alpha)  # TR-DPO, as TRL's callback
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
        self.grad_norm = clip_gradients(self.policy.trainable_parameters(), self.optim_config.max_grad_norm, root)
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
        """Every metric on the steps the loggers write; on the others, the monitored and progress-bar ones."""
        log_train_metrics(self, {f"train/{k}": v for k, v in stats.metrics().items()}, PROGRESS_BAR)

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
        """Per held-out prompt one greedy completion, or ``num_generations_eval`` sampled ones: mean reward,
        per-function means, accuracy, and with several samples pass@k / mean@k of the accuracy reward."""
        k = self.hparams.num_generations_eval
        rollout = self.sample(batch.prompts, num_generations=k or 1, greedy=k is None, columns=batch.columns)
        metrics = eval_metrics(self._score(rollout, batch), rollout, self.accuracy_reward, k)
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
        else:
            self.policy.materialize()  # built on the meta device: whole weights from the files

    def _attached_trainer(self) -> L.Trainer | None:
        try:
            return self.trainer
        except RuntimeError:  # not attached to a Trainer
            return None

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        hp, o = self.hparams, self.optim_config
        groups = param_groups(self.policy.model, o.weight_decay)  # no decay on biases, norms, embeddings
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(groups)
        else:
            # Fused: one kernel over all parameters (on CPU ~10x faster than the per-tensor loop); FSDP2's
            # sharded DTensor parameters, and fp16 AMP (it unscales before clipping), take the default one.
            params = self.policy.trainable_parameters()
            fused = not any(isinstance(p, DTensor) for p in params) and self._grad_scaler() is None
            optimizer = torch.optim.AdamW(groups, lr=o.learning_rate, fused=fused)
        steps = self.trainer.estimated_stepping_batches
        if self.trainer.max_steps == -1:  # counted in batches; each takes num_iterations * steps_per_generation
            steps *= hp.num_iterations * hp.steps_per_generation
        schedule = scheduler(optimizer, o, steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["grpo_counters"] = {"num_tokens_seen": self.num_tokens_seen, "skipped_steps": self.skipped_steps}
        checkpoint["entropy_controller"] = self.entropy.state_dict()

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        counters = checkpoint.get("grpo_counters", {})
        self.num_tokens_seen = counters.get("num_tokens_seen", 0)
        self.skipped_steps = counters.get("skipped_steps", 0)
        if "entropy_controller" in checkpoint:
            self.entropy.load_state_dict(checkpoint["entropy_controller"])

    def save_pretrained(self, path: str, merged: bool = False) -> None:
        """The policy and tokenizer in Hugging Face format: ``AutoModelForCausalLM.from_pretrained(path)``.

        Every rank calls it; global rank 0 writes. A LoRA policy writes its adapter
        (``PeftModel.from_pretrained(base, path)``) and, with ``merged``, the merged model (base + adapter in
        full weights) in ``path/merged``. An FSDP2-sharded policy is gathered first (a collective).
        """
        self.policy.save_pretrained(path, self.global_rank == 0, merged)
