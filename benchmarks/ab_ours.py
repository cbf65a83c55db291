"""Is a change slower? Ours at two trees of the repository (a change and its base), the same shape, settings and
seeds, the runs alternating, each a fresh process (``trl_vs_lightning_grpo.py``'s workers, TRL left out):

    git worktree add /tmp/base <base commit>
    python benchmarks/ab_ours.py --base /tmp/base --model tiny --betas 0.04 --repeats 6 --steps 300 --threads 2

Every other argument is ``trl_vs_lightning_grpo.py``'s (the first ``--model`` and ``--betas`` are used). The tree a
worker imports ``lightning_grpo`` from is set by ``PYTHONPATH``: ``--base`` for one side, this file's repository for
the other; the benchmark's own code is this tree's for both. Printed: each run's steps/s and peak RSS, the medians,
and change / base.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import trl_vs_lightning_grpo as bench

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, required=True, help="a tree of the base commit (git worktree add PATH SHA)")
    own, rest = p.parse_known_args()
    args = bench.parse_args(rest)
    model, beta, runner = args.model[0], args.betas[0], bench.Runner(args.threads)
    settings, task = bench.speed_settings(args, model), bench.task_for(model)
    trees = {"base": own.base.resolve(), "change": HERE}
    speeds: dict[str, list[float]] = {name: [] for name in trees}
    for repeat in range(args.repeats):
        for name in list(trees) if repeat % 2 == 0 else list(trees)[::-1]:
            os.environ["PYTHONPATH"] = str(trees[name])  # the workers inherit it: lightning_grpo from that tree
            result = bench.speed_run(runner, "ours", task, settings, args, model, beta, repeat)  # the repeat's seed
            speeds[name].append(result.steps_per_s)
            print(f"  {model} beta={beta} repeat {repeat + 1}/{args.repeats} {name:6s}: {result.steps_per_s:8.3f} "
                  f"steps/s {result.peak_rss_mb:6.0f} MB", flush=True)  # fmt: skip
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    for name, values in speeds.items():
        print(f"{name:6s} ({trees[name]}): median {medians[name]:.3f} steps/s of {[f'{v:.3f}' for v in values]}")
    print(f"change / base: x{medians['change'] / medians['base']:.3f}")


if __name__ == "__main__":
    main()
