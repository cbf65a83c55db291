"""The sandbox's first process: one marshalled job on stdin -> one record per case on stdout. Knows no verdicts.

Started by ``runner.py`` as ``python -I -S /_sandbox/boot.py``: inside bwrap it is pid 1 of the sandbox's pid
namespace (``--as-pid-1``: when it exits the kernel kills every process there), in process mode a plain child.
Before anything else it makes itself non-dumpable (``PR_SET_DUMPABLE`` 0): its ``/proc/<pid>/mem``, ``fd`` and
``environ`` are then closed to the program although both run as the same user, and nothing can be injected into
it. Then it forks the zygote (``program.zygote``), before reading the job, so no test code is in its memory nor
in that of the program processes it forks, a fresh one for each case; it never runs the program's code itself.
It holds the only descriptor of the record channel: frames
``\\n<token> <case index> <output length or -1> <error length>\\n<output><error>``. The programs' own stdout and
stderr go to stderr (the log). Case kinds: ``stdin`` (the program's stdout), ``value`` (the tagged JSON of an
expression evaluated here against the program), ``script`` (test code run here to the end: b"").
"""

import marshal
import os
import sys

PR_SET_DUMPABLE = 4
SANDBOX_FAILED = 125  # our exit status when the sandbox itself fails (no program process could start), as env's


class SandboxFailure(Exception):
    """The sandbox cannot go on through no doing of the program: the zygote could not fork a program process."""


def make_undumpable():
    """``prctl(PR_SET_DUMPABLE, 0)`` through ``_ctypes`` (~1 ms; the ``ctypes`` package costs ~10 ms)."""
    import _ctypes

    class CInt(_ctypes._SimpleCData):
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = CInt

    prctl = Function(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"))
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


def start_zygote(program):
    """Fork the process that forks the program's processes (``program.zygote``), before the job is read: none of
    them ever holds test code. Returns its pid and our end of the Unix socket that asks it."""
    import _socket

    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the job
            os.dup2(2, 1)  # not the record channel: the programs' stdout goes to the log
            program.zygote(theirs, block_processes)
        finally:
            os._exit(0)
    theirs.close()
    return pid, ours


class Programs:
    """A fresh program process for each case, from the zygote: a program that keeps state between calls (a
    counter, a cache, a flag in ``builtins``) starts every case as it started the first, so it cannot pass two
    contradictory tests (``assert is_even(3)`` and ``assert not is_even(3)``) by answering them in turn."""

    def __init__(self, grader, zygote, control, code, limits):
        self.grader, self.zygote, self.control, self.limits = grader, zygote, control, limits
        setup = marshal.dumps({"code": code, "limits": limits})
        self.setup = len(setup).to_bytes(4, "little") + setup
        self.died = 0  # 128 + the signal of the first program process a limit or the OOM killer killed

    def spawn(self):
        """(pid, session): a new program process, given the code and limits, and the grader's side of it."""
        import _socket

        self.control.sendall(b"s" + bytes([bool(self.limits["block_processes"])]) + bytes(3))
        size = _socket.CMSG_LEN(8)
        message, ancillary, _, _ = self.control.recvmsg(4, size)
        if not message:
            raise EOFError("the zygote is gone")
        pid = int.from_bytes(message, "little", signed=True)
        if pid <= 0:  # it answered -errno: the fork failed before any of the program's code existed
            raise SandboxFailure(f"the zygote could not fork a program process: {os.strerror(-pid)}")
        requests_fd, replies_fd = (int.from_bytes(ancillary[0][2][i : i + 4], "little") for i in (0, 4))
        session = self.grader.Program(requests_fd, replies_fd, self.limits)
        try:
            self.grader.write_all(requests_fd, self.setup)
        except OSError:
            pass  # the program's process is gone: the case will say so
        return pid, session

    def end(self, pid, session):
        """Kill the case's process (it died already when ``session.dead``: then its signal is kept), reap it, and
        leave nothing of it for the next case (``clear_state``)."""
        for fd in (session.requests_fd, session.replies_fd):
            os.close(fd)
        if not session.dead:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        self.control.sendall(b"w" + pid.to_bytes(4, "little"))
        status = int.from_bytes(self.control.recv(4), "little")
        if session.dead and not self.died and os.WIFSIGNALED(status):
            self.died = 128 + os.WTERMSIG(status)
        clear_state(self.zygote)


def clear_state(zygote):
    """What a case's process could leave for the next one to read: the processes it started (in the sandbox's pid
    namespace, where we are pid 1: all but us and the zygote) and the files it wrote (the working directory; with
    kernel isolation ``/dev/shm``, a private tmpfs too)."""
    for _ in range(50) if os.getpid() == 1 else ():  # a few passes: one may fork while we kill
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, zygote)]
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        _reap()
    for directory in [".", "/dev/shm"] if os.getpid() == 1 else ["."]:
        _remove_inside(directory)


def _reap():
    """Collect the exit status of every dead child (orphans are ours as pid 1), without waiting for live ones."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _remove_inside(directory):
    """Remove everything in ``directory``, links as links (never followed), without importing shutil."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                _remove_inside(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def block_processes(workdir):
    import hooks

    hooks.block_processes_and_network(workdir)


def report(fd, token, index, output, error):
    error = b"" if error is None else error.encode("utf-8", "replace")
    size = -1 if output is None else len(output)
    data = f"\n{token} {index} {size} {len(error)}\n".encode() + (output or b"") + error
    while data:
        data = data[os.write(fd, data) :]


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory out
    make_undumpable()
    import _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # pid 1 ignores signals it has no handler for
    import grader
    import program

    zygote, control = start_zygote(program)
    job = marshal.loads(sys.stdin.buffer.read())  # from the trainer, trusted
    programs = Programs(grader, zygote, control, job["code"], job["limits"])
    try:
        run_cases(grader, programs, job["cases"], job["token"])
        if not job["cases"]:  # no tests: whether the code runs at all
            report(1, job["token"], -1, None, run_case(grader, programs, "script", "")[1])
    except SandboxFailure as failure:  # the cases left are unfinished; the trainer counts a sandbox failure
        os.write(2, f"sandbox: {failure}\n".encode())
        finish(zygote, control, 0)
        os._exit(SANDBOX_FAILED)
    os._exit(finish(zygote, control, programs.died))


def run_cases(grader, programs, cases, token):
    """Every case in a fresh program process (``Programs``), reported as soon as it is done."""
    for index, (kind, source) in enumerate(cases):
        report(1, token, index, *run_case(grader, programs, kind, source))


def run_case(grader, programs, kind, source):
    """(output, error) of one case in its own program process: stdin, a call of the program's names (evaluated
    there), or test code run here against it."""
    pid, session = programs.spawn()
    try:
        if kind == "stdin":
            return grader.run_stdin_cases(session, [source])[0]
        if kind == "value" and grader.is_program_call(source):
            return grader.run_calls(session, [source])[0]
        return grader.run_case(session, kind, source)
    finally:
        programs.end(pid, session)


def finish(zygote, control, died):
    """End the zygote; the exit status to pass on: 128 + the signal that killed a program process (a limit, the
    OOM killer), so the trainer counts the death; else 0 (its errors are in the records)."""
    control.close()  # the zygote's end of file: it exits
    try:
        os.kill(zygote, 9)  # process mode: nothing else would end it; in a pid namespace our exit does
    except OSError:
        pass
    return died


if __name__ == "__main__":
    main()
