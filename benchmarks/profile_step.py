"""Where one of our GRPO steps spends its time, op by op (``torch.profiler``), with the host syncs counted: the
question the GPU mode of the side-by-side benchmark leaves open (on an H100 the 12M gen model ran 0.84x TRL's
steps/s, kernel-launch bound).

    python benchmarks/profile_step.py --model gen --device cuda      # the benchmark's gen shape, 2 steps profiled
    python benchmarks/profile_step.py --model gen                    # the same on CPU

The run is the benchmark's own (``bench_ours.build`` and ``trainer``: the package's defaults, the shape's settings),
under a real ``Trainer.fit``; the profiler records ``--steps`` optimiser steps after ``--warmup`` unprofiled ones.
Printed: each step's wall, user and kernel seconds and page faults (``getrusage``: the unprofiled warm-up steps are
the ones to read for time), the ops by self time (device time on a GPU), and how often the host waited for the
device (``aten::item`` and ``aten::_local_scalar_dense`` are reads of a device value; each one drains the launch
queue on a GPU). ``--glibc-malloc`` leaves glibc's allocator as it comes, without ``TorchThreads``' reuse of freed
memory:

    python benchmarks/profile_step.py --model smollm2 --prompts-per-step 2 --max-completion-length 16 \\
        --warmup 6 --steps 1 [--glibc-malloc]
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import tempfile
import time
from typing import Any

import lightning as L
from bench_assets import RunSpec
from bench_ours import build, trainer
from torch.profiler import ProfilerActivity, profile
from trl_vs_lightning_grpo import MODEL_DEFAULTS, task_for

from lightning_grpo.callbacks import threads

SYNCS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")


class StepUsage(L.Callback):
    """Prints each optimiser step's wall, user and kernel seconds and minor page faults (this process's)."""

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.start, self.usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        now = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"step {trainer.global_step}: {time.perf_counter() - self.start:.2f} s wall, "
            f"{now.ru_utime - self.usage.ru_utime:.2f} s user, {now.ru_stime - self.usage.ru_stime:.2f} s kernel, "
            f"{now.ru_minflt - self.usage.ru_minflt} page faults",
            flush=True,
        )


class Profiled(L.Callback):
    """Profiles the optimiser steps ``first`` .. ``first + count - 1``."""

    def __init__(self, first: int, count: int, device: str) -> None:
        self.first, self.last = first, first + count - 1
        cuda = [ProfilerActivity.CUDA] if device == "cuda" else []
        self.profiler = profile(activities=[ProfilerActivity.CPU, *cuda])

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.first:
            self.profiler.__enter__()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.last + 1:
            self.profiler.__exit__(None, None, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(MODEL_DEFAULTS), default="gen", help="the benchmark's shape (gen)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu")
    p.add_argument("--warmup", type=int, default=2, help="optimiser steps before the profiled ones (2)")
    p.add_argument("--steps", type=int, default=2, help="optimiser steps profiled (2)")
    p.add_argument("--rows", type=int, default=25, help="ops listed (25)")
    p.add_argument("--prompts-per-step", type=int, help="prompts a step (the shape's)")
    p.add_argument("--max-completion-length", type=int, help="completion tokens at most (the shape's)")
    p.add_argument("--glibc-malloc", action="store_true", help="glibc's allocator as it comes (no freed-memory reuse)")
    args = p.parse_args()
    if args.glibc_malloc:
        threads.reuse_freed_memory = lambda: False
    shape = {"prompts_per_step": args.prompts_per_step, "max_completion_length": args.max_completion_length}
    settings = dataclasses.asdict(MODEL_DEFAULTS[args.model]) | {"device": args.device}
    settings |= {name: value for name, value in shape.items() if value is not None}
    spec = RunSpec(
        side="ours",
        model=args.model,
        task=task_for(args.model),
        beta=0.0,
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        seed=0,
        eval_accuracy=False,
        **settings,
    )
    L.seed_everything(0, verbose=False)
    module, data = build(spec)
    profiled = Profiled(args.warmup, args.steps, args.device)
    with tempfile.TemporaryDirectory() as root:
        fit = trainer(spec, profiled, root)
        fit.callbacks.append(StepUsage())
        fit.fit(module, data)
    events = profiled.profiler.key_averages()
    sort = "self_device_time_total" if args.device == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=args.rows))
    counts = {e.key: e.count for e in events if e.key in SYNCS}
    print(f"host waits for the device over {args.steps} steps: {counts or 'none recorded'}")


if __name__ == "__main__":
    main()
