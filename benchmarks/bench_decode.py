"""One decode step of Hugging Face ``generate`` and of lightning-grpo's ``LeanDecode`` loop, against two floors:
reading the model's weights once (a decode step multiplies a few rows by every weight, so it cannot be faster
than a copy of them), and its multiply-adds at this machine's best fp32 matmul rate (``2 * rows * weights``
FLOPs; with 16 rows and a 32,000-token LM head this one can be the higher). Imported only by a "decode" worker of
``trl_vs_lightning_grpo.py``.

Time per step is the difference of two generations, ``long`` and ``short`` tokens long, divided by the steps
between them: prompt prefill and per-call set-up (the weight packing of LeanDecode) cancel out.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from bench_assets import matmul_gflops
from transformers import AutoModelForCausalLM

from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode.lean import Decoder, NextTokenLogits, decode_weights

NO_EOS = [-1]  # an id never sampled: every row runs to the end


@dataclass
class DecodeSpec:
    model_dir: str
    rows: int  # sequences decoded together: 2 prompts x G
    repeats: int
    group_size: int = 8
    prompt_length: int = 32
    short: int = 8
    long: int = 72


def seconds(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def hf_generate(model: Any, ids: torch.Tensor, steps: int) -> None:
    model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        top_k=0,
        max_new_tokens=steps,
        min_new_tokens=steps,
        pad_token_id=0,
    )


def lean_decode(model: Any, ids: torch.Tensor, steps: int, group_size: int, fused: bool) -> None:
    """LeanDecode's loop; ``fused``: decode steps by ``FusedDecodeStep`` (the engine's default for this model)."""
    rows, sampling = len(ids) * group_size, SamplingConfig(max_completion_length=steps)
    with decode_weights(model, rows, fused=fused) as step:
        decoder = Decoder(NextTokenLogits(model), sampling, NO_EOS, 0, False, step)
        decoder(ids, torch.ones_like(ids), group_size, greedy=False, share_prompt=True)


def per_step_ms(run: Any, spec: DecodeSpec) -> float:
    """Median over repeats of (long - short) / (long - short steps), in ms."""
    run(spec.short)  # warm-up: allocator, thread pool
    diffs = [(seconds(lambda: run(spec.long)) - seconds(lambda: run(spec.short))) for _ in range(spec.repeats)]
    return statistics.median(diffs) / (spec.long - spec.short) * 1000


def floor_ms(model: Any) -> tuple[float, float]:
    """MB of weights (tied ones once) and the median ms to copy them once."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    target = torch.empty_like(flat)
    times = [seconds(lambda: target.copy_(flat)) for _ in range(20)]
    return flat.numel() * flat.element_size() / 1e6, statistics.median(times) * 1000


def products_ms(model: Any, rows: int, repeats: int = 50) -> float:
    """Median ms of one decode step's matrix products alone, as the fused step runs them (q/k/v and gate/up
    joined, every weight pre-packed for ``rows`` rows), on random inputs: what a step costs before attention,
    norms, rotary embedding and sampling."""
    hidden = torch.randn(rows, 1, model.config.hidden_size)
    with decode_weights(model, rows) as step:
        products = [(step.head, hidden)]
        for layer in step.layers:
            products += [(layer.qkv, hidden), (layer.gate_up, hidden)]
            products += [(p, torch.randn(rows, 1, p.in_features)) for p in (layer.o_proj, layer.down_proj)]

        def one_step() -> None:
            for product, x in products:
                product(x)

        one_step()
        return statistics.median(seconds(one_step) for _ in range(repeats)) * 1000


def run(spec: DecodeSpec) -> dict[str, Any]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir).eval()
    prompts = torch.randint(3, model.config.vocab_size, (spec.rows // spec.group_size, spec.prompt_length))
    repeated = prompts.repeat_interleave(spec.group_size, dim=0)
    weight_mb, floor = floor_ms(model)
    linears = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    gflop = 2 * spec.rows * sum(linears.values()) / 1e9  # every linear layer once, the LM head included
    rate = matmul_gflops()
    with torch.no_grad():
        hf = per_step_ms(lambda steps: hf_generate(model, repeated, steps), spec)
        lean = per_step_ms(lambda steps: lean_decode(model, prompts, steps, spec.group_size, False), spec)
        fused = per_step_ms(lambda steps: lean_decode(model, prompts, steps, spec.group_size, True), spec)
        products = products_ms(model, spec.rows)
    return {
        "threads": torch.get_num_threads(),
        "rows": spec.rows,
        "weight_mb": weight_mb,
        "floor_ms": floor,
        "gflop": gflop,
        "matmul_gflops": rate,
        "compute_floor_ms": gflop / rate * 1000,
        "hf_generate": hf,
        "lean_decode": lean,
        "lean_fused": fused,
        "products_ms": products,
    }
