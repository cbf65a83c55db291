"""Untrusted Python + cases -> what it printed or returned per case, run in a kernel sandbox. Knows no verdicts.

A case is a stdin to run the program on, an expression to evaluate after defining the code, or a test script
to run after it. The result holds, per case, the program's stdout, the ``repr`` of the value, or an empty
output for a script that ran to the end; ``None`` when the case did not finish. Expected outputs are never
sent in: the caller compares (``code_tests.py``), so nothing the program does inside can hand out a pass.

Layers, each covering another's gap (``sandbox_isolation.py`` has the namespaces):

- kernel namespaces through bubblewrap: own pid, mount, network, ipc, uts and user namespaces, own ``/proc``,
  read-only interpreter, a private tmpfs, no environment; the whole namespace dies with the program;
- rlimits set by the child before the code runs: CPU seconds, address space, file size, processes; as root a
  pids cgroup per program as well (RLIMIT_NPROC does not bind root);
- a wall-clock deadline enforced here (a ``time.sleep`` uses no CPU), then SIGKILL;
- the program's own stdout/stderr read through a bounded buffer keeping the last ``LOG_BYTES``; each case's
  output is capped at ``max_output_bytes``.

Where namespaces are refused, ``isolation="auto"`` falls back to process mode (rlimits, a session kill, an
audit hook) with a warning naming what is lost; ``"strict"`` raises instead.
"""

from __future__ import annotations

import marshal
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache

from lightning_grpo.sandbox.isolation import (
    BOOTSTRAP,
    INNER_BOOTSTRAP,
    ISOLATION_MODES,
    PYTHON_FLAGS,
    Isolation,
    PidsCgroup,
    bwrap_command,
    interpreter,
    probe,
)

CASE_KINDS = ("stdin", "value", "script")
LOG_BYTES = 8192
REPORT_CAP_BYTES = 64 * 2**20  # records beyond this are dropped: those cases count as unfinished
_READ_CHUNK = 65536


@dataclass(frozen=True)
class Case:
    """One thing to run: ``kind`` "stdin" (``source`` is the stdin), "value" (an expression) or "script"."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in CASE_KINDS or not isinstance(self.source, str):
            raise ValueError(f"Case kind must be one of {list(CASE_KINDS)} with a str source, got {self!r:.200}")


@dataclass
class SandboxResult:
    """What one program produced, case by case; ``None`` where a case did not finish."""

    outputs: list[bytes | None]  # stdout (stdin case), repr of the value (value case), b"" (script ran to the end)
    errors: list[str | None] = field(default_factory=list)  # per case: exception, exit, or None
    timed_out: bool = False  # killed at the wall-clock deadline
    killed: bool = False  # died of a signal (a resource limit or a crash), not the deadline
    log: str = ""  # the last LOG_BYTES of what the program wrote to stdout/stderr outside stdin cases
    error: str | None = None  # first failure: case error, timeout, signal or sandbox failure


@dataclass
class SandboxCounters:
    """Since the last ``Sandbox.metrics(reset=True)``: programs run, wall-clock timeouts, deaths by signal, and
    runs the sandbox itself failed to start (each scores as unfinished: a non-zero count needs a look)."""

    programs: int = 0
    timeouts: int = 0
    killed: int = 0
    failures: int = 0


@cache
def network_namespace_prefix() -> tuple[str, ...]:
    """Process mode: ``("unshare", "--net", "--")`` where a network namespace may be created, else ``()``."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    try:
        ok = subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (unshare, "--net", "--") if ok else ()


