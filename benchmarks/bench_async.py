"""Asynchronous GRPO against our synchronous run and TRL's, side by side on one shape (default: gen).

    python benchmarks/bench_async.py --repeats 3 --warmup 2 --steps 8 --json async.json
    python benchmarks/bench_async.py --engine hf    # our rows sample with HFGenerate instead of LeanDecode
    python benchmarks/bench_async.py --learning --seeds 3 --learning-steps 300   # held-out accuracy, sync vs k=1
    python benchmarks/bench_async.py --stages    # each stage of a step alone, 1 and 2 threads: async's ceiling
    python benchmarks/bench_async.py --reward-delay 1.5   # a reward that waits 1.5 s a call; adds a row scoring
                                                          # in the producer (score_in_producer)

Rows, each a fresh worker process of ``trl_vs_lightning_grpo.py`` (interleaved per repeat, so a load change on
a shared machine hits every row alike): ours synchronous on 2 threads; ours with ``AsyncRollouts`` at k = 1 and
k = 2, trainer and producer processes on 1 thread each; TRL 1.16 on 2 threads. Peak RSS of an async row is the
trainer's plus its producer's (shared-memory weights counted in both: an upper bound).
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

from trl_vs_lightning_grpo import MODEL_DEFAULTS, Runner, mean_std, run_grpo, task_for, template_settings

ROWS = {  # label: (side, threads per process, max_staleness, score_in_producer)
    "ours sync, 2 threads": ("ours", 2, None, False),
    "ours async k=1, 1+1 threads": ("ours", 1, 1, False),
    "ours async k=2, 1+1 threads": ("ours", 1, 2, False),
    "trl, 2 threads": ("trl", 2, None, False),
}
PRODUCER_SCORES = {"ours async k=1, producer scores": ("ours", 1, 1, True)}  # with --reward-delay


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    settings, task = replace(MODEL_DEFAULTS[args.model], engine=args.engine), task_for(args.model)
    rows = ROWS | (PRODUCER_SCORES if args.reward_delay else {})
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in rows}
    for repeat in range(args.repeats):
        for label, (side, threads, k, in_producer) in rows.items():
            extra = {"reward_delay": args.reward_delay}
            extra |= {} if k is None else {"max_staleness": k, "score_in_producer": in_producer}
            result = run_grpo(
                Runner(threads),
                side,
                task,
                settings,
                model=args.model,
                beta=0.0,
                seed=args.seed + repeat,
                warmup_steps=args.warmup,
                timed_steps=args.steps,
                eval_accuracy=False,
                **extra,
            )
            runs[label].append({"steps_per_s": result.steps_per_s, "peak_rss_mb": result.peak_rss_mb})
            print(
                f"  repeat {repeat + 1}: {label:30s} {result.steps_per_s:.3f} steps/s {result.peak_rss_mb:.0f} MB",
                flush=True,
            )
    return runs


def learning(args: argparse.Namespace) -> dict[str, list[float]]:
    """Greedy held-out accuracy on the tiny task after ``--learning-steps`` steps with templates/tiny_cpu.yaml's
    settings, synchronous and async k = 1 (the same seeds)."""
    settings, beta = template_settings()
    if args.learning_rate is not None:
        settings = replace(settings, learning_rate=args.learning_rate)
    rows = [(label, k) for label, k in (("sync", None), ("async k=1", 1)) if label.split()[0] in args.learning_rows]
    accuracy: dict[str, list[float]] = {label: [] for label, _ in rows}
    for seed in range(args.seed, args.seed + args.seeds):
        for label, k in rows:
            result = run_grpo(
                Runner(1),
                "ours",
                task_for("tiny"),
                settings,
                model="tiny",
                beta=beta,
                seed=seed,
                warmup_steps=0,
                timed_steps=args.learning_steps,
                eval_accuracy=True,
                **({} if k is None else {"max_staleness": k, "sampling_correction": args.correction}),
            )
            accuracy[label].append(result.accuracy)
            print(f"  seed {seed} {label:10s}: held-out accuracy {result.accuracy:.3f}", flush=True)
    for label, values in accuracy.items():
        print(f"{label}: held-out accuracy {mean_std(values)} over {args.seeds} seeds, {args.learning_steps} steps")
    return accuracy


def stages(threads: int, model: str = "gen", repeats: int = 2) -> dict[str, float]:
    """Seconds of each stage of one step on ``model``'s shape, alone in this process (the best of ``repeats``):
    LeanDecode's generation, a no-grad log-prob pass, the training forward + backward + AdamW step."""
    import time

    import torch
    from bench_assets import read_rows

    from lightning_grpo.engines import LeanDecode
    from lightning_grpo.engines.config import SamplingConfig
    from lightning_grpo.model.policy import Policy

    torch.set_num_threads(threads)
    settings, task = MODEL_DEFAULTS[model], task_for(model)
    policy = Policy(task.model_dir)
    prompts = [r["prompt"] for r in read_rows(task.data_dir, "train")[: settings.prompts_per_step]]
    sampling, engine = SamplingConfig(max_completion_length=settings.max_completion_length), LeanDecode()
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=settings.learning_rate)
    torch.manual_seed(0)
    engine.generate(policy, prompts, settings.num_generations, sampling, False)  # warm-up
    best: dict[str, float] = {}
    for _ in range(repeats):
        start = time.perf_counter()
        rollout = engine.generate(policy, prompts, settings.num_generations, sampling, False)
        seconds = {"generation": time.perf_counter() - start}
        start = time.perf_counter()
        with torch.no_grad():
            policy.logps(rollout, [slice(None)])
        seconds["no-grad log-prob pass"] = time.perf_counter() - start
        start = time.perf_counter()
        (policy.train_logps(rollout, slice(None)).logps * rollout.completion_mask).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds["forward + backward + AdamW"] = time.perf_counter() - start
        best = {k: min(v, best.get(k, v)) for k, v in seconds.items()}
    return best


