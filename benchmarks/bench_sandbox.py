"""Throughput of the code sandbox: programs per second and the isolation's overhead per program.

    PYTHONPATH=. python benchmarks/bench_sandbox.py                      # kernel vs process mode, now
    PYTHONPATH=. python benchmarks/bench_sandbox.py --before a45f338     # and the sandbox of an older commit

Four shapes, each run ``--programs`` times with ``--workers`` programs at once (completions are scored in
parallel), after one warm-up run:
- trivial: ``print(1)`` with one stdin case;
- stdin100: read two numbers, print their sum, on 100 stdin cases in one program;
- calls100: ``add(i, 2 * i)`` as 100 value cases (each a call into the program's process and a value back);
- script100: one test script calling ``add`` 100 times in a loop (HumanEval's ``check(candidate)`` shape).
Then what the trainer pays to parse one value text, at the cap and at the old cap.
Overhead per program = sequential latency of the kernel sandbox minus a bare ``python -I -S -c pass`` start
(the floor any process-per-program sandbox pays), and minus process mode (what the namespaces add).
``--before REF`` extracts commit REF (``git archive``) and times its ``Sandbox`` on the same shapes, in a
child process, right before this tree's (its ``Case`` API must match: true since the kernel sandbox).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRIVIAL = "print(1)"
SUM = "a, b = map(int, input().split())\nprint(a + b)"
ADD = "def add(a, b):\n    return a + b"
STDINS = [f"{i} {2 * i}\n" for i in range(100)]
CHECK = "def check(candidate):\n    for i in range(100):\n        assert candidate(i, 2 * i) == 3 * i\ncheck(add)"


def shapes(case) -> dict[str, tuple[str, list]]:
    return {
        "trivial": (TRIVIAL, [case("stdin", "")]),
        "stdin100": (SUM, [case("stdin", s) for s in STDINS]),
        "calls100": (ADD, [case("value", f"add({i}, {2 * i})") for i in range(100)]),
        "script100": (ADD, [case("script", CHECK)]),
    }


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


def measure(label: str, modes: list[str], programs: int, workers: int) -> list[tuple]:
    """Rows (label, mode, shape, programs/s, ms/program) for the ``lightning_grpo`` on ``sys.path``."""
    from lightning_grpo.sandbox.runner import Case, Sandbox

    rows = []
    for isolation in modes:
        sandbox = Sandbox(timeout_seconds=10, max_workers=1, isolation=isolation)
        for shape, (code, cases) in shapes(Case).items():
            result = sandbox.run(code, cases)
            assert result.error is None and None not in result.outputs, result
            run = partial(sandbox.run, code, cases)
            rows.append((label, isolation, shape, *per_second(run, programs, workers)))
    return rows


def before(ref: str, args: argparse.Namespace) -> list[tuple]:
    """The rows of commit ``ref``'s sandbox, measured by this script in a child process on ``ref``'s tree."""
    with tempfile.TemporaryDirectory(prefix="bench_sandbox_") as tree:
        archive = subprocess.run(["git", "archive", ref, "lightning_grpo"], cwd=REPO, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
        command = [sys.executable, __file__, "--rows-of", ref, "--programs", str(args.programs)]
        command += ["--workers", str(args.workers), "--modes", "strict"]
        done = subprocess.run(command, env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin"}, capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.decode()[-2000:])
        return [tuple(row) for row in ast.literal_eval(done.stdout.decode().splitlines()[-1])]


def value_parse_costs() -> str:
    """What the trainer pays to parse one value: ``decode_value`` of the largest text the sandbox lets through
    (``MAX_VALUE_BYTES`` of JSON numbers) against ``ast.literal_eval`` of a 1 MiB ``repr`` (the old cap)."""
    import resource

    from lightning_grpo.sandbox.records import MAX_VALUE_BYTES, decode_value

    text = "[" + ",".join(["0"] * ((MAX_VALUE_BYTES - 2) // 2)) + "]"  # one element per 2 bytes: the worst case
    start = time.perf_counter()
    decode_value(text.encode())
    json_ms = 1000 * (time.perf_counter() - start)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    ast.literal_eval("[" + ", ".join(["0"] * (2**20 // 3)) + "]")
    literal_s = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    return (
        f"value parse: decode_value of {MAX_VALUE_BYTES >> 10} KiB {json_ms:.1f} ms; "
        f"ast.literal_eval of a 1 MiB repr {literal_s:.2f} s, peak RSS +{grown:.0f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before", default=None, help="git ref of an older sandbox to time too, first")
    parser.add_argument("--modes", default="process,strict", help="isolation modes to time, comma-separated")
    parser.add_argument("--rows-of", default=None, help=argparse.SUPPRESS)  # the child process of --before
    args = parser.parse_args()
    if args.rows_of:
        print(repr(measure(f"before ({args.rows_of})", args.modes.split(","), args.programs, args.workers)))
        return
    rows = before(args.before, args) if args.before else []
    rows += measure("now", args.modes.split(","), args.programs, args.workers)
    bare = bare_python_ms()
    header = f"{'sandbox':22s} {'mode':8s} {'shape':9s} {'programs/s':>10s} {'ms/program':>10s}"
    print(f"{header}   ({args.workers} workers)")
    for label, mode, shape, rate, latency in rows:
        print(f"{label:22s} {mode:8s} {shape:9s} {rate:10.1f} {latency:10.1f}")
    print(f"bare `python -I -S -c pass`: {bare:.1f} ms")
    print(value_parse_costs())
    now = {(mode, shape): (rate, latency) for label, mode, shape, rate, latency in rows if label == "now"}
    kernel = {shape: value for (mode, shape), value in now.items() if mode == "strict"}
    process = {shape: value for (mode, shape), value in now.items() if mode == "process"}
    for shape, (_, latency) in kernel.items():
        if shape in process:
            print(
                f"overhead per program ({shape}): sequential {latency - bare:.1f} ms over a bare python start, "
                f"{latency - process[shape][1]:.1f} ms over process mode"
            )


if __name__ == "__main__":
    main()
