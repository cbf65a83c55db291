"""Throughput of the code sandbox: programs per second and the isolation's overhead per program.

    PYTHONPATH=. python benchmarks/bench_sandbox.py                      # kernel vs process mode, now
    PYTHONPATH=. python benchmarks/bench_sandbox.py --before 0aaf8ee     # and the sandbox of an older commit

Two shapes, each run ``--programs`` times with ``--workers`` programs at once (completions are scored in
parallel), after one warm-up run:
- trivial: ``print(1)`` with one stdin case;
- stdin100: read two numbers, print their sum, on 100 stdin cases in one program.
Overhead per program = sequential latency of the kernel sandbox minus a bare ``python -I -S -c pass`` start
(the floor any process-per-program sandbox pays), and minus process mode (what the namespaces add).
``--before REF`` loads ``sandbox.py`` and ``_sandbox_boot.py`` of a git commit (the audit-hook sandbox before
kernel isolation) into a temporary package and times its API.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from lightning_grpo.sandbox.runner import Case, Sandbox

REPO = Path(__file__).resolve().parents[1]
TRIVIAL = "print(1)"
SUM = "a, b = map(int, input().split())\nprint(a + b)"
STDINS = [f"{i} {2 * i}\n" for i in range(100)]


def shapes_now() -> dict[str, tuple[str, list[Case]]]:
    return {"trivial": (TRIVIAL, [Case("stdin", "")]), "stdin100": (SUM, [Case("stdin", s) for s in STDINS])}


def shapes_before() -> dict[str, tuple[str, list]]:
    """The old API took tests with expected outputs inside: ``{"input", "output"}`` dicts."""
    sums = [{"input": s, "output": str(3 * i)} for i, s in enumerate(STDINS)]
    return {"trivial": (TRIVIAL, [{"input": "", "output": "1"}]), "stdin100": (SUM, sums)}


def load_old_sandbox(ref: str):
    """``Sandbox`` from ``lightning_grpo/sandbox/runner.py`` at ``ref``, with its bootstrap beside it."""
    directory = Path(tempfile.mkdtemp(prefix="old_sandbox_"))
    for name in ("sandbox.py", "_sandbox_boot.py"):
        source = subprocess.run(
            ["git", "show", f"{ref}:lightning_grpo/rewards/{name}"], cwd=REPO, check=True, capture_output=True
        ).stdout
        (directory / name).write_bytes(source)
    spec = importlib.util.spec_from_file_location("old_sandbox", directory / "sandbox.py")
    module = sys.modules["old_sandbox"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sandbox


def per_second(run, programs: int, workers: int) -> tuple[float, float]:
    """(programs/s with ``workers`` at once, sequential ms per program)."""
    run()  # warm-up: probes, page cache
    start = time.perf_counter()
    for _ in range(max(3, programs // 4)):
        run()
    sequential_ms = 1000 * (time.perf_counter() - start) / max(3, programs // 4)
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: run(), range(programs)))
    return programs / (time.perf_counter() - start), sequential_ms


def bare_python_ms(repeats: int = 20) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before", default=None, help="git ref of an older sandbox to time too")
    args = parser.parse_args()
    rows = []
    if args.before:
        old = load_old_sandbox(args.before)(timeout_seconds=10, max_workers=1)
        for shape, (code, tests) in shapes_before().items():
            run = partial(old.run, code, tests)
            rows.append((f"before ({args.before})", shape, *per_second(run, args.programs, args.workers)))
    for isolation in ("process", "strict"):
        sandbox = Sandbox(timeout_seconds=10, max_workers=1, isolation=isolation)
        for shape, (code, cases) in shapes_now().items():
            result = sandbox.run(code, cases)
            assert result.error is None and None not in result.outputs, result
            run = partial(sandbox.run, code, cases)
            rows.append((f"now, {isolation}", shape, *per_second(run, args.programs, args.workers)))
    bare = bare_python_ms()
    print(f"{'sandbox':24s} {'shape':9s} {'programs/s':>10s} {'ms/program':>10s}   ({args.workers} workers)")
    for name, shape, rate, latency in rows:
        print(f"{name:24s} {shape:9s} {rate:10.1f} {latency:10.1f}")
    kernel = {shape: (rate, latency) for name, shape, rate, latency in rows if name == "now, strict"}
    process = {shape: (rate, latency) for name, shape, rate, latency in rows if name == "now, process"}
    print(f"bare `python -I -S -c pass`: {bare:.1f} ms")
    for shape, (rate, latency) in kernel.items():
        parallel = 1000 / rate - 1000 / process[shape][0]  # wall time per program, amortised over the workers
        print(
            f"overhead per program ({shape}): sequential {latency - bare:.1f} ms over a bare python start, "
            f"{latency - process[shape][1]:.1f} ms over process mode; with {args.workers} workers "
            f"{parallel:.1f} ms over process mode ({1000 / rate:.1f} ms per program in all)"
        )


if __name__ == "__main__":
    main()
