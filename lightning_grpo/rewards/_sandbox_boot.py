"""Child side of the sandbox: one JSON job on stdin -> limits, an audit hook, the untrusted code, a result line.

Started by ``sandbox.py`` as ``python -I _sandbox_boot.py`` with the throwaway directory as working directory.
Imports only the standard library (``lightning_grpo`` would pull in torch). Everything before ``run_job``
happens before a line of untrusted code runs; the result goes to stdout as ``<token> <json>`` on the last line,
the token keeping a program that prints a fake result from being believed.
"""

# _posixsubprocess, _thread and threading are imported now so the stubs below cannot be undone by a re-import.
import _posixsubprocess
import _thread
import contextlib
import io
import json
import os
import resource
import sys
import threading

# Process creation and network. Root ignores RLIMIT_NPROC, so this hook is what stops a fork bomb there.
BLOCKED_EVENTS = frozenset(
    {
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "signal.pthread_kill",
        "subprocess.Popen",
        "ctypes.dlopen",  # ctypes can call libc's fork() or connect() past every other check
        "ctypes.dlsym",
        "socket.__new__",
        "socket.bind",
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.sendto",
    }
)
# A re-import would restore what is stubbed or reach ctypes through another door.
BLOCKED_IMPORTS = frozenset({"_posixsubprocess", "_thread", "threading", "_ctypes", "ctypes"})
PATH_EVENTS = frozenset(
    {"os.chmod", "os.chown", "os.link", "os.mkdir", "os.remove", "os.rename", "os.rmdir", "os.symlink"}
    | {"os.truncate", "os.utime", "shutil.rmtree"}
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def limit_resources(job):
    """CPU seconds (SIGKILL one second past the soft limit), address space, file size, processes, no core."""
    cpu, memory, fsize = job["cpu_seconds"], job["memory_bytes"], job["file_size_bytes"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    # The count is per user, so 0 is the only value meaning "no new processes" whatever else the user runs.
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def make_audit_hook(workdir):
    """A hook raising PermissionError on process creation, network, and file changes outside ``workdir``."""

    def inside(path):
        if isinstance(path, int):  # an already-open descriptor
            return True
        return os.path.realpath(os.fsdecode(path)).startswith(workdir + os.sep)

    def hook(event, args):
        if event == "import" and args[0] in BLOCKED_IMPORTS:
            # ImportError, so libraries that treat ctypes as optional (numpy) still import
            raise ImportError(f"sandbox: import {args[0]} is blocked")
        if event in BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {event} is blocked")
        if event == "open" and _writes(args) and not inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the working directory is blocked")
        if event in PATH_EVENTS and not all(inside(a) for a in args if isinstance(a, str | bytes)):
            raise PermissionError(f"sandbox: {event} {args[0]!r} outside the working directory is blocked")

    return hook


def _writes(args):
    _, mode, flags = args
    return bool((isinstance(mode, str) and set(mode) & set("wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS))


def _blocked(*args, **kwargs):
    raise PermissionError("sandbox: starting a process or thread is blocked")


def stub_native_spawners():
    """Replace the C entry points that start processes or threads without raising an audit event (3.11).

    ``subprocess`` and ``multiprocessing`` reach ``_posixsubprocess.fork_exec``. Threads are stopped too, so
    every user sees the same rules: RLIMIT_NPROC already stops threads for non-root users, not for root.
    """
    _posixsubprocess.fork_exec = _blocked
    _thread.start_new_thread = threading._start_new_thread = _blocked
    if hasattr(_thread, "start_joinable_thread"):  # 3.13+
        _thread.start_joinable_thread = threading._start_joinable_thread = _blocked


def _exec(source, namespace):
    """None when ``source`` ran to the end (or exited with status 0), else a one-line reason."""
    try:
        exec(compile(source, "<solution>", "exec"), namespace)
    except SystemExit as err:
        return None if err.code in (None, 0) else f"SystemExit: {err.code}"
    except BaseException as err:  # noqa: B036 - untrusted code may raise anything; it all means "failed"
        return f"{type(err).__name__}: {err}"[:500]
    return None


def run_assert_tests(code, tests):
    """Define the code once (``__name__`` is not ``"__main__"`` so a main guard waiting on input stays idle)."""
    namespace = {"__name__": "solution"}
    error = _exec(code, namespace)
    if error is not None:
        return 0, error
    results = [_exec(test, namespace) for test in tests]
    return sum(r is None for r in results), next((r for r in results if r is not None), None)


def _lines(text):
    """Output compared as judges do: trailing spaces and blank lines at either end do not count."""
    return [line.rstrip() for line in str(text).strip().splitlines()]


def run_io_tests(code, tests):
    """Run the program once per test with the test's stdin; its stdout must match line by line."""
    passed, first_error = 0, None
    for test in tests:
        sys.stdin, out = io.StringIO(str(test["input"])), io.StringIO()
        with contextlib.redirect_stdout(out):
            error = _exec(code, {"__name__": "__main__"})
        passed += error is None and _lines(out.getvalue()) == _lines(test["output"])
        first_error = first_error or error
    return passed, first_error


def run_job(code, tests):
    asserts = [t for t in tests if isinstance(t, str)]
    io_tests = [t for t in tests if isinstance(t, dict)]
    passed_asserts, assert_error = run_assert_tests(code, asserts) if asserts else (0, None)
    passed_io, io_error = run_io_tests(code, io_tests) if io_tests else (0, None)
    if not tests:
        _, assert_error = run_assert_tests(code, [])  # no tests: only whether it runs
    return {"passed": passed_asserts + passed_io, "total": len(tests), "error": assert_error or io_error}


def main():
    job = json.loads(sys.stdin.read())
    sys.stdin = io.StringIO()
    token = job.pop("token")
    limit_resources(job)
    sys.dont_write_bytecode = True
    stub_native_spawners()
    sys.addaudithook(make_audit_hook(os.path.realpath(os.getcwd())))
    report = run_job(job["code"], job["tests"])
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(1, f"\n{token} {json.dumps(report)}\n".encode())


if __name__ == "__main__":
    main()
