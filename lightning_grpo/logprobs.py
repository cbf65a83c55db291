"""Policy + token ids -> per-token log-probs and entropies of the completion tokens.

Knows the model's decoder and output head; nothing about rewards or losses. The LM head runs on chunks of
``chunk_size`` token positions, each under activation checkpointing when gradients are on, so the full
fp32 ``[N, T, vocab]`` logits never exist at once: peak extra memory is ``chunk_size * vocab`` floats,
recomputed in the backward pass instead of stored (for Qwen2.5's 151k vocabulary, 32 completions of 512
tokens would be 9.9 GB of fp32 logits; a chunk of 1024 positions is 0.6 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


@dataclass
class TokenLogps:
    logps: Tensor  # [n, T] log p(token) under temperature-scaled logits
    entropy: Tensor  # [n, T] entropy of the temperature-scaled distribution, detached


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """[n, L] positions that skip left padding, as ``generate`` assigns them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> TokenLogps:
    """Log-probs of the last ``completion_length`` tokens of each row.

    Args:
        model: a Hugging Face causal LM (or PEFT wrapper) exposing ``get_decoder`` and ``get_output_embeddings``.
        input_ids: [n, P+T] prompt then completion.
        attention_mask: [n, P+T].
        completion_length: T.
        temperature: the sampling temperature; logits are divided by it, as when the tokens were sampled.
        chunk_size: token positions per LM-head chunk.
    """
    hidden = model.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state  # [n, P+T, H]
    hidden = hidden[:, -completion_length - 1 : -1]  # [n, T, H] the states that predict each completion token
    targets = input_ids[:, -completion_length:]  # [n, T]
    head = model.get_output_embeddings()
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)

    def head_logps(h: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        logits = head(h).float()  # [c, vocab]
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        logp = (logits / temperature).log_softmax(-1)  # [c, vocab]
        entropy = -(logp.exp() * logp).sum(-1)  # [c]
        return logp.gather(-1, y.unsqueeze(-1)).squeeze(-1), entropy.detach()

    flat_h = hidden.reshape(-1, hidden.shape[-1])  # [n*T, H]
    flat_y = targets.reshape(-1)  # [n*T]
    logps, entropies = [], []
    for start in range(0, flat_y.numel(), chunk_size):
        h, y = flat_h[start : start + chunk_size], flat_y[start : start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = checkpoint(head_logps, h, y, use_reentrant=False)
        else:
            lp, ent = head_logps(h, y)
        logps.append(lp)
        entropies.append(ent)
    shape = targets.shape
    # Copies, not views of the flat results: FSDP2 hooks the outputs of a sharded forward, and a view's hook is
    # silently lost if anything later modifies it in place.
    return TokenLogps(torch.cat(logps).view(shape).clone(), torch.cat(entropies).view(shape).clone())
