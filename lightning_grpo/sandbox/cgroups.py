"""Limits of one sandbox -> a memory, CPU and pids cgroup around all its processes, and the kill through it.

Knows the cgroup file systems (v1 per-controller hierarchies, or v2); nothing about programs or tests.

rlimits bind one process each; a cgroup binds the sandbox as a whole: ``memory`` (the resident memory of every
process together, its tmpfs pages included), ``cpu`` (a CFS quota: at most ``cpus`` CPUs at once, so CPU time
never exceeds ``cpus`` x the wall-clock deadline) and ``pids`` (processes and threads: RLIMIT_NPROC does not bind
root). A process cannot leave it (the cgroup file system is not mounted inside), so the kill reaches every
process however it detached: ``cgroup.kill`` on v2, else each member by a pidfd checked against the member list.
Per-sandbox cgroups nest under this process's own cgroup where it may create them (so an outer limit, such as a
container's, still binds), else under the hierarchy's root.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CONTROLLERS = ("memory", "cpu", "pids")
GROUP = "lightning_grpo_sandbox"
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupLimits:
    """What one sandbox may use in all: bytes of memory, CPUs at once, processes and threads."""

    memory_bytes: int
    cpus: float
    max_pids: int

    def files(self, controller: str, version: int) -> list[tuple[str, str]]:
        """(file, value) pairs that set this controller's limit, in the order the kernel accepts them."""
        quota = str(max(1000, int(self.cpus * CPU_PERIOD_US)))
        table = {
            ("memory", 1): [("memory.limit_in_bytes", str(self.memory_bytes))]
            + [("memory.memsw.limit_in_bytes", str(self.memory_bytes))],  # no escape into swap
            ("memory", 2): [("memory.max", str(self.memory_bytes)), ("memory.swap.max", "0")],
            ("cpu", 1): [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota)],
            ("cpu", 2): [("cpu.max", f"{quota} {CPU_PERIOD_US}")],
            ("pids", 1): [("pids.max", str(self.max_pids))],
            ("pids", 2): [("pids.max", str(self.max_pids))],
        }
        return table[controller, version]


class SandboxCgroup:
    """One sandbox's cgroup (a leaf per hierarchy on v1, one on v2), created with its limits set.

    Args:
        parents: controller -> (cgroup version, directory to create the leaf in), from ``cgroup_parents()``.
        limits: the sandbox's memory, CPU and process limits.
    """

    def __init__(self, parents: dict[str, tuple[int, Path]], limits: CgroupLimits) -> None:
        name = secrets.token_hex(8)
        self.leaves: list[Path] = []
        self.version = {controller: version for controller, (version, _) in parents.items()}
        self.leaf = {}
        for controller, (version, parent) in parents.items():
            leaf = parent / name
            if leaf not in self.leaves:
                leaf.mkdir()
                self.leaves.append(leaf)
            self.leaf[controller] = leaf
            for file, value in limits.files(controller, version):
                if (leaf / file).exists():
                    (leaf / file).write_text(value)

    def enter_prefix(self) -> list[str]:
        """``sh`` moves itself into every leaf, then execs the rest: all it starts is counted and bounded there."""
        moves = " && ".join(f"echo $$ > {leaf}/cgroup.procs" for leaf in self.leaves)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "sh"]

    def members(self) -> set[int]:
        found: set[int] = set()
        for leaf in self.leaves:
            try:
                found |= {int(pid) for pid in (leaf / "cgroup.procs").read_text().split()}
            except OSError:
                continue
        return found

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL every process in the cgroup, including those that left the process group or session."""
        kill_file = self.leaves[0] / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
            return
        deadline = time.monotonic() + timeout
        while (pids := self.members()) and time.monotonic() < deadline:
            _kill_members(pids, self.members)
            time.sleep(0.001)

    def out_of_memory(self) -> bool:
        """Whether the kernel's OOM killer killed a process of this sandbox (its memory limit was reached)."""
        leaf = self.leaf.get("memory")
        if leaf is None:
            return False
        name = "memory.oom_control" if self.version["memory"] == 1 else "memory.events"
        try:
            lines = (leaf / name).read_text().splitlines()
        except OSError:
            return False
        return any(line.split()[:1] == ["oom_kill"] and line.split()[1] != "0" for line in lines)

    def remove(self, timeout: float = 5.0) -> bool:
        """Wait until the last process is reaped (pid namespace teardown is asynchronous), then remove it. A leaf
        still busy at ``timeout`` (a machine too loaded to reap in time) is retried by later calls, once each."""
        deadline = time.monotonic() + timeout
        late = []
        for leaf in self.leaves:
            while not _rmdir(leaf):
                if time.monotonic() > deadline:
                    late.append(leaf)
                    break
                time.sleep(0.001)
        with _stragglers_lock:
            retried = {leaf for leaf in _stragglers if _rmdir(leaf)}
            _stragglers.difference_update(retried)
            _stragglers.update(late)
        return not late


