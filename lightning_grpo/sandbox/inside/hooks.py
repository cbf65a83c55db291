"""Process mode only: a program's process -> audit hooks refusing process creation, network and writes outside its
working directory. Knows nothing else. Without kernel namespaces these are the (bypassable) walls: a native call
(``ctypes`` is blocked, but not every door) goes past them. Root ignores RLIMIT_NPROC, so without a pids cgroup
process creation stays blocked here too.
"""

import os
import sys

BLOCKED_EVENTS = frozenset(
    {"os.exec", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.posix_spawn", "os.spawn", "os.system"}
    | {"signal.pthread_kill", "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym", "socket.__new__"}
    | {"socket.bind", "socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto"}
)
BLOCKED_IMPORTS = frozenset({"_posixsubprocess", "_thread", "threading", "_ctypes", "ctypes"})
PATH_EVENTS = frozenset(
    {"os.chmod", "os.chown", "os.link", "os.mkdir", "os.remove", "os.rename", "os.rmdir", "os.symlink"}
    | {"os.truncate", "os.utime", "shutil.rmtree"}
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def block_processes_and_network(workdir):
    """Process mode: a hook raising PermissionError on process creation, network and writes outside ``workdir``."""
    import _posixsubprocess
    import _thread
    import threading

    def blocked(*args, **kwargs):
        raise PermissionError("sandbox: starting a process or thread is blocked")

    _posixsubprocess.fork_exec = blocked  # no audit event for these C entry points in 3.11
    _thread.start_new_thread = threading._start_new_thread = blocked
    if hasattr(_thread, "start_joinable_thread"):  # 3.13+
        _thread.start_joinable_thread = threading._start_joinable_thread = blocked

    def inside(path):
        return isinstance(path, int) or os.path.realpath(os.fsdecode(path)).startswith(workdir + os.sep)

    def hook(event, args):
        if event == "import" and args[0] in BLOCKED_IMPORTS:
            raise ImportError(f"sandbox: import {args[0]} is blocked")
        if event in BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {event} is blocked")
        if event == "open" and _writes(args) and not inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the working directory is blocked")
        if event in PATH_EVENTS and not all(inside(a) for a in args if isinstance(a, str | bytes)):
            raise PermissionError(f"sandbox: {event} {args[0]!r} outside the working directory is blocked")

    sys.addaudithook(hook)


def _writes(args):
    _, mode, flags = args
    return bool((isinstance(mode, str) and set(mode) & set("wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS))
