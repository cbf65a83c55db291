"""Memory of one forward + backward through per-token log-probs at Qwen2.5's 151936 vocabulary, three ways.

    chunked    ``lightning_grpo.model.logprobs.completion_logps``: the LM head on ``chunk_size`` token positions at a
               time (default: ~32M logits), each chunk's logits recomputed once in the backward pass
    full       ``model(..., logits_to_keep=T + 1).logits`` then TRL's ``selective_log_softmax``: the whole
               [n, T, vocab] fp32 logits (and their gradient) exist at once; the textbook path
    trl_fused  what TRL 1.16's GRPOTrainer itself runs: ``add_fused_lm_head``, an online log-sum-exp over
               32768-wide vocabulary tiles

One method per process: the peak RSS minus the RSS just before the pass (model loaded, libraries imported) is
what the pass itself needed. Each method imports its own library inside its factory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from bench_assets import own_peak_rss_mb, rss_mb
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

LogpFn = Callable[[Tensor, Tensor, int], Tensor]  # (input_ids [n, P+T], attention_mask, T) -> logps [n, T]


def chunked(model: nn.Module, chunk_size: int | None) -> LogpFn:
    from lightning_grpo.model.logprobs import completion_logps

    return lambda ids, mask, t: completion_logps(model, ids, mask, t, 1.0, chunk_size).logps


def full_logits(model: nn.Module, chunk_size: int | None) -> LogpFn:
    from trl.trainer.utils import selective_log_softmax

    def logps(ids: Tensor, mask: Tensor, t: int) -> Tensor:
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=t + 1).logits[:, :-1]  # [n, T, vocab]
        return selective_log_softmax(logits, ids[:, -t:])

    return logps


def trl_fused(model: nn.Module, chunk_size: int | None) -> LogpFn:
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))  # as GRPOTrainer patches its policy

    def logps(ids: Tensor, mask: Tensor, t: int) -> Tensor:
        labels = ids.masked_fill(torch.arange(ids.shape[1]) < ids.shape[1] - t, -100)  # score completions only
        return model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs[:, -t:]

    return logps


METHODS: dict[str, Callable[[nn.Module, int | None], LogpFn]] = {
    "chunked": chunked,
    "full": full_logits,
    "trl_fused": trl_fused,
}


@dataclass
class LogprobSpec:
    method: str  # a key of METHODS
    model_dir: str
    sequences: int
    prompt_length: int
    completion_length: int
    chunk_size: int | None  # lightning-grpo's logprob_chunk_size (the chunked method only)


@dataclass
class LogprobResult:
    method: str
    chunk_size: int | None
    rss_before_mb: float
    peak_rss_mb: float
    seconds: float

    @property
    def label(self) -> str:
        if self.method != "chunked":
            return self.method
        return f"chunked/{self.chunk_size or 'auto'}"

    @property
    def pass_mb(self) -> float:
        """Memory the forward + backward pass added on top of the loaded model."""
        return self.peak_rss_mb - self.rss_before_mb


def run(spec: LogprobSpec) -> LogprobResult:
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32).train()
    logps = METHODS[spec.method](model, spec.chunk_size)
    shape = (spec.sequences, spec.prompt_length + spec.completion_length)
    ids = torch.randint(model.config.vocab_size, shape, generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():  # pages in every weight (the LM head reads them all), which loading may have left mapped
        model(input_ids=ids[:1, :1])
    before = rss_mb()
    start = time.perf_counter()
    logps(ids, mask, spec.completion_length).mean().backward()
    return LogprobResult(spec.method, spec.chunk_size, before, own_peak_rss_mb(), time.perf_counter() - start)
