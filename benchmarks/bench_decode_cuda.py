"""The GPU decode step against its floor: ``LeanDecode``'s step as the model's forward (launched op by op from
Python) and as one captured CUDA graph (``engines.decode.graphed``), beside the memory-bandwidth floor.

    python benchmarks/bench_decode_cuda.py                          # Qwen2.5-0.5B's shape, bf16, 64 rows
    python benchmarks/bench_decode_cuda.py --model qwen1.5b --rows 8 64

The floor of one decode step is the bytes it must read (every weight once, the tied embedding counted once as the
LM head, and the KV cache of every row up to the current column) over the bandwidth measured here (a device copy,
bytes read plus written). Random weights (no download), a 32-token prompt per row, ``--steps`` steps timed with CUDA
events after ``--warmup`` untimed ones; the table gives the median step. Then whole ``generate`` calls: B x G rows
of ``--tokens`` tokens, graphs on and off, tokens per second.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_assets import QWEN05B_SIZES, QWEN15B_SIZES, QWEN25_VOCAB, qwen_vocab_tokenizer
from transformers import DynamicCache

from lightning_grpo.demo.tiny import build_tiny_qwen2
from lightning_grpo.engines.decode.graphed import GraphedDecodeStep, graphable
from lightning_grpo.engines.decode.lean import NextTokenLogits

SIZES = {"qwen0.5b": QWEN05B_SIZES, "qwen1.5b": QWEN15B_SIZES}
PROMPT_TOKENS = 32


def bandwidth_gbs(gib: float = 2.0, repeats: int = 10) -> float:
    """Device-to-device copy rate, bytes read plus written, GB/s."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * repeats / (start.elapsed_time(end) / 1e3) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter once (a tied embedding and LM head count once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


def kv_bytes(model: torch.nn.Module, rows: int, columns: int) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * rows * c.num_key_value_heads * columns * head_dim * model.dtype.itemsize


def time_steps(step, ids: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, steps: int, warmup: int):
    """Median ms of one call of ``step`` over ``steps`` decode steps after ``warmup``."""
    times, start, end = [], torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(warmup + steps):
        token = ids[:, :1]
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        start.record()
        step(token, mask, position + i)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times), mask.shape[1]


def step_table(model: torch.nn.Module, rows: int, steps: int, warmup: int, bandwidth: float) -> list[str]:
    ids = torch.randint(100, 1000, (rows, PROMPT_TOKENS), device="cuda")
    mask = torch.ones_like(ids)
    positions = mask.cumsum(1) - 1
    position = mask.sum(1, keepdim=True)
    plain = NextTokenLogits(model)
    out = []
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        plain(ids, mask, positions, cache)
        eager_ms, _ = time_steps(lambda t, m, p: plain(t, m, p, cache), ids, mask, position, steps, warmup)
        cache = DynamicCache(config=model.config)
        plain(ids, mask, positions, cache)
        graphed = GraphedDecodeStep(model, rows).bind(cache, PROMPT_TOKENS + warmup + steps + 1)
        graph_ms, columns = time_steps(lambda t, m, p: graphed(t, m, p, None), ids, mask, position, steps, warmup)
    floor_bytes = weight_bytes(model) + kv_bytes(model, rows, (PROMPT_TOKENS + columns) // 2)
    floor_ms = floor_bytes / (bandwidth * 1e9) * 1e3
    for name, ms in (("model forward, op by op", eager_ms), ("captured graph", graph_ms)):
        out.append(f"| {rows} | {name} | {ms:.3f} | {floor_ms:.3f} | {ms / floor_ms:.2f}x |")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SIZES), default="qwen0.5b")
    p.add_argument("--rows", type=int, nargs="+", default=[64], help="decode batch sizes (64)")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps (64)")
    p.add_argument("--warmup", type=int, default=8, help="untimed decode steps first (8)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = p.parse_args()
    torch.manual_seed(0)
    tokenizer = qwen_vocab_tokenizer()
    model = build_tiny_qwen2(tokenizer, 0, vocab_size=QWEN25_VOCAB, **SIZES[args.model])
    model = model.to("cuda", getattr(torch, args.dtype)).eval()
    assert graphable(model), "the model should take the graphed step"
    bandwidth = bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.model} {args.dtype}, "
          f"{weight_bytes(model) / 1e9:.3f} GB of weights; measured bandwidth {bandwidth:.0f} GB/s")  # fmt: skip
    print("| rows | decode step | ms | floor ms | over the floor |\n|---|---|---|---|---|")
    for rows in args.rows:
        print("\n".join(step_table(model, rows, args.steps, args.warmup, bandwidth)), flush=True)


if __name__ == "__main__":
    main()
