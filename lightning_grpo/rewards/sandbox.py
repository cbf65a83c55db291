"""Untrusted Python + its tests -> how many tests passed, run in a limited child process. Knows nothing of rewards.

Each program runs as ``python -I _sandbox_boot.py`` in its own session (so one ``os.killpg`` ends it and anything
it started) inside a throwaway directory that is deleted afterwards. Layers, each covering another's gap:

- rlimits set by the child before the code runs: CPU seconds, address space, file size, process count;
- a wall-clock deadline enforced here (a ``time.sleep`` uses no CPU), then SIGKILL to the process group;
- a Python audit hook blocking process creation, sockets, ctypes, threads and file changes outside the
  directory; we may run as root, and root ignores RLIMIT_NPROC;
- a fresh network namespace (``unshare --net``) where the system allows it, so there is no network at all;
- stdout+stderr read through a bounded buffer keeping the last ``max_output_bytes``.

This contains accidents (infinite loops, fork/memory bombs, stray writes, output floods) and the reward
hacks a policy stumbles into. An audit hook is not a security boundary against code written to escape it:
for adversarial code, run the trainer's reward workers in a container or VM as well.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

BOOTSTRAP = str(Path(__file__).with_name("_sandbox_boot.py"))
_READ_CHUNK = 65536


@dataclass
class SandboxResult:
    """What one program did with its tests."""

    passed: int = 0  # tests that passed
    total: int = 0  # tests given
    timed_out: bool = False  # killed at the wall-clock deadline
    stdout: str = ""  # the last ``max_output_bytes`` of stdout+stderr, result line removed
    error: str | None = None  # first failure: exception, blocked action, signal or timeout

    @property
    def score(self) -> float:
        """Fraction of tests passed; 0.0 without tests or on timeout."""
        return self.passed / self.total if self.total and not self.timed_out else 0.0


@cache
def network_namespace_prefix() -> tuple[str, ...]:
    """``("unshare", "--net", "--")`` where this process may create a network namespace, else ``()``."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    try:
        ok = subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (unshare, "--net", "--") if ok else ()


