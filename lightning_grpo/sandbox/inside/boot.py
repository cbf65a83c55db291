"""The sandbox's first process: one marshalled job on stdin -> one record per case on stdout. Knows no verdicts.

Started by ``runner.py`` as ``python -I -S /_sandbox/boot.py``: inside bwrap it is pid 1 of the sandbox's pid
namespace (``--as-pid-1``: when it exits the kernel kills every process there), in process mode a plain child.
Before anything else it makes itself non-dumpable (``PR_SET_DUMPABLE`` 0): its ``/proc/<pid>/mem``, ``fd`` and
``environ`` are then closed to the program although both run as the same user, and nothing can be injected into
it. Then it forks the program's process (``program.py``), before reading the job, so no test code is in that
process's memory; it never runs the program's code itself. It holds the only descriptor of the record channel:
frames ``\\n<token> <case index> <output length or -1> <error length>\\n<output><error>``. The program's own
stdout and stderr go to stderr (the log). Case kinds: ``stdin`` (the program's stdout), ``value`` (the tagged
JSON of an expression evaluated here against the program), ``script`` (test code run here to the end: b"").
"""

import marshal
import os
import sys

PR_SET_DUMPABLE = 4


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


def start_program(program):
    """Fork the program's process; in it, only its two pipe ends (high, close-on-exec) and the log remain. It stays
    in our process group, which the trainer kills at the deadline (in process mode the only kill but the cgroup's)."""
    requests, replies = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the job
            os.dup2(2, 1)  # not the record channel: the program's stdout goes to the log
            os.close(requests[1])
            os.close(replies[0])
            program.serve(program.high_fd(requests[0]), program.high_fd(replies[1]), block_processes)
        finally:
            os._exit(0)
    os.close(requests[0])
    os.close(replies[1])
    return pid, requests[1], replies[0]


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

    pid, requests_fd, replies_fd = start_program(program)
    job = marshal.loads(sys.stdin.buffer.read())  # from the trainer, trusted
    limits = job["limits"]
    session = grader.Program(requests_fd, replies_fd, limits)
    setup = marshal.dumps({"code": job["code"], "limits": limits})
    try:
        grader.write_all(requests_fd, len(setup).to_bytes(4, "little") + setup)
    except OSError:
        pass  # the program's process is gone: every case will say so
    run_cases(grader, session, job["cases"], job["token"])
    if not job["cases"]:  # no tests: whether the code runs at all
        report(1, job["token"], -1, None, grader.run_case(session, "script", "")[1])
    os._exit(finish(pid, requests_fd, session.dead))


def run_cases(grader, session, cases, token):
    """Every case, reported as soon as it is done. Consecutive stdin cases, and consecutive value cases that are
    plain calls of the program's names, go to the program's process as one request: one round trip, not one
    each (a round trip costs two wake-ups, which a loaded machine makes slow)."""
    batches = {"stdin": grader.run_stdin_cases, "calls": grader.run_calls}
    index = 0
    while index < len(cases):
        key = _batch(grader, *cases[index])
        if key is None:
            report(1, token, index, *grader.run_case(session, *cases[index]))
            index += 1
            continue
        end = index + 1
        while end < len(cases) and _batch(grader, *cases[end]) == key:
            end += 1
        for offset, outcome in enumerate(batches[key](session, [s for _, s in cases[index:end]])):
            report(1, token, index + offset, *outcome)
        index = end


def _batch(grader, kind, source):
    if kind == "stdin":
        return "stdin"
    return "calls" if kind == "value" and grader.is_program_call(source) else None


def finish(pid, requests_fd, dead):
    """End the program's process; the exit status to pass on: 128 + the signal that killed it (a limit, the OOM
    killer), so the trainer counts the death; else 0 (its errors are in the records)."""
    os.close(requests_fd)
    try:
        os.kill(pid, 9)  # process mode: nothing else would end it; in a pid namespace our exit does
    except OSError:
        pass
    if not dead:
        return 0
    try:
        _, status = os.waitpid(pid, 0)  # it closed its channel: it is exiting, or killed just above
    except OSError:
        return 0
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


if __name__ == "__main__":
    main()
