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

from lightning_grpo.model.loading import (
    DTYPES,
    empty_init_files,
    load_policy,
    load_tokenizer,
    resolve_pretrained,
    with_lora,
)
from lightning_grpo.model.logprobs import TokenLogps, completion_logps
from lightning_grpo.model.materialize import empty_causal_lm, is_empty, load_weights, materialize_lora_adapters
from lightning_grpo.model.sharding import LOGPS_METHOD, full_state_dict, is_sharded, shard_causal_lm
from lightning_grpo.types import Rollout

REFERENCE = "reference."  # state-dict prefix of the frozen copy inside the Policy


class Policy(nn.Module):
    """The policy LM under training, with what GRPO needs around it.

    The frozen reference (``beta > 0`` without LoRA) is a registered submodule, so it moves with the policy
    to its device and is sharded with it, but it is left out of the optimiser (``trainable_parameters``) and
    out of the state dict, so of checkpoints (``left_out``): it is the initial policy, rebuilt from ``model``.
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
            ``lightning_grpo.model.prefix``): equal values and gradients, P + G * T token positions a group instead of
            G * (P + T). Not with gradient checkpointing.
        init_kwargs: more ``from_pretrained`` arguments (TRL's ``model_init_kwargs``).
        disable_dropout: set every dropout probability of the policy (and reference) to 0, as TRL's option does.
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
        init_kwargs: dict[str, Any] | None = None,
        disable_dropout: bool = False,
    ) -> None:
        super().__init__()
        if shared_prefix and gradient_checkpointing:
            raise ValueError(
                "shared_prefix=True with gradient_checkpointing=True: checkpointed layers drop the KV cache that "
                "carries the shared prompt; turn one of them off"
            )
        self.name_or_path = model if isinstance(model, str) else None
        self.tokenizer = load_tokenizer(tokenizer if tokenizer is not None else model)
        self.weight_files = empty_init_files(model, load_in_4bit)  # none unless built on the meta device
        if self.weight_files:
            self.model = empty_causal_lm(resolve_pretrained(model), DTYPES[dtype], init_kwargs).train()
        else:
            self.model = load_policy(model, dtype, load_in_4bit, init_kwargs).train()  # from_pretrained: eval mode
        if disable_dropout:
            _disable_dropout(self.model)
        if gradient_checkpointing:
            _checkpointing(self.model, True)
        self.is_lora = peft_config is not None
        rng = torch.get_rng_state()
        if self.is_lora:
            self.model = with_lora(self.model, peft_config)
        # values made before the weights are loaded (an adapter's initialisation), kept through materialize()
        self.real_tensors = materialize_lora_adapters(self.model, rng) if self.weight_files and self.is_lora else {}
        self.reference = _frozen_copy(self.model) if reference and not self.is_lora else None
        self.temperature, self.logprob_chunk_size = temperature, logprob_chunk_size
        self.shared_prefix = shared_prefix
        self.synced_generation = False  # set by shard(): every forward is a collective
        self.register_state_dict_post_hook(_drop_left_out)
        self.register_load_state_dict_pre_hook(_fill_left_out)

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
        ``router_aux``: with the MoE load-balancing loss; ``entropy_grad``: entropies with their gradient."""
        model = self.model if model is None else model
        ids, mask, width = rollout.input_ids[rows], rollout.attention_mask[rows], rollout.completion_ids.shape[1]
        options = {"router_aux": router_aux, "entropy_grad": entropy_grad, "shared_prefix": self.shared_prefix}
        if is_sharded(model):  # FSDP2 gathers each layer around each of its calls: the prompt pass, then the rest
            return getattr(model, LOGPS_METHOD)(ids, mask, width, self.temperature, self.logprob_chunk_size, **options)
        return completion_logps(model, ids, mask, width, self.temperature, self.logprob_chunk_size, **options)

    @torch.no_grad()
    def logps(self, rollout: Rollout, micro_batches: list[slice]) -> Tensor:
        """[N, T] log-probs under the current weights, without gradient (the sampling policy's)."""
        return torch.cat([self.token_logps(rollout, rows).logps for rows in micro_batches])

    @torch.no_grad()
    def reference_logps(self, rollout: Rollout, micro_batches: list[slice]) -> Tensor:
        """[N, T] log-probs under the initial policy: the frozen copy, or the LoRA policy with its adapter off."""
        context = self.model.disable_adapter() if self.is_lora else _eval_mode(self.reference)
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

    @torch.no_grad()
    def sync_reference(self, alpha: float) -> None:
        """TR-DPO's reference update (TRL's ``sync_ref_model``): ``reference = alpha * policy + (1 - alpha) *
        reference``, parameter by parameter (shard by shard under FSDP2)."""
        if self.reference is None:
            raise ValueError("sync_reference needs a reference copy: loss.beta > 0 without LoRA")
        for ref, param in zip(self.reference.parameters(), self.model.parameters(), strict=True):
            ref.mul_(1.0 - alpha).add_(param.detach().to(ref.dtype), alpha=alpha)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def shard(self, mesh: Any | None, world_size: int) -> None:
        """Shard over ``mesh`` with FSDP2 (``None``: the strategy shards the module itself, as FSDP1 does).
        Either way generation is then synced across ranks, so ranks that finish early keep stepping."""
        if mesh is not None:
            shard_causal_lm(self.model, mesh)  # under LoRA the frozen base is sharded too; the adapter trains
            if self.reference is not None:
                shard_causal_lm(self.reference, mesh, frozen=True)
        self.synced_generation = world_size > 1
        self.materialize()  # after sharding: each rank reads only its own rows

    def materialize(self) -> None:
        """Load the weights of a policy built on the meta device (Lightning's ``trainer.init_module(empty_init=True)``
        under FSDP2) from its checkpoint files: each rank's own shards once ``shard`` has run, else whole tensors.
        A no-op for a policy that has its weights."""
        for model in (self.model, self.reference):
            if model is not None and is_empty(model):
                load_weights(model, self.weight_files, self.real_tensors)
        self.real_tensors = {}

    def left_out(self) -> Iterator[tuple[str, Tensor]]:
        """(name, tensor) of what the Policy's state dict leaves out because it is rebuilt from ``model``: the
        reference, and under LoRA the frozen base weights. Every checkpoint (a ``.ckpt`` file or a distributed
        checkpoint directory, whose shards Lightning reads straight into ``state_dict()``'s keys) follows."""
        if self.reference is not None:
            yield from ((REFERENCE + n, t) for n, t in self.reference.state_dict(keep_vars=True).items())
        if self.is_lora:
            yield from (
                ("model." + n, t) for n, t in self.model.state_dict(keep_vars=True).items() if not t.requires_grad
            )

    def save_pretrained(self, path: str, is_global_zero: bool, merged: bool = False) -> None:
        """Hugging Face format. Every rank calls it: a sharded policy is gathered first (a collective); rank 0
        writes. A full model: ``AutoModelForCausalLM.from_pretrained(path)``. A LoRA policy: its adapter, as TRL
        and PEFT save it (``PeftModel.from_pretrained(base, path)``), and with ``merged`` also the merged model
        (base + adapter in full weights, from a copy: training can go on) in ``path/merged``."""
        model, state = self.model, None
        if is_sharded(model):
            state = full_state_dict(model)
        if not is_global_zero:
            return
        model.save_pretrained(path, state_dict=state)
        self.tokenizer.save_pretrained(path)
        if self.is_lora and merged:
            whole = _merged_lora(model, state) if state is not None else copy.deepcopy(model).merge_and_unload()
            whole.save_pretrained(f"{path}/merged")
            self.tokenizer.save_pretrained(f"{path}/merged")


def _disable_dropout(model: nn.Module) -> None:
    """Every ``nn.Dropout`` to p = 0, as TRL's ``disable_dropout_in_model``; also attention dropout, which
    Hugging Face attention layers keep as a float attribute (``attention_dropout``) rather than a module."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


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


def _drop_left_out(policy: Policy, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    for name, _ in policy.left_out():
        state.pop(prefix + name, None)


def _fill_left_out(policy: Policy, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """Loading puts the current values back in place of what was left out, so strict loading still catches a
    checkpoint that lacks weights that train."""
    for name, tensor in policy.left_out():
        state.setdefault(prefix + name, tensor.detach())


def _merged_lora(sharded: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    """An unsharded LoRA model built on the meta device, given ``state`` (the gathered weights, no second copy),
    then merged: base + adapter as plain weights."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(copy.deepcopy(sharded.get_base_model().config))
        model = get_peft_model(base, sharded.peft_config[sharded.active_adapter])
    model.load_state_dict(state, assign=True)
    base.tie_weights()  # assign=True loaded a tied embedding and LM head as two tensors (PEFT would untie them)
    return model.merge_and_unload()


def _frozen_copy(model: nn.Module) -> nn.Module:
    reference = copy.deepcopy(model)
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