class Sandbox:
    """Runs untrusted Python programs against tests, several at a time.

    Args:
        timeout_seconds: wall-clock limit per program, start to kill.
        cpu_seconds: CPU-time limit (RLIMIT_CPU); default ``ceil(timeout_seconds) + 1``, a backstop one second
            behind the wall-clock deadline so the two never race (CPU time never exceeds wall time).
        memory_mb: address-space limit (RLIMIT_AS). The interpreter itself needs ~30 MB.
        file_size_mb: largest file the program may write (RLIMIT_FSIZE).
        max_output_bytes: how much of the program's output is kept (the tail).
        max_workers: programs run at once; default the number of CPUs.

    >>> Sandbox(timeout_seconds=2).run("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"]).passed
    1
    """

    def __init__(
        self,
        timeout_seconds: float = 5.0,
        cpu_seconds: int | None = None,
        memory_mb: int = 512,
        file_size_mb: int = 16,
        max_output_bytes: int = 16384,
        max_workers: int | None = None,
    ) -> None:
        for name, value in [("timeout_seconds", timeout_seconds), ("memory_mb", memory_mb)]:
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        for name, value in [("file_size_mb", file_size_mb), ("max_output_bytes", max_output_bytes)]:
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if cpu_seconds is not None and cpu_seconds < 1:
            raise ValueError(f"cpu_seconds must be >= 1 or None (ceil of timeout_seconds + 1), got {cpu_seconds}")
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be >= 1 or None (one per CPU), got {max_workers}")
        self.timeout_seconds = timeout_seconds
        self.cpu_seconds = cpu_seconds or math.ceil(timeout_seconds) + 1
        self.memory_mb = memory_mb
        self.file_size_mb = file_size_mb
        self.max_output_bytes = max_output_bytes
        self.max_workers = max_workers or os.cpu_count() or 1

    def run_many(self, codes: list[str], tests: list[list[Any]]) -> list[SandboxResult]:
        """``run(codes[i], tests[i])`` for every i, ``max_workers`` at a time, results in input order."""
        if len(codes) != len(tests):
            raise ValueError(f"got {len(codes)} programs but {len(tests)} test lists: give one list per program")
        if not codes:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(codes))) as pool:
            return list(pool.map(self.run, codes, tests))

    def run(self, code: str, tests: list[Any]) -> SandboxResult:
        """Run ``code``, then each test: an assert statement (str) or ``{"input": stdin, "output": stdout}``.

        Never raises for anything the program does; a sandbox failure (e.g. no ``python``) is reported in
        ``error`` with 0 tests passed.
        """
        for test in tests:
            if not (isinstance(test, str) or (isinstance(test, dict) and {"input", "output"} <= test.keys())):
                raise ValueError(f"each test must be an assert string or an {{'input', 'output'}} dict, got {test!r}")
        token = secrets.token_hex(16)
        job = {"code": code, "tests": list(tests), "token": token, **self._limits()}
        workdir = tempfile.mkdtemp(prefix="lightning_grpo_sandbox_")
        try:
            return self._run_in(workdir, json.dumps(job).encode(), token, len(job["tests"]))
        except OSError as err:
            return SandboxResult(total=len(tests), error=f"sandbox failed to run the program: {err}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _limits(self) -> dict[str, int]:
        return {
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_mb * 2**20,
            "file_size_bytes": self.file_size_mb * 2**20,
        }

    def _run_in(self, workdir: str, job: bytes, token: str, total: int) -> SandboxResult:
        env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        command = [*network_namespace_prefix(), sys.executable, "-I", BOOTSTRAP]
        deadline = time.monotonic() + self.timeout_seconds
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg reaches every descendant
        )
        try:
            _send(proc, job)
            output, timed_out = _read_tail(proc, deadline, self.max_output_bytes)
            if not timed_out:
                timed_out = _wait(proc, deadline)
        finally:
            _kill_group(proc)
        result = _parse_result(output, token, total, timed_out, proc.returncode, self.timeout_seconds)
        result.stdout = result.stdout[-self.max_output_bytes :] if self.max_output_bytes else ""
        return result


def _send(proc: subprocess.Popen, job: bytes) -> None:
    """The job on stdin; the child reads all of it before running anything, so this cannot deadlock."""
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child died before reading: its exit status says why


def _read_tail(proc: subprocess.Popen, deadline: float, limit: int) -> tuple[bytes, bool]:
    """Read stdout until EOF or ``deadline``, keeping its last ``limit`` bytes; ``(tail, timed_out)``."""
    tail = bytearray()
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(tail), True
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                return bytes(tail), False
            tail += chunk
            del tail[: max(0, len(tail) - limit - _READ_CHUNK)]  # keep one chunk spare for the result line


def _wait(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until the child exits or ``deadline`` (stdout can close first); True if it timed out.

    The exited child is left unreaped (WNOWAIT): while it is a zombie its PID, which is also the process
    group id, cannot be reused, so the ``killpg`` that follows cannot hit an unrelated process.
    """
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return False
        time.sleep(0.01)
    return True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (the child is not reaped yet), then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone
    proc.wait()
    proc.stdout.close()


def _parse_result(
    output: bytes, token: str, total: int, timed_out: bool, returncode: int | None, timeout: float
) -> SandboxResult:
    text = output.decode("utf-8", errors="replace")
    before, found, after = text.rpartition(f"\n{token} ")
    printed = before if found else text
    result = SandboxResult(total=total, timed_out=timed_out, stdout=printed)
    if timed_out:
        result.error = f"timed out after {timeout} s"
    elif found:
        report = json.loads(after.strip())
        result.passed, result.error = int(report["passed"]), report["error"]
    else:  # it died (a signal from a limit) or exited early (os._exit) before reporting
        result.error = _exit_reason(returncode)
    return result


def _exit_reason(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name} (a resource limit or a crash)"
    return f"exited with status {returncode} before reporting its tests"