class Sandbox:
    """Runs untrusted Python programs on cases, several at a time, and returns what they produced.

    Args:
        timeout_seconds: wall-clock limit per program (all its cases), start to kill.
        cpu_seconds: CPU-time limit (RLIMIT_CPU); default ``ceil(timeout_seconds) + 1``, a backstop one second
            behind the wall-clock deadline so the two never race (CPU time never exceeds wall time).
        memory_mb: address-space limit per process (RLIMIT_AS). The interpreter itself needs ~30 MB.
        file_size_mb: largest file the program may write (RLIMIT_FSIZE), and the size of its tmpfs.
        max_output_bytes: stdout kept per case; a longer output is cut (and so will not match).
        max_processes: processes and threads a program may have at once, the harness included.
        max_workers: programs run at once; default the number of CPUs.
        isolation: "auto" (kernel namespaces, else process mode with a warning), "strict" (namespaces or
            raise), "process" (rlimits and an audit hook only: for debugging).

    >>> sandbox = Sandbox(timeout_seconds=5)
    >>> sandbox.run("def add(a, b):\\n    return a + b", [Case("value", "add(1, 2)")]).outputs
    [b'3']
    """

    def __init__(
        self,
        timeout_seconds: float = 5.0,
        cpu_seconds: int | None = None,
        memory_mb: int = 512,
        file_size_mb: int = 16,
        max_output_bytes: int = 2**20,
        max_processes: int = 16,
        max_workers: int | None = None,
        isolation: str = "auto",
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
        if max_processes < 1:
            raise ValueError(f"max_processes must be >= 1 (the harness itself), got {max_processes}")
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {list(ISOLATION_MODES)}, got {isolation!r}")
        self.timeout_seconds = timeout_seconds
        self.cpu_seconds = cpu_seconds or math.ceil(timeout_seconds) + 1
        self.memory_mb = memory_mb
        self.file_size_mb = file_size_mb
        self.max_output_bytes = max_output_bytes
        self.max_processes = max_processes
        self.max_workers = max_workers or os.cpu_count() or 1
        self.isolation_mode = isolation
        self.counters = SandboxCounters()
        self._lock = threading.Lock()
        if isolation == "strict":
            self.isolation  # noqa: B018 - strict refuses at construction (start-up), not at the first reward

    @property
    def isolation(self) -> Isolation:
        """How programs start, probed once per process: at construction for ``strict`` (which raises without
        namespaces), else on first use (``auto`` warns then, once)."""
        return probe(self.isolation_mode)

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """``sandbox/programs``, ``sandbox/timeouts``, ``sandbox/killed``, ``sandbox/failures`` since the last reset."""
        with self._lock:
            counters = self.counters
            if reset:
                self.counters = SandboxCounters()
        return {f"sandbox/{k}": float(v) for k, v in vars(counters).items()}

    def run_many(self, codes: list[str], cases: list[list[Case]]) -> list[SandboxResult]:
        """``run(codes[i], cases[i])`` for every i, ``max_workers`` at a time, results in input order."""
        if len(codes) != len(cases):
            raise ValueError(f"got {len(codes)} programs but {len(cases)} case lists: give one list per program")
        if not codes:
            return []
        self.isolation  # noqa: B018 - probe (and warn or raise) once, before the threads start
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(codes))) as pool:
            return list(pool.map(self.run, codes, cases))

    def run(self, code: str, cases: list[Case]) -> SandboxResult:
        """Run ``code`` on each case. Never raises for anything the program does; a sandbox failure (e.g. bwrap
        refused) is reported in ``error`` with every case unfinished."""
        cases = [c if isinstance(c, Case) else Case(*c) for c in cases]
        token = secrets.token_hex(16)
        job = {"code": code, "cases": [[c.kind, c.source] for c in cases], "token": token, **self._limits()}
        failed = False
        try:
            result = self._execute(marshal.dumps(job), token, len(cases))
        except OSError as err:
            failed = True
            result = SandboxResult([None] * len(cases), [None] * len(cases), error=f"sandbox failed to run: {err}")
        with self._lock:
            self.counters.failures += failed
            self.counters.programs += 1
            self.counters.timeouts += result.timed_out
            self.counters.killed += result.killed
        return result

    def _limits(self) -> dict:
        return {
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_mb * 2**20,
            "file_size_bytes": self.file_size_mb * 2**20,
            "max_processes": self.max_processes,
            "max_output_bytes": self.max_output_bytes,
            "block_processes": self.isolation.block_processes,
        }

    def _execute(self, job: bytes, token: str, n: int) -> SandboxResult:
        isolation, cgroup, workdir = self.isolation, None, None
        try:
            if isolation.kernel:
                cgroup = PidsCgroup(isolation.pids_cgroup, self.max_processes + 2) if isolation.pids_cgroup else None
                tmpfs = max(self.file_size_mb, 1) * 2**20
                command = [*(cgroup.enter_prefix() if cgroup else ()), *bwrap_command(isolation.bwrap, tmpfs)]
                command += [interpreter(), *PYTHON_FLAGS, INNER_BOOTSTRAP]
                env, cwd = {}, "/"
            else:
                workdir = tempfile.mkdtemp(prefix="lightning_grpo_sandbox_")
                command = [*network_namespace_prefix(), sys.executable, *PYTHON_FLAGS, BOOTSTRAP]
                env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
                cwd = workdir
            return self._supervise(command, env, cwd, job, token, n)
        finally:
            if cgroup is not None:
                cgroup.remove()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _supervise(self, command: list[str], env: dict, cwd: str, job: bytes, token: str, n: int) -> SandboxResult:
        deadline = time.monotonic() + self.timeout_seconds
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: killpg reaches bwrap or every process-mode child
        )
        try:
            _send(proc, job)
            cap = min(REPORT_CAP_BYTES, n * (self.max_output_bytes + 2048) + 4096)  # output, header, error
            report, log, timed_out = _read(proc, deadline, cap)
            if not timed_out:
                timed_out = _wait(proc, deadline)
        finally:
            _kill_group(proc)
        return _result(report, log, token, n, timed_out, proc.returncode, self.timeout_seconds)


