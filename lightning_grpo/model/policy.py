"""A model name or object -> the Policy: the trained LM, its frozen reference and its tokenizer, and every
question about them (LoRA, 4-bit, gradient checkpointing, log-probs, export; sharding and checkpoint contents:
``model/weights.py``).

Knows models, PEFT and FSDP2; nothing about rewards, losses or the training loop. Callers ask it ("reference
log-probs of these rows"), they never test ``peft_config`` or the strategy themselves.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
from collections.abc import Iterator

import torch
from lightning.pytorch.strategies import FSDPStrategy, Strategy
from torch import Tensor, nn

from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.export import save_hf
from lightning_grpo.model.loading import (
    DTYPES,
    checkpointing,
    disable_dropout,
    empty_init_files,
    frozen_copy,
    load_policy,
    load_tokenizer,
    resolve_pretrained,
    with_lora,
)
from lightning_grpo.model.logprobs import TokenLogps, completion_logps, in_row_order, router_aux_coef
from lightning_grpo.model.materialize import empty_causal_lm, materialize_lora_adapters
from lightning_grpo.model.padding import packing_problem, row_plan
from lightning_grpo.model.prefix import has_sliding_window
from lightning_grpo.model.served_teacher import ServedTeacher
from lightning_grpo.model.sharding import LOGPS_METHOD, clip_gradients, is_sharded
from lightning_grpo.model.teacher import TeacherModel, completion_logits, frozen_logits, load_teacher
from lightning_grpo.model.vision import (
    check_multimodal,
    freeze_vision_tower,
    is_multimodal,
    is_processor,
    lora_layout,
    modality_problem,
    policy_processor,
    vision_token_ids,
)
from lightning_grpo.model.weights import PolicyWeights, drop_left_out, fill_left_out
from lightning_grpo.types import Rollout


class Policy(nn.Module, PolicyWeights):
    """The policy LM under training, with what GRPO needs around it.

    The frozen reference (``beta > 0`` without LoRA) is a registered submodule, so it moves with the policy
    to its device and is sharded with it, but it is left out of the optimiser (``trainable_parameters``) and
    out of the state dict, so of checkpoints (``left_out``): it is the initial policy, rebuilt from ``model``.
    Under LoRA there is no copy: the reference is the policy with its adapter disabled.

    Args:
        model: Hugging Face name, local path or GGUF file (``AutoModelForCausalLM``), or a built model.
        config: the ``policy:`` settings (tokenizer, dtype, LoRA, 4-bit, checkpointing, log-prob chunks,
            shared-prompt forward, TR-DPO).
        reference: keep the initial policy for a KL penalty.
        temperature: the sampling temperature; log-probs are computed from logits divided by it.
        router_aux_loss_coef: weight of a Mixture-of-Experts model's load-balancing loss (``None``: the model
            config's, as TRL resolves it).
        teacher: a frozen teacher for on-policy distillation, held like the reference (moved and sharded with the
            policy, left out of the optimiser and of checkpoints); refused when its tokenizer differs.
    """

    def __init__(
        self,
        model: str | nn.Module,
        config: PolicyConfig = PolicyConfig(),
        reference: bool = False,
        temperature: float = 1.0,
        router_aux_loss_coef: float | None = None,
        teacher: TeacherModel | None = None,
    ) -> None:
        super().__init__()
        c = self.config = config
        model = c.source(model)  # a folder with policy.gguf_file: that file
        self.name_or_path = model if isinstance(model, str) else None
        self.weight_files = empty_init_files(model, c.load_in_4bit)  # none unless built on the meta device
        self.model = self._load(model)
        self.is_multimodal = is_multimodal(self.model)
        if not self.is_multimodal and (problem := packing_problem(c.padding_free, self.model.config)):
            raise ValueError(problem)
        if self.is_multimodal and (problem := modality_problem(self.model)):
            raise ValueError(problem)
        source = c.tokenizer if c.tokenizer is not None else model
        self.processor = policy_processor(source) if self.is_multimodal or is_processor(source) else None
        """The vision-language model's processor (images -> vision inputs, prompts -> ids with image tokens)."""
        self.tokenizer = load_tokenizer(self.processor.tokenizer if self.processor is not None else source)
        self.is_lora = c.peft_config is not None
        self._prepare(with_teacher=teacher is not None)
        self.reference = frozen_copy(self.model) if reference and not self.is_lora else None
        self._hold_teacher(teacher)
        if c.sync_ref_model and self.reference is None:
            raise ValueError("policy.sync_ref_model=True updates a reference copy: it needs loss.beta > 0")
        self.temperature = temperature
        self.router_aux_coef = router_aux_coef(self.model.config, router_aux_loss_coef)
        self.synced_generation = False  # set by shard(): every forward is a collective
        self.register_state_dict_post_hook(drop_left_out)
        self.register_load_state_dict_pre_hook(fill_left_out)

    def _load(self, model: str | nn.Module) -> nn.Module:
        """The trained model in train mode: built empty on the meta device where ``weight_files`` are loaded later
        (``materialize``), else loaded now (``from_pretrained`` returns eval mode)."""
        c = self.config
        if self.weight_files:
            return empty_causal_lm(resolve_pretrained(model), DTYPES[c.dtype], c.model_init_kwargs).train()
        return load_policy(model, c.dtype, c.load_in_4bit, c.model_init_kwargs).train()

    def _prepare(self, with_teacher: bool) -> None:
        """The model made ready to train as ``policy:`` asks, in this order: dropout off, gradient checkpointing,
        a vision-language model checked and its vision tower frozen, the LoRA adapter wrapped around it."""
        c = self.config
        if c.disable_dropout:
            disable_dropout(self.model)
        if c.gradient_checkpointing:
            checkpointing(self.model, True)
        if self.is_multimodal:
            check_multimodal(c, with_teacher)
            if c.freeze_vision_tower:
                freeze_vision_tower(self.model)
        rng = torch.get_rng_state()
        if self.is_lora:
            layout = lora_layout(self.model, c.lora_vision_tower, c.freeze_vision_tower) if self.is_multimodal else ()
            self.model = with_lora(self.model, c.peft_config, *layout)
        # values made before the weights are loaded (an adapter's initialisation), kept through materialize()
        self.real_tensors = materialize_lora_adapters(self.model, rng) if self.weight_files and self.is_lora else {}

    def _hold_teacher(self, teacher: TeacherModel | None) -> None:
        """The distillation teacher, its tokenizer checked against the policy's: a model held as a submodule
        (``teacher``, loaded from ``teacher_files`` where built empty), or a server asked over HTTP
        (``served_teacher``)."""
        teacher, self.teacher_files = load_teacher(teacher, self.tokenizer, self.model) if teacher else (None, [])
        self.served_teacher = teacher if isinstance(teacher, ServedTeacher) else None  # the teacher on a server
        self.teacher = None if self.served_teacher else teacher

    # ---- log-probs ----------------------------------------------------------------------------------------

    def token_logps(
        self,
        rollout: Rollout,
        rows: slice | Tensor,
        model: nn.Module | None = None,
        router_aux: bool = False,
        entropy_grad: bool = False,
    ) -> TokenLogps:
        """[n, T] log-probs and entropies of ``rows``' completion tokens, with gradient when enabled;
        ``router_aux``: with the MoE load-balancing loss (see ``aux_loss``); ``entropy_grad``: entropies with
        their gradient."""
        model = self.model if model is None else model
        ids, mask, width = rollout.input_ids[rows], rollout.attention_mask[rows], rollout.completion_ids.shape[1]
        shared_prefix, padding_free = self._layout(model)
        options = {
            "router_aux": router_aux,
            "entropy_grad": entropy_grad,
            "shared_prefix": shared_prefix,
            "padding_free": padding_free,
            "plan": row_plan(rollout.host, rows),  # a micro-batch's indices are a plan made on the host
        }
        chunk = self.config.logprob_chunk_size
        if self.is_multimodal:  # text-only rows too: the multimodal forward, every trainable weight in the graph
            options["vision"] = rollout.vision_inputs(rows)
        if is_sharded(model):  # FSDP2 gathers each layer around each of its calls: the prompt pass, then the rest
            return getattr(model, LOGPS_METHOD)(ids, mask, width, self.temperature, chunk, **options)
        return completion_logps(model, ids, mask, width, self.temperature, chunk, **options)

    @torch.no_grad()
    def logps(self, rollout: Rollout, micro_batches: list[slice] | list[Tensor]) -> Tensor:
        """[N, T] log-probs under the current weights, without gradient (the sampling policy's)."""
        return in_row_order(micro_batches, lambda rows: self.token_logps(rollout, rows).logps)

    @torch.no_grad()
    def reference_logps(self, rollout: Rollout, micro_batches: list[slice] | list[Tensor]) -> Tensor:
        """[N, T] log-probs under the initial policy: the frozen copy, or the LoRA policy with its adapter off."""
        context = self.model.disable_adapter() if self.is_lora else _eval_mode(self.reference)
        with context:
            return in_row_order(micro_batches, lambda rows: self.token_logps(rollout, rows, self.reference).logps)

    @torch.no_grad()
    def teacher_logps(self, rollout: Rollout, micro_batches: list[slice] | list[Tensor]) -> Tensor:
        """[N, T] the teacher's log-probs of the sampled completion tokens, at the sampling temperature (its server's
        at temperature 1, the only one a served teacher allows)."""
        if self.served_teacher is not None:
            return self.served_teacher.logps(rollout)
        with _eval_mode(self.teacher):
            return in_row_order(micro_batches, lambda rows: self.token_logps(rollout, rows, self.teacher).logps)

    def distill_logits(self, rollout: Rollout, rows: slice | Tensor) -> tuple[Tensor, Tensor]:
        """([n, T, V] the student's logits at each completion position, with gradient; [n, T, V] the teacher's,
        without): the whole vocabulary, for GKD's divergence. A forward of each model besides the log-prob one."""
        ids, mask, width = rollout.input_ids[rows], rollout.attention_mask[rows], rollout.completion_ids.shape[1]
        return completion_logits(self.model, ids, mask, width), frozen_logits(self.teacher, ids, mask, width)

    @functools.cached_property
    def shares_prompt_prefix(self) -> bool:
        """Whether the log-prob forward encodes a group's prompt once: ``policy.share_prompt_prefix``, or, when it
        is ``None``, wherever that is exact: not under gradient checkpointing (it drops the prompt's cache), with
        a load-balancing loss (the prompt's router logits would count once) or sliding-window attention."""
        if self.config.share_prompt_prefix is not None:
            return self.config.share_prompt_prefix
        if self.is_multimodal:  # the prompt's images would have to be encoded once per group too: not done yet
            return False
        windowed = has_sliding_window(self.model.config)
        return not (self.config.gradient_checkpointing or self.router_aux_coef or windowed)

    def _layout(self, model: nn.Module) -> tuple[bool, bool]:
        """(shared prompt pass, padding-free packing) of a log-prob forward of ``model``: the policy's for it and its
        reference; for the teacher, what its own config allows (``teacher_layout``)."""
        return self.teacher_layout if model is self.teacher else (self.shares_prompt_prefix, self.config.padding_free)

    @functools.cached_property
    def teacher_layout(self) -> tuple[bool, bool]:
        """The policy's layout where it is exact for the teacher, whose attention may differ from the student's: a
        teacher with sliding-window layers beside a student without encodes each row's prompt itself (its cache
        drops prompt keys; packed, a shared prompt would be read past its window)."""
        return self.shares_prompt_prefix and not has_sliding_window(self.teacher.config), self.config.padding_free

    # ---- generation ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def generating(self) -> Iterator[nn.Module]:
        """The model in eval mode, without gradient, gradient checkpointing off (it disables the KV cache);
        restored afterwards."""
        model = self.model
        was_training, checkpointed = model.training, checkpointing(model)
        if checkpointed:
            checkpointing(model, False)
        model.eval()
        try:
            with torch.no_grad():  # not inference_mode: it breaks sharded models
                yield model
        finally:
            model.train(was_training)
            if checkpointed:
                checkpointing(model, True)

    @property
    def eos_token_ids(self) -> list[int]:
        """The tokenizer's EOS plus any the model's generation config declares (e.g. Qwen's ``<|im_end|>``)."""
        ids = {self.tokenizer.eos_token_id}
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(extra if isinstance(extra, list) else [extra] if extra is not None else [])
        return sorted(i for i in ids if i is not None)

    @property
    def unsampled_token_ids(self) -> list[int]:
        """Tokens generation must never draw: a vision-language model's image and video tokens (a completion
        holding one has no image to fill it); none for a text model."""
        return vision_token_ids(self.model.config) if self.is_multimodal else []

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def ranks_max(self, *values: float) -> list[float]:
        """Each value's largest over the ranks when every forward is a collective (``synced_generation``): what
        keeps their generate calls in step (a flag: whether any rank has rows left). One all-reduce, which every
        rank calls at the same point; the values as given otherwise."""
        if not (self.synced_generation and torch.distributed.is_available() and torch.distributed.is_initialized()):
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return t.tolist()

    # ---- training, export (placement and checkpoint contents: model/weights.py) ---------------------------

    @torch.no_grad()
    def sync_reference(self, alpha: float) -> None:
        """TR-DPO's reference update (TRL's ``sync_ref_model``): ``reference = alpha * policy + (1 - alpha) *
        reference``, parameter by parameter (shard by shard under FSDP2)."""
        if self.reference is None:
            raise ValueError("sync_reference needs a reference copy: loss.beta > 0 without LoRA")
        for ref, param in zip(self.reference.parameters(), self.model.parameters(), strict=True):
            ref.mul_(1.0 - alpha).add_(param.detach().to(ref.dtype), alpha=alpha)

    def without_models(self) -> Policy:
        """A shallow copy sharing the tokenizer and settings, holding neither the model (its new owner sets
        ``.model``) nor the frozen reference: what a sampling process needs (``engines/asynchronous/producer.py``). The
        submodule table is the copy's own, so setting its model leaves this policy's untouched. The state-dict
        hooks are left behind: each holds this policy, models and all, which pickling the copy would carry along
        to the sampling process; no generation is synced across ranks (the copy's model is its own)."""
        clone = copy.copy(self)
        clone._modules = {"model": None, "reference": None, "teacher": None}
        clone._state_dict_hooks, clone._load_state_dict_pre_hooks = collections.OrderedDict(), collections.OrderedDict()
        clone.synced_generation = False
        return clone

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def train_logps(self, rollout: Rollout, rows: slice | Tensor, entropy_grad: bool = False) -> TokenLogps:
        """``token_logps`` with gradient for a training micro-batch, with the MoE load-balancing loss when the
        model has one; its saved activations offloaded to CPU with ``activation_offload``."""
        with self._saved_activations():
            return self.token_logps(rollout, rows, router_aux=self.router_aux_coef != 0, entropy_grad=entropy_grad)

    def _saved_activations(self) -> contextlib.AbstractContextManager:
        """Where the training forward keeps what backward needs: CPU memory with ``activation_offload`` on a GPU
        (pinned, so the copies overlap compute), the forward's own device otherwise."""
        if not self.config.activation_offload or self.device.type == "cpu":
            return contextlib.nullcontext()
        return torch.autograd.graph.save_on_cpu(pin_memory=True)

    def aux_loss(self, token: TokenLogps, num_sequences: int) -> Tensor | float:
        """The MoE load-balancing term of a micro-batch's loss, weighted by its share of the ``num_sequences`` of
        the optimiser step, so micro-batching changes nothing; 0 for a dense model."""
        if token.aux_loss is None:
            return 0.0
        return self.router_aux_coef * token.aux_loss * len(token.logps) / num_sequences

    def clip_gradients(self, max_norm: float | None, strategy: Strategy) -> Tensor:
        """Clip to ``max_norm``; the pre-clip global gradient norm, the same on every rank (TRL's ``grad_norm``)."""
        root = strategy.model if isinstance(strategy, FSDPStrategy) else None  # FSDP1 clips at its root
        return clip_gradients(self.trainable_parameters(), max_norm, root)

    def after_optimizer_step(self, step: int) -> None:
        """TR-DPO (``sync_ref_model``): every ``ref_model_sync_steps`` optimiser steps, as TRL's callback."""
        c = self.config
        if c.sync_ref_model and step % c.ref_model_sync_steps == 0:
            self.sync_reference(c.ref_model_mixup_alpha)

    def save_pretrained(self, path: str, is_global_zero: bool, merged: bool = False) -> None:
        """Hugging Face format, with its processor or tokenizer (``export.save_hf``: a LoRA policy saves its adapter,
        and with ``merged`` the merged model too). Every rank calls it: a sharded policy is gathered first."""
        inputs = self.processor if self.processor is not None else self.tokenizer  # what reads the model's inputs
        save_hf(self.model, inputs, path, is_global_zero, merged and self.is_lora)


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """The frozen reference without dropout for its forward; it stays in Lightning's train mode otherwise
    (Lightning warns about modules left in eval mode at the start of training)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
