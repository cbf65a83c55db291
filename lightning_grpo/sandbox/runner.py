"""Untrusted Python + cases -> what it printed or returned per case, run in a kernel sandbox. Knows no verdicts.

A case is a stdin to run the program on, an expression to evaluate against the program's definitions, or test
code to run against them. The result holds, per case, the program's stdout, the value as tagged JSON
(``records.decode_value`` reads it back), or an empty output for test code that ran to the end; ``None`` when the
case did not finish. Expected outputs are never sent in: the caller compares (``code_tests.py``).

The program and the test code run in separate processes (``inside/``): the program's process answers calls over
a pipe and only literals come back, so nothing the program defines reaches the tests. Layers, each covering
another's gap:

- kernel namespaces through bubblewrap (``isolation.py``): own pid, mount, network, ipc, uts and user
  namespaces, own ``/proc``, read-only interpreter, a private tmpfs, no environment; the sandbox's first process
  is non-dumpable, so the program cannot write to it, and the whole namespace dies with it;
- a cgroup around the whole sandbox (``cgroups.py``): memory, CPU quota and process count of all its processes
  together; the kill goes through it, so a detached process dies too;
- rlimits set in the program's process before the code runs: CPU seconds, address space, file size, processes;
- a wall-clock deadline enforced here (a ``time.sleep`` uses no CPU), then SIGKILL;
- the program's own stdout/stderr read through a bounded buffer keeping the last ``LOG_BYTES``; each case's
  output is capped at ``max_output_bytes``, a value's text at ``max_value_bytes`` before anything parses it.

Where namespaces are refused, ``isolation="auto"`` falls back to process mode (rlimits, a session kill, an
audit hook) with a warning naming what is lost; ``"strict"`` raises instead. Where a cgroup controller is
refused, a warning says what is lost and ``Sandbox.isolation.lost`` lists it.
"""

from __future__ import annotations

import marshal
import math
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lightning_grpo.sandbox.cgroups import CgroupLimits, SandboxCgroup
from lightning_grpo.sandbox.isolation import (
    BOOTSTRAP,
    INNER_BOOTSTRAP,
    ISOLATION_MODES,
    PYTHON_FLAGS,
    Isolation,
    bwrap_command,
    interpreter,
    network_namespace_prefix,
    probe,
)
from lightning_grpo.sandbox.records import MAX_VALUE_BYTES, SandboxResult, result
from lightning_grpo.sandbox.supervise import supervise

CASE_KINDS = ("stdin", "value", "script")
REPORT_CAP_BYTES = 64 * 2**20  # records beyond this are dropped: those cases count as unfinished
SUPERVISOR_MB = 48  # the cgroup's share for bwrap and the first process, on top of the program's memory_mb
HARNESS_PROCESSES = 2  # the sandbox's first process (inside/boot.py) and the zygote that forks the program's


