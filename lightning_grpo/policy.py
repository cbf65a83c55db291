"""A model name or object -> the Policy: the trained LM, its frozen reference and its tokenizer, and every
question about them (LoRA, 4-bit, gradient checkpointing, sharding, log-probs, checkpoint contents, export).

Knows models, PEFT and FSDP2; nothing about rewards, losses or the training loop. Callers ask it ("reference
log-probs of these rows"), they never test ``peft_config`` or the strategy themselves.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.logprobs import TokenLogps, completion_logps
from lightning_grpo.models import load_policy, load_tokenizer, with_lora
from lightning_grpo.sharding import LOGPS_METHOD, full_state_dict, is_sharded, shard_causal_lm
from lightning_grpo.types import Rollout

REFERENCE = "reference."  # state-dict prefix of the frozen copy inside the Policy


class Policy(nn.Module):
    """The policy LM under training, with what GRPO needs around it.

    The frozen reference (``beta > 0`` without LoRA) is a registered submodule, so it moves with the policy
    to its device and is sharded with it, but it is left out of the optimiser (``trainable_parameters``) and
    out of checkpoints (``checkpoint_state``): it is the initial policy, rebuilt from ``model`` on resume.
    Under LoRA there is no copy: the reference is the policy with its adapter disabled.

    Args:
        model: Hugging Face name or local path (``AutoModelForCausalLM``), or a built model.
        tokenizer: name, path or tokenizer; defaults to ``model``'s.
        dtype: weights dtype when loading by name.
        load_in_4bit: QLoRA's NF4 base weights (bitsandbytes, CUDA) under the ``peft_config`` adapter.
        peft_config: ``peft.LoraConfig`` arguments: only the adapter trains.
        gradient_checkpointing: recompute activations in the backward pass (off while generating).
        reference: keep the initial policy for a KL penalty.
        temperature: the sampling temperature; log-probs are computed from logits divided by it.
        logprob_chunk_size: token positions per LM-head chunk (``None``: ~32M logits a chunk).
        shared_prefix: in the log-prob forward, encode each group's shared prompt once (Prefix Grouper,
            ``lightning_grpo.prefix``): equal values and gradients, P + G * T token positions a group instead of
            G * (P + T). Not with gradient checkpointing or FSDP2 sharding.
    """

    def __init__(
        self,
        model: str | nn.Module,
        tokenizer: str | PreTrainedTokenizerBase | None = None,
        dtype: str = "float32",
        load_in_4bit: bool = False,
        peft_config: dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        reference: bool = False,
        temperature: float = 1.0,
        logprob_chunk_size: int | None = None,
        shared_prefix: bool = False,
    ) -> None:
        super().__init__()
        if shared_prefix and gradient_checkpointing:
            raise ValueError(
                "shared_prefix=True with gradient_checkpointing=True: checkpointed layers drop the KV cache that "
                "carries the shared prompt; turn one of them off"
            )
        self.name_or_path = model if isinstance(model, str) else None
        self.tokenizer = load_tokenizer(tokenizer if tokenizer is not None else model)
        self.model = load_policy(model, dtype, load_in_4bit).train()  # from_pretrained returns eval mode
        if gradient_checkpointing:
            _checkpointing(self.model, True)
        self.is_lora = peft_config is not None
        if self.is_lora:
            self.model = with_lora(self.model, peft_config)
        self.reference = _frozen_copy(self.model) if reference and not self.is_lora else None
        self.temperature, self.logprob_chunk_size = temperature, logprob_chunk_size
        self.shared_prefix = shared_prefix
        self.synced_generation = False  # set by shard(): every forward is a collective

    # ---- log-probs ----------------------------------------------------------------------------------------

    def token_logps(self, rollout: Rollout, rows: slice, model: nn.Module | None = None) -> TokenLogps:
        """[n, T] log-probs and entropies of ``rows``' completion tokens, with gradient when enabled."""
        model = self.model if model is None else model
        ids, mask, width = rollout.input_ids[rows], rollout.attention_mask[rows], rollout.completion_ids.shape[1]
        if is_sharded(model):
            return getattr(model, LOGPS_METHOD)(ids, mask, width, self.temperature, self.logprob_chunk_size)
        return completion_logps(
            model, ids, mask, width, self.temperature, self.logprob_chunk_size, shared_prefix=self.shared_prefix
        )

    @torch.no_grad()
    def logps(self, rollout: Rollout, micro_batches: list[slice]) -> Tensor:
        """[N, T] log-probs under the current weights, without gradient (the sampling policy's)."""
        return torch.cat([self.token_logps(rollout, rows).logps for rows in micro_batches])

    @torch.no_grad()
    def reference_logps(self, rollout: Rollout, micro_batches: list[slice]) -> Tensor:
        """[N, T] log-probs under the initial policy: the frozen copy, or the LoRA policy with its adapter off."""
        context = self.model.disable_adapter() if self.is_lora else contextlib.nullcontext()
        with context:
            return torch.cat([self.token_logps(rollout, rows, self.reference).logps for rows in micro_batches])

    # ---- generation ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def generating(self) -> Iterator[nn.Module]:
        """The model in eval mode, without gradient, gradient checkpointing off (it disables the KV cache);
        restored afterwards."""
        model = self.model
        was_training, checkpointing = model.training, _checkpointing(model)
        if checkpointing:
            _checkpointing(model, False)
        model.eval()
        try:
            with torch.no_grad():  # not inference_mode: it breaks sharded models
                yield model
        finally:
            model.train(was_training)
            if checkpointing:
                _checkpointing(model, True)

    @property
    def eos_token_ids(self) -> list[int]:
        """The tokenizer's EOS plus any the model's generation config declares (e.g. Qwen's ``<|im_end|>``)."""
        ids = {self.tokenizer.eos_token_id}
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(extra if isinstance(extra, list) else [extra] if extra is not None else [])
        return sorted(i for i in ids if i is not None)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---- training, sharding, checkpoints, export ----------------------------------------------------------

    def train(self, mode: bool = True) -> Policy:
        """Lightning puts every submodule in train mode; the reference stays in eval mode (no dropout)."""
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def shard(self, mesh: Any | None, world_size: int) -> None:
        """Shard over ``mesh`` with FSDP2 (``None``: the strategy shards the module itself, as FSDP1 does).
        Either way generation is then synced across ranks, so ranks that finish early keep stepping."""
        if mesh is not None:
            if self.shared_prefix:
                raise ValueError("shared_prefix=True with ModelParallelStrategy (FSDP2) is not supported yet")
            if self.is_lora:
                raise ValueError("peft_config (LoRA) with ModelParallelStrategy is not supported: use strategy ddp")
            shard_causal_lm(self.model, mesh)
            if self.reference is not None:
                shard_causal_lm(self.reference, mesh, frozen=True)
        self.synced_generation = world_size > 1

    def checkpoint_state(self, state: dict[str, Any], prefix: str) -> dict[str, Any]:
        """``state`` (the module's state dict) less what is rebuilt from ``model`` on load: the reference, and
        under LoRA the frozen base weights."""
        kept = {f"{prefix}model.{n}" for n, p in self.model.named_parameters() if p.requires_grad}
        own = f"{prefix}model."
        return {
            k: v
            for k, v in state.items()
            if not k.startswith(prefix + REFERENCE) and (not self.is_lora or k in kept or not k.startswith(own))
        }

    def restore_state(self, saved: dict[str, Any], prefix: str) -> dict[str, Any]:
        """``saved`` completed with the current values of what ``checkpoint_state`` left out, so that strict
        loading still catches a checkpoint that lacks weights that train."""
        current = {f"{prefix}{k}": v for k, v in self.state_dict().items()}
        left_out = current.keys() - self.checkpoint_state(current, prefix).keys()
        return {**{k: current[k] for k in left_out}, **saved}

    def save_pretrained(self, path: str, is_global_zero: bool) -> None:
        """Hugging Face format (``AutoModelForCausalLM.from_pretrained(path)``). Every rank calls it: a sharded
        policy is gathered first (a collective); rank 0 writes. A LoRA policy is saved merged, from a copy."""
        model, state = self.model, None
        if is_sharded(model):
            state = full_state_dict(model)
        elif self.is_lora and is_global_zero:
            model = copy.deepcopy(model).merge_and_unload()
        if is_global_zero:
            model.save_pretrained(path, state_dict=state)
            self.tokenizer.save_pretrained(path)


def _frozen_copy(model: nn.Module) -> nn.Module:
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


def _checkpointing(model: nn.Module, enable: bool | None = None) -> bool:
    """Whether activation checkpointing is on; ``enable`` switches it. transformers 5 renamed the methods
    (``activation_checkpointing_*``) and warns on the old names, which older versions only have."""
    new = hasattr(model, "activation_checkpointing_enable")
    if enable is True:
        kwargs = {"use_reentrant": False}
        if new:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif enable is False:
        (model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable)()
    return bool(getattr(model, "is_activation_checkpointing" if new else "is_gradient_checkpointing", False))
