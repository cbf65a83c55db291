"""Where a step of the uneven-length shape goes: one generation, then the log-prob forward and backward of its
completions in each layout, side by side in one run (the same rollout for every layout).

The uneven task of ``trl_vs_lightning_grpo.py --model uneven`` (``bench_assets.uneven_task``: the gen model, one
prompt, EOS spread from ~30 to 256 tokens), 2 prompts x 8 completions::

    OMP_NUM_THREADS=2 python benchmarks/bench_padding.py

Layouts: the padded batch (its padding columns trimmed, the LM head on completion tokens only: always on), the
shared-prompt forward, length-sorted token-budget micro-batches (``update.micro_batch_tokens``, whole groups with a
shared prompt), and the packed forward (``policy.padding_free``). Best of ``--repeats`` forward + backward passes;
on a GPU also the peak memory of a pass beyond the weights. Every layout's log-probs are compared with the first's.

On a GPU, Qwen2.5-0.5B's shape (random weights, bfloat16) with completions of 64 to 4,096 random tokens::

    python benchmarks/bench_padding.py --device cuda --model qwen0.5b --dtype bfloat16 --lengths 64-4096
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from bench_assets import qwen_shape_task, uneven_task
from torch import Tensor
from transformers import AutoConfig, AutoTokenizer

from lightning_grpo import PolicyConfig
from lightning_grpo.demo.home import cache_home
from lightning_grpo.engines import LeanDecode
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy
from lightning_grpo.targets.build import micro_batches, token_micro_batches
from lightning_grpo.types import Rollout

LAYOUTS = {  # name -> (policy settings, micro-batches of rows with (prompt, completion) ``lengths`` [N], G a group)
    "padded, one pass": ({"share_prompt_prefix": False}, lambda lengths, g, budget: micro_batches(len(lengths), None)),
    "shared prompt, one pass": ({}, lambda lengths, g, budget: micro_batches(len(lengths), None)),
    "micro_batch_tokens, groups, shared": ({}, lambda lengths, g, budget: token_micro_batches(lengths, budget, g)),
    "micro_batch_tokens, rows": (
        {"share_prompt_prefix": False},
        lambda lengths, g, budget: token_micro_batches(lengths, budget, 1),
    ),
    "padding_free, one pass": (
        {"share_prompt_prefix": False, "padding_free": True},
        lambda lengths, g, budget: micro_batches(len(lengths), None),
    ),
    "padding_free + shared, one pass": (
        {"padding_free": True},
        lambda lengths, g, budget: micro_batches(len(lengths), None),
    ),
}


def generation(
    model_dir: str, prompts: list[str], group: int, max_tokens: int, device: str
) -> tuple[Rollout, dict[bool, float]]:
    """The rollout (seed 0), and seconds of one LeanDecode call with ended rows dropped and kept (after a short
    untimed call: a GPU's first kernels load and compile)."""
    seconds = {}
    LeanDecode().generate(Policy(model_dir).to(device), prompts, group, SamplingConfig(max_completion_length=8), False)
    for drop in (True, False):
        policy = Policy(model_dir).to(device)
        torch.manual_seed(0)
        sync(device)
        start = time.perf_counter()
        engine = LeanDecode(drop_finished_rows=drop)
        rollout = engine.generate(policy, prompts, group, SamplingConfig(max_completion_length=max_tokens), False)
        sync(device)
        seconds[drop] = time.perf_counter() - start
    return rollout, seconds


def synthetic_rollout(
    vocab: int, pad_id: int, rows: int, group: int, prompt_tokens: int, spread: str, device: str
) -> Rollout:
    """A rollout of random tokens whose completion lengths spread log-uniformly over ``spread`` ("LOW-HIGH"),
    one row of every group at HIGH: the shape of a reasoning run's rollout, without generating it (seed 0)."""
    low, high = (int(x) for x in spread.split("-"))
    g = torch.Generator().manual_seed(0)
    lengths = torch.exp(torch.empty(rows).uniform_(math.log(low), math.log(high), generator=g)).long()
    lengths[::group] = high
    prompt = torch.randint(3, vocab, (prompt_tokens,), generator=g).tolist()
    completions = [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in lengths]
    return Rollout.from_token_lists(
        [prompt] * rows,
        completions,
        pad_id,
        [bool(n == high) for n in lengths],
        prompts=[""] * rows,
        completions=[""] * rows,
        device=device,
        group_size=group,
    )


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def forward_backward(
    model_dir: str, rollout: Rollout, settings: dict, rows: list, repeats: int, device: str
) -> tuple[float, float | None, Tensor]:
    """Best seconds of the log-prob forward and backward over ``rows``' micro-batches, the peak GPU memory (MB)
    of one such pass beyond the weights (None on CPU), and the [N, T] log-probs, in row order."""
    policy = Policy(model_dir, PolicyConfig(**settings)).to(device)
    best, peak = float("inf"), None
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync(device)
        start = time.perf_counter()
        for micro in rows:
            policy.train_logps(rollout, micro).logps.sum().backward()
        sync(device)
        best = min(best, time.perf_counter() - start)
        if device == "cuda":
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        policy.model.zero_grad(set_to_none=True)
    with torch.no_grad():
        logps = policy.logps(rollout, rows)
    return best, peak, logps.float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("uneven", "qwen0.5b"), default="uneven", help="the model (uneven)")
    p.add_argument("--prompts", type=int, default=2, help="B (2)")
    p.add_argument("--group", type=int, default=8, help="G (8)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_completion_length when generating (256)")
    p.add_argument("--lengths", help="LOW-HIGH: random tokens with completion lengths spread over it, not generated")
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt length with --lengths (32)")
    p.add_argument("--budget", type=int, default=1024, help="micro_batch_tokens (1024)")
    p.add_argument("--repeats", type=int, default=2, help="forward + backward passes per layout; the best (2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the weights' (float32)")
    p.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa, eager, flex_attention ... (sdpa)")
    p.add_argument("--layouts", nargs="*", default=list(LAYOUTS), help="a subset of the layouts (all)")
    args = p.parse_args()
    home = cache_home()
    task = uneven_task(home) if args.model == "uneven" else qwen_shape_task(home)
    if args.lengths:
        tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
        vocab = AutoConfig.from_pretrained(task.model_dir).vocab_size
        rows = args.prompts * args.group
        pad = tokenizer.pad_token_id
        rollout = synthetic_rollout(vocab, pad, rows, args.group, args.prompt_tokens, args.lengths, args.device)
    else:
        with open(f"{task.data_dir}/train.jsonl") as f:
            prompts = [json.loads(line)["prompt"] for line in f][: args.prompts]
        rollout, seconds = generation(task.model_dir, prompts, args.group, args.max_tokens, args.device)
    lengths = rollout.completion_mask.sum(dim=1)
    where = f"{torch.cuda.get_device_name()}" if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"{where}; {args.model} {args.dtype} {args.attn}; {len(lengths)} completions of {sorted(lengths.tolist())}")
    if not args.lengths:
        print(f"generate (LeanDecode): {seconds[True]:.2f} s with ended rows dropped, {seconds[False]:.2f} s kept")
    row_lengths = rollout.host.lengths  # [N] (prompt, completion) tokens of each row
    model_settings = {"dtype": args.dtype, "model_init_kwargs": {"attn_implementation": args.attn}}
    reference = None
    print(f"{'layout':36s} {'fwd+bwd s':>9s} {'passes':>6s} {'peak MB':>8s} {'max |dlogp|':>11s}")
    for name in args.layouts:
        settings, split = LAYOUTS[name]
        rows = split(row_lengths, args.group, args.budget)
        try:
            took, peak, logps = forward_backward(
                task.model_dir, rollout, {**model_settings, **settings}, rows, args.repeats, args.device
            )
        except Exception as error:  # a layout the backend cannot run: say so and go on with the others
            print(f"{name:36s} FAILED: {type(error).__name__}: {str(error)[:200]}")
            continue
        mask = rollout.completion_mask.bool()
        reference = logps if reference is None else reference
        diff = (logps - reference)[mask].abs().max().item()
        peak_text = f"{peak:8.0f}" if peak is not None else f"{'-':>8s}"
        print(f"{name:36s} {took:9.3f} {len(rows):6d} {peak_text} {diff:11.2e}")


if __name__ == "__main__":
    main()
