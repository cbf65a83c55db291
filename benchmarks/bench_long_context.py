"""How long a completion one GPU trains: peak GPU memory of one training step (the log-prob forward and backward of
one completion, then an AdamW step) against completion length, with gradient checkpointing and activation offload.

Qwen2.5-0.5B's shape (``bench_assets.qwen_shape_task``: random weights, no download), one 32-token prompt and one
completion of random tokens per length; the log-probs chunked as always (``policy.logprob_chunk_size``)::

    python benchmarks/bench_long_context.py --lengths 4096 8192 16384 32768

Columns: seconds of the step, tokens per second, peak ``torch.cuda.max_memory_allocated`` (weights, gradients and
AdamW moments included), or OOM. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_assets import qwen_shape_task
from bench_padding import synthetic_rollout
from transformers import AutoConfig, AutoTokenizer

from lightning_grpo import PolicyConfig
from lightning_grpo.demo.home import cache_home
from lightning_grpo.model.policy import Policy

MODES = {
    "plain": {},
    "checkpointing": {"gradient_checkpointing": True},
    "checkpointing + offload": {"gradient_checkpointing": True, "activation_offload": True},
}


def step(policy: Policy, optimizer: torch.optim.Optimizer, length: int, vocab: int, pad: int) -> tuple[float, float]:
    """Seconds and peak GPU MB of one training step on one completion of ``length`` tokens."""
    rollout = synthetic_rollout(vocab, pad, 1, 1, 32, f"{length}-{length}", "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    policy.train_logps(rollout, slice(0, 1)).logps.sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start, torch.cuda.max_memory_allocated() / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768], help="completion tokens")
    p.add_argument("--modes", nargs="+", default=list(MODES), help=f"a subset of {list(MODES)}")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="weights (bfloat16)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_long_context.py measures GPU memory: no CUDA GPU is visible")
    task = qwen_shape_task(cache_home())
    vocab = AutoConfig.from_pretrained(task.model_dir).vocab_size
    pad = AutoTokenizer.from_pretrained(task.model_dir).pad_token_id
    print(
        f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB; "
        f"Qwen2.5-0.5B shape, {args.dtype} weights and AdamW moments, sdpa"
    )
    print(f"{'mode':26s} {'tokens':>7s} {'step s':>7s} {'tokens/s':>9s} {'peak MB':>8s}")
    for mode in args.modes:
        policy = Policy(task.model_dir, PolicyConfig(dtype=args.dtype, **MODES[mode])).to("cuda")
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-6)
        step(policy, optimizer, 256, vocab, pad)  # warm-up: kernels, the AdamW moments
        for length in args.lengths:
            try:
                seconds, peak = step(policy, optimizer, length, vocab, pad)
            except torch.OutOfMemoryError:
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                print(f"{mode:26s} {length:7d} {'OOM':>7s}")
                break
            print(f"{mode:26s} {length:7d} {seconds:7.2f} {length / seconds:9.0f} {peak:8.0f}", flush=True)
        del policy, optimizer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
