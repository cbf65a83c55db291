"""The ``policy:`` settings: how the policy is loaded, adapted and run. Checked once, here, before any weight loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.checks import raise_problems
from lightning_grpo.docstrings import field_help
from lightning_grpo.model.gguf import SUFFIX, with_gguf_file
from lightning_grpo.model.loading import DTYPES, cuda_package_problems


def _qlora_problems(load_in_4bit: bool, peft_config: dict | None) -> list[str]:
    problems = cuda_package_problems("bitsandbytes", "bitsandbytes 4-bit layers") if load_in_4bit else []
    return problems + (
        ["4-bit weights cannot train: give a peft_config adapter"] if load_in_4bit and not peft_config else []
    )


@field_help
@dataclass(frozen=True)
class PolicyConfig:
    """How the policy LM is loaded and run. ``policy:`` in YAML; the model itself is ``model.model``."""

    tokenizer: str | PreTrainedTokenizerBase | None = None
    """Name or path; defaults to the model's. In Python also a tokenizer, or a vision-language model's processor; a
    vision-language model loads its processor (``AutoProcessor``) from here."""
    gguf_file: str | None = None
    """A GGUF file in the folder ``model.model`` names (transformers' ``gguf_file``): the same as ``model:
    FOLDER/FILE.gguf``. Converted once to a float32 Hugging Face folder under ``LIGHTNING_GRPO_HOME/gguf/``, which every
    loader and engine then reads (``model/gguf.py``)."""
    dtype: Literal[tuple(DTYPES)] = "float32"
    """Weights dtype when loading by name: float32, bfloat16, float16 or auto."""
    model_init_kwargs: dict[str, Any] | None = None
    """More ``from_pretrained`` arguments (``{trust_remote_code: true, attn_implementation: sdpa}``)."""
    peft_config: dict[str, Any] | None = None
    """LoRA settings, ``peft.LoraConfig``'s arguments; only the adapter trains. E.g. ``{r: 16, lora_alpha: 32,
    target_modules: all-linear}``; the reference for ``loss.beta > 0`` is the policy with its adapter disabled (no
    second model in memory); checkpoints hold only the adapter."""
    load_in_4bit: bool = False
    """QLoRA: the base model in 4-bit NF4 under a ``peft_config`` adapter. bitsandbytes, CUDA; ``dtype`` is the
    compute dtype. Refused at config time where it cannot run."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (off while generating)."""
    activation_offload: bool = False
    """Activations saved for backward kept in CPU memory (pinned), not GPU memory; for long completions on one GPU.
    Copied back as backward needs them (``torch.autograd.graph.save_on_cpu``), at the cost of the copies. Composes
    with ``gradient_checkpointing`` (then only the checkpointed layers' inputs move: on an H100 that saved nothing
    measurable and made steps 8-27x slower, ``benchmarks/bench_long_context.py``; checkpointing alone is the better
    setting). Changes nothing on CPU."""
    disable_dropout: bool = False
    """Dropout off in the policy and reference (TRL's option; on-policy ratios are then exactly 1 for
    ``update.num_iterations > 1`` too)."""
    logprob_chunk_size: int | None = None
    """Token positions per LM-head chunk when computing log-probs; ``None`` sizes chunks to ~32M logits (128 MB in
    fp32): 220 positions at Qwen2.5's 151,936-token vocabulary."""
    share_prompt_prefix: bool | None = None
    """Encode each group's shared prompt once in the log-prob forward (Prefix Grouper); ``None``: where exact. The
    same log-probs and gradients for P + G * T token positions a group instead of G * (P + T). ``None`` (the
    default): on where it is exact, off with gradient checkpointing (it drops the prompt's cache), a
    Mixture-of-Experts load-balancing loss or sliding-window attention (``Policy.shares_prompt_prefix``)."""
    padding_free: bool = False
    """Pack the micro-batch's real tokens into one sequence for the log-prob forward. Each row keeps its own
    positions (``model/padding.py``); with ``share_prompt_prefix``, a group's prompt once and its completions after
    it. The same log-probs and gradients. Pays where lengths are uneven and attention is variable-length
    (flash-attention on GPU); sdpa and eager attention (CPU) compute the block-diagonal mask densely.
    ``share_prompt_prefix`` with it needs sdpa or eager attention. Rows are told apart by their positions, which
    Qwen2/3, Llama, Mistral, Mixtral, Phi, GPT-2, NeoX, Falcon and Gemma honour; other model types (OPT, BLOOM, MPT:
    packed rows attend to each other) are refused when the policy is built."""
    sync_ref_model: bool = False
    """TR-DPO: the reference moves towards the policy every ``ref_model_sync_steps`` optimiser steps. ``ref = alpha *
    policy + (1 - alpha) * ref`` (needs loss.beta > 0, no LoRA)."""
    ref_model_mixup_alpha: float = 0.6
    """TR-DPO's alpha."""
    ref_model_sync_steps: int = 512
    """Optimiser steps between reference updates."""
    freeze_vision_tower: bool = True
    """A vision-language model's vision encoder does not train (its projector and language model do); ``false`` trains
    it too, with a ``peft_config`` in full (PEFT's ``modules_to_save``) unless ``lora_vision_tower`` gives it adapters
    (``references/vision.md``)."""
    lora_vision_tower: bool = False
    """With a ``peft_config``, adapters go on the vision tower too; by default only on the language model (PEFT's
    ``exclude_modules``). The projector trains in full either way (``modules_to_save``)."""

    def source(self, model: str | nn.Module) -> str | nn.Module:
        """What ``model`` loads from: the GGUF file ``gguf_file`` inside it when that is set, else ``model`` itself."""
        return with_gguf_file(model, self.gguf_file)

    def __post_init__(self) -> None:
        qlora = _qlora_problems(self.load_in_4bit, self.peft_config)
        raise_problems(
            "policy",
            [
                (self.dtype in DTYPES, f"policy.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}"),
                (
                    self.logprob_chunk_size is None or self.logprob_chunk_size >= 1,
                    f"policy.logprob_chunk_size must be None or >= 1, got {self.logprob_chunk_size!r}",
                ),
                (not qlora, f"policy.load_in_4bit (QLoRA) cannot run: {'; '.join(qlora)}"),
                (
                    self.gguf_file is None or self.gguf_file.lower().endswith(SUFFIX),
                    f"policy.gguf_file must name a .gguf file in the model folder, got {self.gguf_file!r}",
                ),
                (
                    "gguf_file" not in (self.model_init_kwargs or {}),
                    "policy.model_init_kwargs sets gguf_file: set policy.gguf_file instead (the file is converted once "
                    "to a folder that every loader and engine reads)",
                ),
                (
                    not (self.share_prompt_prefix is True and self.gradient_checkpointing),
                    "policy.share_prompt_prefix=True with policy.gradient_checkpointing=True: checkpointed layers "
                    "drop the KV cache that carries the shared prompt; turn one of them off",
                ),
                (
                    0 <= self.ref_model_mixup_alpha <= 1,
                    f"policy.ref_model_mixup_alpha must be in [0, 1], got {self.ref_model_mixup_alpha!r}",
                ),
                (
                    self.ref_model_sync_steps >= 1,
                    f"policy.ref_model_sync_steps must be >= 1, got {self.ref_model_sync_steps!r}",
                ),
                (
                    not (self.sync_ref_model and self.peft_config),
                    "policy.sync_ref_model=True updates a reference copy: with a peft_config the reference is the "
                    "adapter switched off, so there is none to update; remove one of them",
                ),
            ],
        )
