"""A sandbox's command + its job + a deadline -> the record stream, the log, and how it ended; then the kill.

Knows child processes, pipes and the wall clock; nothing about what the records mean (``records.py``). The kill
goes through the sandbox's cgroup when there is one (a process that left the session included), and to the
process group always.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time

from lightning_grpo.sandbox.cgroups import SandboxCgroup

LOG_BYTES = 8192
_READ_CHUNK = 65536


def supervise(
    command: list[str], env: dict, cwd: str, job: bytes, deadline: float, cap: int, cgroup: SandboxCgroup | None
) -> tuple[bytes, bytes, bool, int | None]:
    """Start ``command``, send ``job`` and read until it ends or ``deadline``: (records, log, timed_out, status)."""
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
        report, log, timed_out = _read(proc, deadline, cap)
        if not timed_out:
            timed_out = _wait(proc, deadline)
    finally:
        _kill(proc, cgroup)
    return report, log, timed_out, proc.returncode


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


def _kill(proc: subprocess.Popen, cgroup: SandboxCgroup | None) -> None:
    """SIGKILL every process of the sandbox: through its cgroup (a process that left the group or the session
    included), and its process group (the child is not reaped yet, so the group id cannot be reused); then reap."""
    if cgroup is not None:
        cgroup.kill()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