@dataclass(frozen=True)
class Case:
    """One thing to run: ``kind`` "stdin" (``source`` is the stdin), "value" (an expression) or "script"."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in CASE_KINDS or not isinstance(self.source, str):
            raise ValueError(f"Case kind must be one of {list(CASE_KINDS)} with a str source, got {self!r:.200}")


@dataclass
class SandboxCounters:
    """Since the last ``Sandbox.metrics(reset=True)``: programs run, wall-clock timeouts, deaths by signal, and
    runs the sandbox itself failed (it could not start, or could not fork a program process: each scores as
    unfinished, through no fault of the program; a non-zero count needs a look)."""

    programs: int = 0
    timeouts: int = 0
    killed: int = 0
    failures: int = 0


def _check_settings(
    *,
    timeout_seconds,
    cpu_seconds,
    memory_mb,
    file_size_mb,
    max_output_bytes,
    max_value_bytes,
    cpus,
    max_processes,
    max_workers,
    isolation,
) -> None:
    """Every ``Sandbox`` setting, each error naming the setting, its value and what is allowed."""
    for name, value in [("timeout_seconds", timeout_seconds), ("memory_mb", memory_mb), ("cpus", cpus)]:
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    for name, value in [("file_size_mb", file_size_mb), ("max_output_bytes", max_output_bytes)]:
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if not 0 < max_value_bytes <= MAX_VALUE_BYTES:
        cap = MAX_VALUE_BYTES
        raise ValueError(f"max_value_bytes must be in [1, {cap}] (the trainer's cap), got {max_value_bytes}")
    if cpu_seconds is not None and cpu_seconds < 1:
        raise ValueError(f"cpu_seconds must be >= 1 or None (ceil of timeout_seconds + 1), got {cpu_seconds}")
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be >= 1 or None (one per CPU), got {max_workers}")
    if max_processes < 1:
        raise ValueError(f"max_processes must be >= 1 (the harness itself), got {max_processes}")
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {list(ISOLATION_MODES)}, got {isolation!r}")


class Sandbox:
    """Runs untrusted Python programs on cases, several at a time, and returns what they produced.

    Args:
        timeout_seconds: wall-clock limit per program (all its cases), start to kill.
        cpu_seconds: CPU-time limit (RLIMIT_CPU); default ``ceil(timeout_seconds) + 1``, a backstop one second
            behind the wall-clock deadline so the two never race (CPU time never exceeds wall time).
        memory_mb: address-space limit per process (RLIMIT_AS; the interpreter itself needs ~30 MB) and, with a
            memory cgroup, the resident memory of all the program's processes together (the cgroup adds the
            tmpfs, 2 x ``file_size_mb``, and ``SUPERVISOR_MB`` for the sandbox's own processes).
        file_size_mb: largest file the program may write (RLIMIT_FSIZE), and the size of its tmpfs.
        max_output_bytes: stdout kept per case; a longer output is cut (and so will not match).
        max_value_bytes: longest text of a value (its ``repr`` from the program, its JSON to the trainer); a
            longer one is not parsed and the case fails. At most ``MAX_VALUE_BYTES``, the trainer's own cap.
        cpus: CPUs the whole sandbox may use at once (a cgroup CPU quota), so its CPU time stays below
            ``cpus * timeout_seconds`` however many processes it starts.
        max_processes: processes and threads a program may have at once, its own process included (the
            sandbox's first process, its zygote and bwrap are budgeted beside them).
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
        max_value_bytes: int = MAX_VALUE_BYTES,
        cpus: float = 1.0,
        max_processes: int = 16,
        max_workers: int | None = None,
        isolation: str = "auto",
    ) -> None:
        _check_settings(**{k: v for k, v in locals().items() if k != "self"})  # the arguments, by name
        self.timeout_seconds = timeout_seconds
        self.cpu_seconds = cpu_seconds or math.ceil(timeout_seconds) + 1
        self.memory_mb = memory_mb
        self.file_size_mb = file_size_mb
        self.max_output_bytes = max_output_bytes
        self.max_value_bytes = max_value_bytes
        self.cpus = cpus
        self.max_processes = max_processes
        self.max_workers = max_workers or os.cpu_count() or 1
        self.isolation_mode = isolation
        self.counters = SandboxCounters()
        self._lock = threading.Lock()
        if isolation == "strict":
            self.isolation  # noqa: B018 - strict refuses at construction (start-up), not at the first reward

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy`` of a config's default, a reward sent to another process) gets a lock of its own:
        a lock does not pickle, and a copy counts its own programs."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def isolation(self) -> Isolation:
        """How programs start, probed once per process: at construction for ``strict`` (which raises without
        namespaces), else on first use (``auto`` warns then, once)."""
        return probe(self.isolation_mode)

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """``sandbox/programs``, ``/timeouts``, ``/killed``, ``/failures`` since the last reset, and
        ``sandbox/cgroup`` (1.0 when a memory, CPU and pids cgroup bounds each sandbox, else 0.0: see the warning)."""
        with self._lock:
            counters = self.counters
            if reset:
                self.counters = SandboxCounters()
        bounded = float(not self.isolation.lost)
        return {**{f"sandbox/{k}": float(v) for k, v in vars(counters).items()}, "sandbox/cgroup": bounded}

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
        job = {"code": code, "cases": [[c.kind, c.source] for c in cases], "token": token, "limits": self._limits()}
        try:
            outcome = self._execute(marshal.dumps(job), token, len(cases))
        except OSError as err:
            unfinished, error = [None] * len(cases), f"sandbox failed to run: {err}"
            outcome = SandboxResult(unfinished, unfinished[:], error=error, sandbox_failed=True)
        with self._lock:
            self.counters.failures += outcome.sandbox_failed
            self.counters.programs += 1
            self.counters.timeouts += outcome.timed_out
            self.counters.killed += outcome.killed
        return outcome

    def _limits(self) -> dict:
        return {
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_mb * 2**20,
            "file_size_bytes": self.file_size_mb * 2**20,
            # RLIMIT_NPROC counts the user's processes: in the sandbox's user namespace the first process and the
            # zygote run as the program's user too (root is exempt: there the pids cgroup binds)
            "user_processes": self.max_processes + HARNESS_PROCESSES,
            "max_output_bytes": self.max_output_bytes,
            "max_value_bytes": self.max_value_bytes,
            "block_processes": self.isolation.block_processes,
        }

    def _cgroup(self, isolation: Isolation) -> SandboxCgroup | None:
        """The sandbox's cgroup: the program's memory plus the tmpfs and the supervisor; the program's
        ``max_processes`` plus ours (``HARNESS_PROCESSES``) and the launcher's (bwrap's outer process)."""
        if not isolation.cgroups:
            return None
        memory = (self.memory_mb + 2 * max(self.file_size_mb, 1) + SUPERVISOR_MB) * 2**20
        pids = self.max_processes + HARNESS_PROCESSES + isolation.launcher_processes
        return SandboxCgroup(isolation.cgroups, CgroupLimits(memory, self.cpus, pids))

    def _execute(self, job: bytes, token: str, n: int) -> SandboxResult:
        isolation, workdir = self.isolation, None
        cgroup = self._cgroup(isolation)
        prefix = cgroup.enter_prefix() if cgroup else []
        try:
            if isolation.kernel:
                tmpfs = max(self.file_size_mb, 1) * 2**20
                command = [*prefix, *bwrap_command(isolation.bwrap, tmpfs), interpreter(), *PYTHON_FLAGS]
                command.append(INNER_BOOTSTRAP)
                env, cwd = {}, "/"
            else:
                workdir = tempfile.mkdtemp(prefix="lightning_grpo_sandbox_")
                command = [*prefix, *network_namespace_prefix(), sys.executable, *PYTHON_FLAGS, BOOTSTRAP]
                env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
                cwd = workdir
            return self._supervise(command, env, cwd, job, token, n, cgroup)
        finally:
            if cgroup is not None:
                cgroup.kill()
                cgroup.remove()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _supervise(
        self, command: list[str], env: dict, cwd: str, job: bytes, token: str, n: int, cgroup: SandboxCgroup | None
    ) -> SandboxResult:
        cap = min(REPORT_CAP_BYTES, n * (max(self.max_output_bytes, self.max_value_bytes) + 2048) + 4096)
        ended = supervise(command, env, cwd, job, time.monotonic() + self.timeout_seconds, cap, cgroup)
        oom = cgroup is not None and cgroup.out_of_memory()
        return result(*ended[:2], token, n, ended[2], ended[3], self.timeout_seconds, oom)
