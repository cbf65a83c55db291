"""Completions + gold answers -> 1.0 where math-verify finds them equivalent. Times out safely on any thread.

math-verify (``math_verify.parse/verify``) compares answers symbolically with sympy, and some inputs never
finish (``2^{2^{2^{2^{2}}}}`` against ``3^{3^{3^{3}}}`` tries to expand both). Its own timeout uses
``signal.alarm``, which works only on the main thread and raises a ``BaseException``; a hung thread cannot be
stopped at all. So parse/verify run in a long-lived worker process (``_math_worker.py``, started on first use,
~0.5 s) with math-verify's timeout off; each comparison gets ``timeout_seconds`` and on overrun the worker is
killed, the completion scores 0.0, and the next comparison starts a fresh worker.

The worker runs in its own session: a run-ending signal sent to the process group (Ctrl+C's SIGINT, a
scheduler's SIGTERM or SIGUSR1, a closed terminal's SIGHUP) reaches the trainer, which finishes its step,
and not the worker, which would die mid-comparison and score it 0.0. It still ends with the trainer: it
exits once orphaned, and the trainer kills it at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from lightning_grpo.rewards.text import answer_text, completion_text

WORKER = str(Path(__file__).with_name("_math_worker.py"))
STARTUP_TIMEOUT_SECONDS = 120.0  # importing sympy on a busy 2-core machine; not charged to any comparison


class _Worker:
    """One ``_math_worker.py`` process answering one request at a time (the lock serialises threads)."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.buffer = b""

    def score(self, gold: str, answer: str, timeout: float) -> float | None:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                self.proc.stdin.write((json.dumps({"gold": gold, "answer": answer}) + "\n").encode())
                self.proc.stdin.flush()
                line = self._read_line(time.monotonic() + timeout)
            except BrokenPipeError:
                line = None
            if line is None:  # too slow, or the worker died (e.g. out of memory)
                self.stop()
                return 0.0
            return json.loads(line)["score"]

    def _start(self) -> None:
        self.stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", WORKER, str(self.memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # out of the trainer's process group: group signals are the trainer's to handle
        )
        if self._read_line(time.monotonic() + STARTUP_TIMEOUT_SECONDS) is None:
            self.stop()
            raise RuntimeError(
                f"math_verify_reward's worker ({WORKER}) did not start within {STARTUP_TIMEOUT_SECONDS} s; "
                f"check that `{sys.executable} -I {WORKER} 1024` runs"
            )

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the worker, or None at ``deadline`` or end of output."""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
        self.proc, self.buffer = None, b""


class MathVerifyReward:
    """1.0 where the final answer is mathematically equivalent to the gold answer (math-verify), else 0.0.

    Reads the gold answers from the ``answer`` column, or from ``solution`` (TRL/open-r1's name) when there is
    no ``answer``. A gold answer that does not parse scores ``None`` ("not applicable"), as in TRL's
    ``accuracy_reward``. The completion's final answer is its last ``<answer>`` tag, else the text after
    ``</think>``, else all of it; ``\\boxed{}`` is tried first, then any LaTeX, then a plain expression.

    Args:
        timeout_seconds: limit per comparison; a slower one scores 0.0 and restarts the worker.
        memory_mb: address-space limit of the worker process.

    >>> reward = MathVerifyReward(timeout_seconds=5)
    >>> reward([r"so \\boxed{\\frac{2}{4}}", "The answer is 0.4", "42"], answer=["1/2", "1/2", None])
    [1.0, 0.0, None]
    """

    __name__ = "math_verify_reward"
    is_slow = True  # scoring runs it on a thread, overlapping other reward functions
    is_correctness = True  # its full marks count as accuracy

    def __init__(self, timeout_seconds: float = 5.0, memory_mb: int = 4096) -> None:
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        if memory_mb < 256:
            raise ValueError(f"memory_mb must be >= 256 (sympy alone needs ~150 MB), got {memory_mb}")
        self.timeout_seconds = timeout_seconds
        self.memory_mb = memory_mb
        self._worker = _Worker(memory_mb)
        atexit.register(self._worker.stop)

    def __call__(
        self, completions: list[Any], answer: list[Any] | None = None, solution: list[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        golds = answer if answer is not None else solution
        if golds is None:
            raise ValueError("math_verify_reward needs gold answers in an 'answer' or 'solution' column; got neither")
        if find_spec("math_verify") is None:
            raise ImportError("math_verify_reward needs the math-verify package: pip install 'math-verify>=0.7'")
        return [self._score(c, gold) for c, gold in zip(completions, golds, strict=True)]

    def _score(self, completion: Any, gold: Any) -> float | None:
        if gold is None:
            return None
        return self._worker.score(str(gold), answer_text(completion_text(completion)), self.timeout_seconds)

    def __getstate__(self) -> dict[str, Any]:
        """Settings only: a copy (pickled to another process) starts its own worker."""
        return {"timeout_seconds": self.timeout_seconds, "memory_mb": self.memory_mb}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


math_verify_reward = MathVerifyReward()