def _send(proc: subprocess.Popen, job: bytes) -> None:
    """The job on stdin; the child reads all of it before running anything, so this cannot deadlock."""
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child died before reading: its exit status says why


def _read(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool]:
    """Records (first ``cap`` bytes) and log (last LOG_BYTES) until both close or ``deadline``; + timed_out."""
    report, log = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ, report)
        selector.register(proc.stderr.fileno(), selectors.EVENT_READ, log)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(report), bytes(log), True
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                elif key.data is report:
                    report += chunk[: max(0, cap - len(report))]
                else:
                    log += chunk
                    del log[: max(0, len(log) - LOG_BYTES)]
    return bytes(report), bytes(log), False


def _wait(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until the child exits or ``deadline`` (its pipes can close first); True if it timed out.

    The exited child is left unreaped (WNOWAIT): while it is a zombie its PID, which is also the process
    group id, cannot be reused, so the ``killpg`` that follows cannot hit an unrelated process.
    """
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return False
        time.sleep(0.002)
    return True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (the child is not reaped yet), then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _records(report: bytes, token: str, n: int) -> tuple[list[bytes | None], list[str | None]]:
    """The first frame of each case index: ``\\n<token> <index> <output length or -1> <error length>\\n`` then the
    output and the error. A malformed frame ends the parse (the cases after it count as unfinished)."""
    outputs: list[bytes | None] = [None] * n
    errors: list[str | None] = [None] * n
    seen, header, at = set(), f"\n{token} ".encode(), 0
    while (at := report.find(header, at)) >= 0:
        end = report.find(b"\n", at + len(header))
        try:
            index, size, error_size = (int(x) for x in report[at + len(header) : end].split(b" "))
        except ValueError:
            break
        start = end + 1
        output = None if size < 0 else report[start : start + size]
        error = report[start + max(size, 0) : start + max(size, 0) + error_size].decode("utf-8", "replace")
        at = start + max(size, 0) + error_size
        if end < 0 or at > len(report) or not -1 <= index < n or error_size < 0:
            break
        if index not in seen:
            seen.add(index)
            if index >= 0:
                outputs[index], errors[index] = output, (error[:500] or None)
            elif error:
                errors.append(error[:500])  # no cases: the definition's error
    return outputs, errors


def _result(
    report: bytes, log: bytes, token: str, n: int, timed_out: bool, returncode: int | None, timeout: float
) -> SandboxResult:
    outputs, errors = _records(report, token, n)
    killed = not timed_out and returncode is not None and (returncode < 0 or returncode > 128)
    result = SandboxResult(outputs[:n], errors[:n], timed_out, killed, log.decode("utf-8", errors="replace"))
    if timed_out:
        result.error = f"timed out after {timeout} s"
    elif killed:
        signum = -returncode if returncode < 0 else returncode - 128
        result.error = f"killed by {_signal_name(signum)} (a resource limit or a crash)"
    else:
        result.error = next((e for e in errors if e is not None), None)
        if result.error is None and (returncode != 0 or None in result.outputs):
            result.error = f"exited with status {returncode} before finishing every case"
    return result


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