_stragglers: set[Path] = set()  # leaves a remove() gave up on
_stragglers_lock = threading.Lock()


def _rmdir(leaf: Path) -> bool:
    try:
        leaf.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _kill_members(pids: set[int], members) -> None:
    """SIGKILL through pidfds opened first and then checked against a fresh member list: a pid reused by a
    process outside the cgroup between the two reads is never signalled."""
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except OSError:
            continue  # already gone
    still = members()
    for pid, fd in fds.items():
        try:
            if pid in still:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


def _mounts() -> list[tuple[str, Path, set[str]]]:
    """(type, mount point, options) of every cgroup and cgroup2 mount."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, options, *_ = line.split()
        if kind in ("cgroup", "cgroup2"):
            found.append((kind, Path(point), set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path, from ``/proc/self/cgroup``."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path.lstrip("/")
    return own


def _candidates(controller: str) -> list[tuple[int, Path]]:
    """Where a leaf for ``controller`` could be made: under this process's own cgroup first, then the root."""
    own = _own_paths()
    found = []
    for kind, point, options in _mounts():
        if kind == "cgroup" and controller in options and controller in own:
            found += [(1, point / own[controller]), (1, point)]
        elif kind == "cgroup2" and controller in _read_words(point / "cgroup.controllers"):
            found += [(2, point / own.get("", "")), (2, point)]
    return list(dict.fromkeys(found))


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _usable_parent(version: int, base: Path, controller: str) -> Path | None:
    """``base/GROUP`` if a leaf with ``controller`` can be created and entered there, else None (and no
    directory left behind). On v2 the controller must be enabled below ``base``: refused (EBUSY) where ``base``
    has processes of its own and is not the root, as a container's or a service's cgroup usually has."""
    parent = base / GROUP
    created = not parent.exists()
    try:
        parent.mkdir(exist_ok=True)
        if version == 2:
            for directory in (base, parent):
                if controller not in _read_words(directory / "cgroup.subtree_control"):
                    (directory / "cgroup.subtree_control").write_text(f"+{controller}")
        if controller == "cpu":
            _weigh_as_cpus(version, parent)
        group = SandboxCgroup({controller: (version, parent)}, CgroupLimits(64 * 2**20, 1.0, 8))
        entered = subprocess.run([*group.enter_prefix(), "true"], capture_output=True, timeout=10).returncode
        group.remove()
        if entered == 0:
            return parent
    except (OSError, subprocess.SubprocessError):
        pass
    if created:
        try:
            parent.rmdir()
        except OSError:
            pass
    return None


def _weigh_as_cpus(version: int, parent: Path) -> None:
    """The group holding every sandbox competes for CPU as one entity: at the default weight, one task's. Weighed
    as one task per CPU, sandboxes running side by side (``max_workers``, one per CPU) keep the share that
    separate processes had before they were grouped, on a machine busy with other work."""
    cpus = os.cpu_count() or 1
    file, value = ("cpu.shares", 1024 * cpus) if version == 1 else ("cpu.weight", min(10_000, 100 * cpus))
    if (parent / file).exists():
        (parent / file).write_text(str(value))


@cache
def cgroup_parents() -> dict[str, tuple[int, Path]]:
    """Controller -> (version, directory) for each of ``CONTROLLERS`` this process may bound sandboxes with;
    probed once per process (root, or a delegated cgroup v2 subtree)."""
    parents = {}
    for controller in CONTROLLERS:
        for version, base in _candidates(controller):
            parent = _usable_parent(version, base, controller)
            if parent is not None:
                parents[controller] = (version, parent)
                break
    return parents