def stage_table(model: str) -> dict[str, dict[str, float]]:
    """``stages`` in a fresh process per thread count, side by side."""
    import subprocess

    out = {}
    for threads in (1, 2):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(
            [sys.executable, __file__, "--stages-worker", str(threads), "--model", model],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        out[threads] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n{f'stage ({model} shape, one step)':32s} {'1 thread s':>10s} {'2 threads s':>11s} {'speed-up':>9s}")
    for stage in out[1]:
        print(f"{stage:32s} {out[1][stage]:10.2f} {out[2][stage]:11.2f} {out[1][stage] / out[2][stage]:9.2f}")
    return out


def table(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    med = {label: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for label, rs in runs.items()}
    sync, trl = med["ours sync, 2 threads"], med["trl, 2 threads"]
    print(f"\n{'row':32s} {'steps/s':>8s} {'x sync':>7s} {'x trl':>7s} {'peak RSS MB':>12s} {'x trl':>6s}")
    for label, m in med.items():
        m["x_sync"], m["x_trl"] = m["steps_per_s"] / sync["steps_per_s"], m["steps_per_s"] / trl["steps_per_s"]
        m["rss_x_trl"] = m["peak_rss_mb"] / trl["peak_rss_mb"]
        print(
            f"{label:32s} {m['steps_per_s']:8.3f} {m['x_sync']:7.2f} {m['x_trl']:7.2f} "
            f"{m['peak_rss_mb']:12.0f} {m['rss_x_trl']:6.2f}"
        )
    return med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(MODEL_DEFAULTS), default="gen")
    p.add_argument("--engine", choices=["lean", "hf"], default="lean", help="our rows' engine (inside AsyncRollouts)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2, help="untimed optimiser steps first (k = 1 fills one batch)")
    p.add_argument("--steps", type=int, default=8, help="timed optimiser steps")
    p.add_argument("--seed", type=int, default=0, help="the first seed (of the repeats, or of --learning's seeds)")
    p.add_argument("--json", type=Path)
    p.add_argument("--learning", action="store_true", help="instead: held-out accuracy, sync vs async k = 1")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--learning-steps", type=int, default=300)
    p.add_argument("--learning-rate", type=float, help="--learning: instead of the template's (1e-3)")
    p.add_argument("--correction", help="--learning: the async row's update.sampling_correction (default: ours)")
    p.add_argument(
        "--learning-rows", nargs="+", choices=("sync", "async"), default=["sync", "async"], help="--learning's rows"
    )
    p.add_argument("--reward-delay", type=float, default=0.0, help="seconds each reward call waits (every row)")
    p.add_argument("--stages", action="store_true", help="instead: each stage of a step alone, 1 and 2 threads")
    p.add_argument("--stages-worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stages_worker:
        print(json.dumps(stages(args.stages_worker, args.model)))
        return
    print(f"$ {shlex.join(sys.orig_argv)}  (load average {os.getloadavg()})", flush=True)
    report = {"command": shlex.join(sys.orig_argv)}
    if args.learning:
        report["accuracy"] = learning(args)
    elif args.stages:
        report["stages"] = stage_table(args.model)
    else:
        report["runs"] = measure(args)
        report["medians"] = table(report["runs"])
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
