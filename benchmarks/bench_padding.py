"""Where a step of the uneven-length shape goes: one generation, then the log-prob forward and backward of its
completions in each layout, side by side in one run (the same rollout for every layout).

The uneven task of ``trl_vs_lightning_grpo.py --model uneven`` (``bench_assets.uneven_task``: the gen model, one
prompt, EOS spread from ~30 to 256 tokens), 2 prompts x 8 completions::

    OMP_NUM_THREADS=2 python benchmarks/bench_padding.py

Layouts: the padded batch (its padding columns trimmed, the LM head on completion tokens only: always on), the
shared-prompt forward, length-sorted token-budget micro-batches (``update.micro_batch_tokens``, whole groups with a
shared prompt), and the packed forward (``policy.padding_free``). Best of ``--repeats`` forward + backward passes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from bench_assets import uneven_task

from lightning_grpo import PolicyConfig
from lightning_grpo.demo.tiny import cache_home
from lightning_grpo.engines import LeanDecode
from lightning_grpo.model.policy import Policy
from lightning_grpo.rollout import SamplingConfig
from lightning_grpo.targets.build import micro_batches, token_micro_batches
from lightning_grpo.types import Rollout

LAYOUTS = {  # name -> (policy settings, micro-batches of a rollout with ``tokens`` [N] and G rows a group)
    "padded, one pass": ({"share_prompt_prefix": False}, lambda tokens, g, budget: micro_batches(len(tokens), None)),
    "shared prompt, one pass": ({}, lambda tokens, g, budget: micro_batches(len(tokens), None)),
    "micro_batch_tokens, groups, shared": ({}, lambda tokens, g, budget: token_micro_batches(tokens, budget, g)),
    "micro_batch_tokens, rows": (
        {"share_prompt_prefix": False},
        lambda tokens, g, budget: token_micro_batches(tokens, budget, 1),
    ),
    "padding_free, one pass": (
        {"share_prompt_prefix": False, "padding_free": True},
        lambda tokens, g, budget: micro_batches(len(tokens), None),
    ),
    "padding_free + shared, one pass": (
        {"padding_free": True},
        lambda tokens, g, budget: micro_batches(len(tokens), None),
    ),
}


def generation(model_dir: str, prompts: list[str], group: int, max_tokens: int) -> tuple[Rollout, dict[bool, float]]:
    """The rollout (seed 0), and seconds of one LeanDecode call with ended rows dropped and kept."""
    seconds = {}
    for drop in (True, False):
        policy = Policy(model_dir)
        torch.manual_seed(0)
        start = time.perf_counter()
        engine = LeanDecode(drop_finished_rows=drop)
        rollout = engine.generate(policy, prompts, group, SamplingConfig(max_completion_length=max_tokens), False)
        seconds[drop] = time.perf_counter() - start
    return rollout, seconds


def forward_backward(model_dir: str, rollout: Rollout, settings: dict, rows: list, repeats: int) -> float:
    """Best seconds of the log-prob forward and backward over ``rows``' micro-batches."""
    policy = Policy(model_dir, PolicyConfig(**settings))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for micro in rows:
            policy.train_logps(rollout, micro).logps.sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=2, help="B (2)")
    p.add_argument("--group", type=int, default=8, help="G (8)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_completion_length (256)")
    p.add_argument("--budget", type=int, default=1024, help="micro_batch_tokens (1024)")
    p.add_argument("--repeats", type=int, default=2, help="forward + backward passes per layout; the best (2)")
    args = p.parse_args()
    task = uneven_task(cache_home())
    with open(f"{task.data_dir}/train.jsonl") as f:
        prompts = [json.loads(line)["prompt"] for line in f][: args.prompts]
    rollout, seconds = generation(task.model_dir, prompts, args.group, args.max_tokens)
    lengths = rollout.completion_mask.sum(dim=1)
    print(f"{torch.get_num_threads()} threads; {len(lengths)} completions of {sorted(lengths.tolist())} tokens")
    print(f"generate (LeanDecode): {seconds[True]:.2f} s with ended rows dropped, {seconds[False]:.2f} s kept")
    tokens = rollout.attention_mask.sum(dim=1)
    for name, (settings, split) in LAYOUTS.items():
        rows = split(tokens, args.group, args.budget)
        took = forward_backward(task.model_dir, rollout, settings, rows, args.repeats)
        print(f"{name:36s} forward + backward {took:6.2f} s ({len(rows)} passes)")


if __name__ == "__main__":
    main()
