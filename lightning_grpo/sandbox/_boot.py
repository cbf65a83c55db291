"""Child side of the sandbox: one marshalled job on stdin -> limits, the untrusted code, one record per case.

Started by ``sandbox.py`` as ``python -I -S _boot.py`` (inside bwrap, or in process mode in a throwaway
directory). Imports only the standard library. It reports what the program produced, never a verdict: the
parent compares with expected values that are never sent here. Records go to the original stdout as frames,
``\\n<token> <case index> <output length or -1> <error length>\\n<output><error>``; the program's own stdout
and stderr go to stderr (the log), except a stdin case's stdout, captured per case. A case without a record
did not finish.

Case kinds: ``stdin`` runs the program as ``__main__`` with the case as stdin and reports its stdout; ``value``
evaluates an expression after defining the code and reports ``repr`` of the value; ``script`` runs test code
after the definitions and reports that it ran to the end (weaker: the code shares the process with it).
"""

import fcntl
import io
import marshal
import os
import resource
import sys

# json, base64, contextlib and types are not imported: ~8 ms of every program's start-up.

# Process mode only: without kernel namespaces these are the (bypassable) walls. Root ignores RLIMIT_NPROC.
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
OPEN_FILES = 256  # the harness keeps its descriptors at 100 and above
_real_exit = os._exit
HARNESS_PID = os.getpid()


def limit_resources(job):
    """CPU seconds (SIGKILL one second past the soft limit), address space, file size, processes, open files."""
    cpu, memory, fsize = job["cpu_seconds"], job["memory_bytes"], job["file_size_bytes"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (job["max_processes"], job["max_processes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


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


def _exit_as_exception(status=0):
    """``os._exit`` inside a case ends that case, not the harness (a convenience: ``posix._exit`` still works).

    A forked child (multiprocessing ends its workers with ``os._exit``) really exits.
    """
    if os.getpid() != HARNESS_PID:
        _real_exit(status)
    raise SystemExit(status)


def _high_fd(fd):
    """``fd`` moved above the descriptors a program usually touches."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(fd)
    return high


def _module(name):
    """A fresh module registered in ``sys.modules``, so pickling its functions (multiprocessing) finds them."""
    module = type(sys)(name)
    module.__builtins__ = __builtins__
    sys.modules[name] = module
    return module.__dict__


def _run(source, namespace, mode="exec"):
    """``(value, None)`` when ``source`` ran to the end, else ``(None, reason)``; any exit is a failure."""
    try:
        return eval(compile(source, "<solution>", mode), namespace), None
    except SystemExit as err:
        return None, f"SystemExit: {err.code}"
    except BaseException as err:  # noqa: B036 - untrusted code may raise anything; it all means "failed"
        return None, f"{type(err).__name__}: {err}"[:500]


class Harness:
    def __init__(self, job, report_fd):
        self.code, self.token, self.report_fd = job["code"], job["token"], report_fd
        self.limit = job["max_output_bytes"]
        self.definitions = None  # the code's namespace, defined once for value and script cases

    def report(self, index, output, error):
        error = b"" if error is None else error.encode("utf-8", "replace")
        size = -1 if output is None else len(output)
        data = f"\n{self.token} {index} {size} {len(error)}\n".encode() + (output or b"") + error
        while data:
            data = data[os.write(self.report_fd, data) :]

    def stdin_case(self, text):
        """Fresh ``__main__`` run with ``text`` on fd 0 and fd 1 captured: ``input()``, ``open(0)``, ``os.write(1)``.

        The program may close any descriptor (``open(0)`` closes fd 0 when collected): the harness keeps its
        own above 100 and treats a lost one as an unfinished case.
        """
        stdin, stdout = _high_fd(os.memfd_create("stdin")), _high_fd(os.memfd_create("stdout"))
        try:
            os.write(stdin, text.encode("utf-8", "replace"))
            os.dup2(stdin, 0)
            os.lseek(0, 0, os.SEEK_SET)
            os.dup2(stdout, 1)
            sys.stdin, sys.stdout = open(0, closefd=False), open(1, "w", closefd=False)
            _, error = _run(self.code, _module("__main__"))
            try:
                sys.stdout.flush()
            except BaseException:  # noqa: B036 - the program's own stdout object may raise anything
                pass
            sys.stdout = sys.__stdout__
            os.dup2(2, 1)
            return (None if error else os.pread(stdout, self.limit + 1, 0)), error
        except OSError as err:
            return None, f"the program broke its standard streams: {err}"
        finally:
            for fd in (stdin, stdout):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def define(self):
        """The code as a module named ``solution`` (a main guard stays idle), once."""
        if self.definitions is None:
            namespace = _module("solution")
            _, error = _run(self.code, namespace)
            self.definitions = (namespace, error)
        return self.definitions

    def value_case(self, expression):
        namespace, error = self.define()
        if error:
            return None, error
        value, error = _run(expression, namespace, "eval")
        if error:
            return None, error
        try:
            return repr(value).encode("utf-8", "replace")[: self.limit + 1], None
        except BaseException as err:  # noqa: B036 - a hostile __repr__
            return None, f"repr failed: {type(err).__name__}"

    def script_case(self, source):
        namespace, error = self.define()
        if error:
            return None, error
        _, error = _run(source, namespace)
        return (None if error else b""), error

    def run(self, cases):
        kinds = {"stdin": self.stdin_case, "value": self.value_case, "script": self.script_case}
        for index, (kind, source) in enumerate(cases):
            try:
                output, error = kinds[kind](source)
            except BaseException as err:  # noqa: B036 - whatever the program broke, the next case still runs
                output, error = None, f"sandbox harness: {type(err).__name__}: {err}"[:500]
            try:
                self.report(index, output, error)
            except OSError:  # the program closed the record channel: its cases are lost
                pass
        if not cases:
            self.report(-1, None, self.define()[1])  # no tests: whether the code runs at all


def main():
    job = marshal.loads(sys.stdin.buffer.read())  # from the trainer, trusted; marshal needs no import
    report_fd = _high_fd(os.dup(1))  # the record channel; the program's stdout goes to the log from here on
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = io.StringIO()
    limit_resources(job)
    sys.dont_write_bytecode = True
    os._exit = _exit_as_exception
    if job["block_processes"]:
        block_processes_and_network(os.path.realpath(os.getcwd()))
    Harness(job, report_fd).run(job["cases"])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: B036 - the program may have replaced either with anything
        pass
    _real_exit(0)  # no atexit handler of the program runs after the records


if __name__ == "__main__":
    main()
