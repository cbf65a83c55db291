"""Policy + token ids -> per-token log-probs and entropies of the completion tokens.

Knows the model's decoder and output head; nothing about rewards or losses. The LM head runs on chunks of
token positions, so the fp32 ``[N, T, vocab]`` logits never exist at once (for Qwen2.5's 151,936-token
vocabulary, 32 completions of 512 tokens would be 9.9 GB). For a plain linear head, ``LinearLogps`` computes a
chunk's log-probs and entropy in one pass and keeps only the hidden states and one log-normaliser per token
for the backward pass, which recomputes the chunk's logits once: no log-softmax, softmax or entropy tensors
are stored or recomputed. Other heads (soft-capped logits, a bias) run under activation checkpointing.

The model's own forward may transform the head's output; we apply what its config declares, as TRL 1.16's
``add_fused_lm_head`` reads it: a multiplier (``logit_scale`` Cohere, ``output_multiplier``,
``lm_head_multiplier`` Falcon-H1, ``logits_scaling`` HyperCLOVA X) or divisor (``logits_scaling`` Granite,
MiniCPM3), then Gemma's ``final_logit_softcapping``, then the sampling temperature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lightning_grpo.model.padding import (
    RowPlan,
    pack_rows,
    position_ids_from_mask,
    prepared_mask,
    takes_prepared_mask,
    trim_padding,
)
from lightning_grpo.model.prefix import shared_prefix_hidden
from lightning_grpo.model.vision import multimodal_hidden


@dataclass
class TokenLogps:
    logps: Tensor  # [n, T] log p(token) under temperature-scaled logits
    entropy: Tensor  # [n, T] entropy of the temperature-scaled distribution, detached unless entropy_grad
    aux_loss: Tensor | None = None  # scalar MoE load-balancing loss of this forward (``router_aux=True``)


AUTO_CHUNK_LOGITS = 2**25  # logits per chunk when the chunk size is automatic: 128 MB in fp32


def auto_chunk_size(vocab_size: int) -> int:
    """Token positions per chunk: 220 at a 151,936 vocabulary, all of a small model's at once."""
    return max(1, AUTO_CHUNK_LOGITS // vocab_size)


def _at_least_fp32(t: Tensor) -> Tensor:
    return t.float() if t.element_size() < 4 else t  # bf16/fp16 logits are upcast for the softmax


class LinearLogps(torch.autograd.Function):
    """log p(y) and entropy of ``softmax(h @ W.T / temperature)`` for a chunk of c positions.

    Saves h, W, y and the log-normaliser (c floats); backward recomputes the [c, vocab] logits once, turns them
    into probabilities in place and folds the rest of d logp / d logits = (onehot(y) - softmax) / temperature into
    the [c, H]-sized factors of the two gradient products. The temperature scales h, not the logits. Each
    [c, vocab] pass is one in-place elementwise op or one matrix product: on a CPU, where a fresh [c, vocab]
    buffer costs as much as an op in page faults, that is half the time of log-softmax-style code. The entropy
    is detached unless ``entropy_grad`` (the entropy bonus), when backward adds d H / d logits =
    -p (log p + H) / temperature.
    """

    @staticmethod
    def forward(
        ctx, h: Tensor, weight: Tensor, y: Tensor, temperature: float, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor]:
        shifted = _logits(h, weight, temperature)  # [c, V]
        top = shifted.amax(-1, keepdim=True)  # [c, 1]
        shifted.sub_(top)  # z - max: <= 0
        picked = shifted.gather(-1, y.unsqueeze(-1)).squeeze(-1)  # [c]
        exps = shifted.exp()  # [c, V]
        log_sum = exps.sum(-1).log()  # [c]
        weighted = torch.bmm(exps.unsqueeze(1), shifted.unsqueeze(2)).view(-1)  # [c] sum exp(z - max) (z - max)
        entropy = log_sum - weighted / log_sum.exp()  # -sum p log p, log p = z - max - log_sum
        ctx.save_for_backward(h, weight, y, top.squeeze(-1) + log_sum)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return picked - log_sum, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        h, weight, y, lse = ctx.saved_tensors
        temperature = ctx.temperature
        probs = _logits(h, weight, temperature).sub_(lse.unsqueeze(-1)).exp_()  # [c, V]
        grad_logp = torch.zeros_like(lse) if grad_logp is None else grad_logp  # [c]
        # d/dz = (onehot(y) - p) g_y, plus -p (log p + H) g_H for the entropy; z = h @ W.T / temperature
        if grad_entropy is not None:
            log_probs = probs.log()
            entropy = -(probs * log_probs).sum(-1, keepdim=True)  # [c, 1]
            probs.mul_(log_probs.add_(entropy).mul_(grad_entropy.unsqueeze(-1)).add_(grad_logp.unsqueeze(-1)))
            row_scale = torch.ones_like(lse)  # the p-term's per-row factor is already in probs
        else:
            row_scale = grad_logp
        probs = probs.to(h.dtype)
        scale = (row_scale / temperature).to(h.dtype).unsqueeze(-1)  # [c, 1]
        picked = (grad_logp / temperature).to(h.dtype).unsqueeze(-1)  # [c, 1] the onehot term's factor
        grad_h = grad_weight = None
        if ctx.needs_input_grad[0]:  # [c, H]
            grad_h = weight[y] * picked - (probs @ weight) * scale
        if ctx.needs_input_grad[1]:  # [V, H]
            grad_weight = probs.T @ (h * -scale)  # bf16 under autocast, whatever h's dtype
            grad_weight.index_add_(0, y, (h * picked).to(grad_weight.dtype))
        return grad_h, grad_weight, None, None, None


def _logits(h: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """[c, V] fp32 logits / temperature, a fresh tensor (the temperature scales the [c, H] factor)."""
    return _at_least_fp32((h if temperature == 1.0 else h / temperature) @ weight.T)


def logit_scale(config) -> float:
    """What the model's forward multiplies its LM head's logits by (1.0 when its config declares nothing)."""
    config = _text_config(config)
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        if getattr(config, name, None) is not None:
            return float(getattr(config, name))
    scaling = getattr(config, "logits_scaling", None)
    if scaling is None:
        return 1.0
    return float(scaling) if getattr(config, "model_type", None) == "hyperclovax" else 1.0 / scaling


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def router_aux_coef(config, router_aux_loss_coef: float | None = None) -> float:
    """Weight of the MoE load-balancing loss in the training loss, as TRL 1.16 resolves it: the setting, or the
    model config's ``router_aux_loss_coef`` when it is ``None``; 0.0 for a model without router logits."""
    config = _text_config(config)
    is_moe = hasattr(config, "output_router_logits")
    if router_aux_loss_coef and not is_moe:
        raise ValueError(
            f"router_aux_loss_coef={router_aux_loss_coef} needs a Mixture-of-Experts model that returns router "
            f"logits (output_router_logits in its config); {type(config).__name__} has none. Use None or 0.0"
        )
    if not is_moe:
        return 0.0
    return getattr(config, "router_aux_loss_coef", 0.0) if router_aux_loss_coef is None else router_aux_loss_coef


def router_aux_loss(router_logits: tuple[Tensor, ...], config, attention_mask: Tensor | None) -> Tensor:
    """Scalar load-balancing loss of one forward's router logits (Switch Transformer's, as Mixtral's forward and
    TRL compute it), over the tokens of ``attention_mask`` [n, L]."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    config = _text_config(config)
    return load_balancing_loss_func(router_logits, config.num_experts, config.num_experts_per_tok, attention_mask)


def selected(t: Tensor, mask: Tensor, plan: RowPlan | None) -> Tensor:
    """``t[mask]``, [m, ...] row-major, for an [n, T'] ``mask`` over ``t``'s first two dims. With the ``plan``'s
    count of the m completion tokens (known on the host), without the read of the device that a boolean index
    makes for its size.

    >>> t, mask = torch.arange(6).view(2, 3), torch.tensor([[True, False, True], [False, True, False]])
    >>> selected(t, mask, None).tolist(), selected(t, mask, RowPlan((0, 3), [2], tokens=3)).tolist()
    ([0, 2, 4], [0, 2, 4])
    """
    if plan is None:
        return t[mask]
    index = mask.flatten().nonzero_static(size=plan.tokens).squeeze(1)  # [m]
    return t.flatten(0, 1).index_select(0, index)


def _completion_hidden(
    model: nn.Module,
    config: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    router_aux: bool,
    shared_prefix: bool,
    padding_free: bool,
    vision: dict[str, Tensor] | None = None,
    plan: RowPlan | None = None,
) -> tuple[Tensor, Tensor | None]:
    """([m, H] the decoder's hidden states that predict the m completion tokens of ``attention_mask``, row-major;
    the MoE router loss or None). With ``vision`` inputs, the multimodal model's forward, images encoded."""
    decoder, targets = model.get_decoder(), attention_mask[:, -completion_length:].bool()  # [n, T]
    if vision is not None:
        if shared_prefix or padding_free or router_aux:
            raise ValueError("images go through the plain forward: shared_prefix, padding_free and router_aux are off")
        hidden = multimodal_hidden(model, input_ids, attention_mask, vision)  # [n, P+T, H]
        return selected(hidden[:, -completion_length - 1 : -1], targets, plan), None
    if shared_prefix and router_aux:
        raise ValueError("shared_prefix does not return MoE router logits: use shared_prefix=False")
    router = {"output_router_logits": True} if router_aux else {}
    if padding_free:
        dtype = next(decoder.parameters()).dtype
        runs = None if plan is None else plan.runs
        packed = pack_rows(input_ids, attention_mask, completion_length, shared_prefix, dtype, runs)
        outputs = decoder(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
            use_cache=False,
            **router,
        )
        aux_loss = router_aux_loss(outputs.router_logits, config, None) if router_aux else None  # no padding
        return outputs.last_hidden_state[0, packed.index], aux_loss
    positions = position_ids_from_mask(attention_mask)  # [n, P+T]
    if shared_prefix:
        prompts = None if plan is None else _attention(decoder, config, plan.prompt_padded, True)
        runs = None if plan is None else plan.runs
        hidden = shared_prefix_hidden(
            decoder, config, input_ids, attention_mask, positions, completion_length, runs, prompts
        )
        return selected(hidden, targets, plan), None
    mask = attention_mask if plan is None else _attention(decoder, config, plan.padded, False)(attention_mask)
    outputs = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False, **router)
    aux_loss = router_aux_loss(outputs.router_logits, config, attention_mask) if router_aux else None
    return selected(outputs.last_hidden_state[:, -completion_length - 1 : -1], targets, plan), aux_loss


def _attention(decoder: nn.Module, config: Any, padded: bool, cached: bool) -> Callable[[Tensor], Tensor | None]:
    """What the decoder is given for a forward's 2D mask, so that transformers does not read the device to decide
    what it says (whether it has padding): for rows the host knows to be padded, the causal mask prepared here
    (``model.padding.prepared_mask``); for rows without padding in a pass with a cache, no mask (transformers then
    uses the causal kernel, as it would for a mask of ones); the mask itself otherwise, and for decoders not in
    ``PREPARED_MASK_MODELS``."""
    if not takes_prepared_mask(config):
        return lambda mask: mask
    if padded:
        dtype = decoder.get_input_embeddings().weight.dtype  # transformers' masks take the embeddings' dtype
        return lambda mask: prepared_mask(mask, config, dtype)
    return (lambda mask: None) if cached else (lambda mask: mask)


def _head_logps(
    head: nn.Module, config: Any, temperature: float, entropy_grad: bool
) -> tuple[Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], bool]:
    """(``fn(h [c, H], y [c]) -> (log-probs [c], entropies [c])`` through the LM head, whether the head is a plain
    bias-free linear layer: then the fused ``LinearLogps`` computes them without materialising the logits)."""
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = logit_scale(config)
    plain = type(head) is nn.Linear and head.bias is None and not softcap and scale > 0

    def head_logps(h: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if plain:  # softmax(s * z / t) = softmax(z / (t / s))
            return LinearLogps.apply(h, head.weight, y, temperature / scale, entropy_grad)
        logits = head(h).float() * scale  # [c, vocab]
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        logp = (logits / temperature).log_softmax(-1)  # [c, vocab]
        entropy = -(logp.exp() * logp).sum(-1)  # [c]
        return logp.gather(-1, y.unsqueeze(-1)).squeeze(-1), entropy if entropy_grad else entropy.detach()

    return head_logps, plain


def completion_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    router_aux: bool = False,
    entropy_grad: bool = False,
    shared_prefix: bool = False,
    padding_free: bool = False,
    vision: dict[str, Tensor] | None = None,
    plan: RowPlan | None = None,
) -> TokenLogps:
    """Log-probs of the last ``completion_length`` tokens of each row.

    Args:
        model: a Hugging Face causal LM (or PEFT wrapper) exposing ``get_decoder`` and ``get_output_embeddings``.
        input_ids: [n, P+T] prompt then completion.
        attention_mask: [n, P+T].
        completion_length: T.
        temperature: the sampling temperature; logits are divided by it, as when the tokens were sampled.
        chunk_size: token positions per LM-head chunk; ``None`` sizes chunks to ~32M logits (128 MB fp32).
        router_aux: also return the MoE load-balancing loss (``router_aux_coef(config) != 0``).
        entropy_grad: return the entropies with their gradient (for the entropy bonus); detached otherwise.
        shared_prefix: encode the prompt of each run of rows that share it once (``lightning_grpo.model.prefix``);
            the same values and gradients, for P + G * T token positions a group instead of G * (P + T).
        padding_free: run the decoder on the rows' real tokens packed into one sequence (``model.padding``).
        vision: the rows' vision inputs (``pixel_values`` ...; ``Rollout.vision_inputs``) for a vision-language
            model, whose prompt ids hold the processor's image tokens (``model.vision``).
        plan: the columns to keep and the rows sharing a prompt, from the host (``Rollout.host``); found on the
            device when ``None`` (host reads, which on a GPU wait for its queue).

    Columns that every row pads are never computed, and the LM head runs on completion tokens only; the
    log-probs and entropies of padding are 0.
    """
    config = _text_config(getattr(model, "config", None))
    columns = None if plan is None else plan.columns
    ids, mask, width = trim_padding(input_ids, attention_mask, completion_length, columns)  # [n, P'+T'], T' <= T
    hidden, aux_loss = _completion_hidden(
        model, config, ids, mask, width, router_aux, shared_prefix, padding_free, vision, plan
    )
    targets = mask[:, -width:].bool()  # [n, T'] the tokens scored: the LM head runs on these m only
    head = model.get_output_embeddings()
    head_logps, plain = _head_logps(head, config, temperature, entropy_grad)
    labels = selected(ids[:, -width:], targets, plan)  # [m]
    chunk_size = chunk_size or auto_chunk_size(head.weight.shape[0])
    none = hidden[:0, 0].float()  # [0], in the graph: every row empty (an agent that failed before asking)
    logps, entropies = [none], [none if entropy_grad else none.detach()]
    for start in range(0, labels.numel(), chunk_size):
        h, y = hidden[start : start + chunk_size], labels[start : start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad and not plain:
            lp, ent = checkpoint(head_logps, h, y, use_reentrant=False)
        else:
            lp, ent = head_logps(h, y)
        logps.append(lp)
        entropies.append(ent)
    return TokenLogps(*(_unpacked(torch.cat(v), targets, completion_length) for v in (logps, entropies)), aux_loss)


def _unpacked(values: Tensor, targets: Tensor, completion_length: int) -> Tensor:
    """[m] values of the ``targets`` [n, T'] tokens -> [n, T] with 0 elsewhere. A new tensor, not a view: FSDP2
    hooks the outputs of a sharded forward, and a view's hook is silently lost if anything later modifies it."""
    out = values.new_zeros(targets.shape).masked_scatter(targets, values)  # [n, T']
    return torch.nn.functional.pad(out, (0, completion_length - targets.shape[1]))


def in_row_order(micro_batches: list[slice] | list[Tensor], logps: Callable[[slice | Tensor], Tensor]) -> Tensor:
    """[N, T] ``logps(rows)`` of each micro-batch, put back in row order (token-budget micro-batches take rows
    sorted by length)."""
    parts = [(rows, logps(rows)) for rows in micro_batches]
    out = parts[0][1].new_zeros(sum(len(values) for _, values in parts), parts[0][1].shape[1])  # [N, T]
    for rows, values in parts:
        out[rows] = values
    return out
