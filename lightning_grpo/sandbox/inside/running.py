"""Untrusted source -> run as a module of the program's process, or as a stdin program that ends as a process
ends (its exit status, what it flushed). Runs in the program's process; knows nothing about tests.
"""

import _sitebuiltins
import builtins
import fcntl
import os
import sys

_real_exit = os._exit


def high_fd(fd):
    """``fd`` moved above the descriptors a program usually touches, closed on exec."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(fd)
    return high


def fresh_module(name):
    """A fresh module registered in ``sys.modules``, so pickling its functions (multiprocessing) finds them."""
    module = type(sys)(name)
    module.__builtins__ = __builtins__
    sys.modules[name] = module
    return module.__dict__


def run(source, namespace):
    """None when ``source`` ran to the end, else the exception that ended it (``SystemExit`` included)."""
    try:
        exec(compile(source, "<solution>", "exec"), namespace)
    except BaseException as err:  # noqa: B036 - untrusted code may raise anything
        return err
    return None


def reason(ended):
    """What ended a run early, as text (None: it ran to the end)."""
    if ended is None:
        return None
    if isinstance(ended, SystemExit):
        return f"SystemExit: {ended.code}"[:500]
    return f"{type(ended).__name__}: {ended}"[:500]


def exit_status(ended):
    """The status the interpreter exits with after ``ended`` (None: the code ran to the end): SystemExit's code read
    as Python reads it (None 0, an int itself mod 256, anything else 1: its text goes to stderr), 1 for any other
    exception."""
    if ended is None:
        return 0
    if not isinstance(ended, SystemExit):
        return 1
    code = ended.code
    if code is None:
        return 0
    return code % 256 if isinstance(code, int) else 1


def os_exit_in(harness_pid):
    """``os._exit`` for the program's process ``harness_pid``: there it ends the case, not the harness (a
    convenience: ``posix._exit`` still works); a forked child (multiprocessing ends its workers so) really exits."""

    def _exit(status=0):
        if os.getpid() != harness_pid:
            _real_exit(status)
        ended = SystemExit(status)
        ended.os_exit = True  # what sys.stdout still buffers is lost, as it is when a process calls _exit
        raise ended

    return _exit


def site_exits():
    """``exit`` and ``quit`` as ``site`` defines them: python runs with -S (no site: no .pth file's code, a fast
    start), and a stdin program may end with either."""
    for name in ("exit", "quit"):
        setattr(builtins, name, _sitebuiltins.Quitter(name, "Ctrl-D (i.e. EOF)"))


def stdin_case(code, text, cap):
    """Fresh ``__main__`` run with ``text`` on fd 0 and fd 1 captured: ``input()``, ``open(0)``, ``os.write(1)``.

    It ends as a process would: at the end of the code or at an exit with status 0 (``sys.exit(0)``, ``exit()``,
    ``os._exit(0)``) its stdout is the output, after ``sys.stdout`` is flushed, except at ``os._exit``, which
    leaves what the program did not flush unwritten, as in Python; any other status or an exception: no output.
    The program may close any descriptor (``open(0)`` closes fd 0 when collected): the harness keeps its own
    above 100 and treats a lost one as an unfinished case. Returns (stdout, None) or (None, error).
    """
    stdin, stdout = high_fd(os.memfd_create("stdin")), high_fd(os.memfd_create("stdout"))
    try:
        os.write(stdin, text.encode("utf-8", "replace"))
        os.dup2(stdin, 0)
        os.lseek(0, 0, os.SEEK_SET)
        os.dup2(stdout, 1)
        sys.stdin, sys.stdout = open(0, closefd=False), open(1, "w", closefd=False)
        ended = run(code, fresh_module("__main__"))
        if not (isinstance(ended, SystemExit) and getattr(ended, "os_exit", False)):
            try:
                sys.stdout.flush()
            except BaseException:  # noqa: B036 - the program's own stdout object may raise anything
                pass
        os.dup2(2, 1)  # before sys.stdout is let go: what it still buffers (os._exit) reaches the log, not stdout
        sys.stdout = sys.__stdout__
        if exit_status(ended) != 0:
            return None, reason(ended)
        return os.pread(stdout, cap, 0), None
    except OSError as err:
        return None, f"the program broke its standard streams: {err}"
    finally:
        for fd in (stdin, stdout):
            try:
                os.close(fd)
            except OSError:
                pass
