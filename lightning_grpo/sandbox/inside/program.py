"""Requests from the sandbox's first process -> what the untrusted code printed or returned, in its own process.

Knows how to run the code; nothing about tests: no test code and no expected value ever reaches this process.
``boot.py`` forks it before reading the job, so not even the test code's text is in its memory. Requests come
in as marshal (from its trusted parent); answers go out as frames ``kind (1 byte) + length (4) + payload`` that
the parent parses as untrusted data. Objects stay here: a value crosses as its ``repr`` capped in size, which
the grader reads as a literal or else keeps as an opaque handle (the id sent with it) to call or inspect later.
"""

import builtins
import io
import marshal
import os
import resource
import sys

try:
    from .running import fresh_module, high_fd, os_exit_in, reason, run, site_exits, stdin_case
    from .values import built_in_base, plain
except ImportError:  # inside the sandbox, where these modules are top-level
    from running import fresh_module, high_fd, os_exit_in, reason, run, site_exits, stdin_case
    from values import built_in_base, plain

OPEN_FILES = 256  # the harness keeps its descriptors at 100 and above
_real_exit = os._exit


def limit_resources(limits):
    """CPU seconds (SIGKILL one second past the soft limit), address space, file size, processes, open files;
    no POSIX message queues (kernel objects that would outlive a process)."""
    cpu, memory, fsize = limits["cpu_seconds"], limits["memory_bytes"], limits["file_size_bytes"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["user_processes"], limits["user_processes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))


def _receive(fd):
    header = _read_exactly(fd, 4)
    return marshal.loads(_read_exactly(fd, int.from_bytes(header, "little")))


def _read_exactly(fd, size):
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the first process closed the request channel")
        data += chunk
    return bytes(data)


class Server:
    """The code's namespace and the objects handed out, answering one request at a time."""

    def __init__(self, code, limits, replies_fd):
        self.code, self.replies_fd = code, replies_fd
        self.output_cap, self.value_cap = limits["max_output_bytes"] + 1, limits["max_value_bytes"] + 1
        self.objects = {}
        self.definitions = None  # (namespace, error) once the code ran as module ``solution``

    def reply(self, kind, payload=b""):
        _flush()  # before the answer: the first process may end the sandbox as soon as it has the last one
        data = kind + len(payload).to_bytes(4, "little") + payload
        while data:
            data = data[os.write(self.replies_fd, data) :]

    def define(self):
        if self.definitions is None:
            namespace = fresh_module("solution")
            self.definitions = (namespace, reason(run(self.code, namespace)))  # any exit fails: the tests follow
        return self.definitions

    def value(self, value):
        """Keep ``value`` here and send its id, the built-in type it is a subclass of ("-" if none, or if it is
        one), and the ``repr`` of its built-in value (``plain``; cut past the cap: the grader will not parse it);
        an exception class as its name and built-in bases (``except`` in the tests can name it)."""
        self.objects[len(self.objects)] = value
        if _is_exception_class(value):
            head = f"{len(self.objects) - 1} {value.__name__} {built_in_bases(value)}"
            return self.reply(b"x", head[:500].encode("utf-8", "replace"))
        try:
            base = getattr(built_in_base(value), "__name__", "-")
        except BaseException:  # noqa: B036 - a hostile __class__
            base = "-"
        self.reply(b"v", f"{len(self.objects) - 1} {base} ".encode() + self.text(value))

    def text(self, value):
        """The ``repr`` of ``value``'s built-in value, else its own ``repr``; b"" if neither can be had."""
        try:
            value = plain(value, self.value_cap)  # a longer value has a longer repr: not parsed anyway
        except BaseException:  # noqa: B036 - too large, too deep or hostile (a __hash__): sent as it is
            pass
        try:
            return repr(value).encode("utf-8", "replace")[: self.value_cap]
        except BaseException:  # noqa: B036 - a hostile __repr__: the value stays an opaque handle
            return b""

    def stdin(self, texts):
        """One reply per stdin case, in order (the first process sends consecutive ones at once)."""
        for text in texts:
            output, error = stdin_case(self.code, text, self.output_cap)
            self.reply(b"o", output) if error is None else self.reply(b"e", error.encode("utf-8", "replace"))

    def answer(self, request):
        kind = request[0]
        if kind == "stdin":
            return self.stdin(request[1])
        if kind == "calls":  # plain calls of the program's names, sent at once: one reply each, in order
            for source in request[1]:
                self.answer(("eval", source))
            return None
        namespace, error = self.define()
        if error is not None:
            return self.reply(b"e", error.encode("utf-8", "replace"))
        try:
            self.value(self.evaluate(namespace, request))
        except BaseException as err:  # noqa: B036 - whatever the code raised goes back by name and built-in bases
            head = f"{type(err).__name__} {built_in_bases(type(err))}"
            self.reply(b"r", f"{head}\n{err}"[:500].encode("utf-8", "replace"))

    def evaluate(self, namespace, request):
        kind, *rest = request
        if kind == "define":
            return None
        if kind == "name":
            return namespace[rest[0]]  # KeyError: the grader turns it into a NameError
        if kind == "eval":
            return eval(compile(rest[0], "<test>", "eval"), namespace)
        target = self.objects[rest[0]]
        if kind == "attr":
            return getattr(target, rest[1])
        if kind == "op":
            return {"bool": bool, "len": len, "list": list}[rest[1]](target)
        args = [self.argument(tag, v) for tag, v in rest[1]]
        kwargs = {k: self.argument(tag, v) for k, (tag, v) in rest[2].items()}
        sent = {**{str(i): a for i, a in enumerate(args)}, **kwargs}
        mutable = {k: (v, self.text(v)) for k, v in sent.items() if type(v) in (list, dict, set)}
        value = target(*args, **kwargs)
        for key, (argument, before) in mutable.items():  # in-place changes go back, as a caller would see them
            after = self.text(argument)
            if after != before:
                self.reply(b"m", f"{key} ".encode() + after)
        return value

    def argument(self, tag, value):
        """A call's argument as the grader sent it (``remote.argument``): a handle, a pickle, or a literal."""
        if tag == "h":
            return self.objects[value]
        if tag == "p":
            try:
                from . import arguments
            except ImportError:  # inside the sandbox
                import arguments
            return arguments.loads(value, self.objects, self.define()[0])
        return value


def _is_exception_class(value):
    try:
        return isinstance(value, type) and issubclass(value, BaseException)
    except BaseException:  # noqa: B036 - a hostile metaclass
        return False


def built_in_bases(kind):
    """The built-in classes among ``kind``'s ancestors that no other of them derives from, comma-separated (its own
    name if it is built-in): what the grader raises it as, so that ``except ValueError`` catches the program's
    ``class Invalid(ValueError)`` there as Python would."""
    try:
        found = [c for c in kind.__mro__ if getattr(builtins, c.__name__, None) is c]
    except BaseException:  # noqa: B036 - a hostile metaclass
        found = []
    return ",".join(c.__name__ for c in found if not any(o is not c and issubclass(o, c) for o in found)) or "-"


def zygote(control, block_processes):
    """The sandbox's second process, forked before the job is read: it never holds test code and never runs the
    program's; on each request of the first process it forks a fresh program process, so no state (globals,
    builtins, caches, counters) outlives one case. Requests on ``control`` (a Unix socket): ``s`` + hooks flag
    spawns one (``spawn``); ``w`` + pid reaps it and answers its wait status. End of file ends it."""
    while len(command := _recv(control, 5)) == 5:
        if command[:1] == b"w":
            _, status = os.waitpid(int.from_bytes(command[1:], "little"), 0)
            control.sendall(status.to_bytes(4, "little"))
            continue
        if command[1]:  # process mode: what the hooks import, imported once here rather than in each process
            import _posixsubprocess  # noqa: F401
            import threading  # noqa: F401

            import hooks  # noqa: F401
        spawn(control, block_processes)
    _real_exit(0)


def spawn(control, block_processes):
    """Fork a program process and answer its pid (4 bytes, signed) with the first process's ends of its two pipes
    (SCM_RIGHTS); where the kernel refuses the pipes or the fork (the pids or memory share), answer ``-errno`` and
    no descriptors: the sandbox's own failure, not the program's, which has not started."""
    import _socket
    import array

    made = []
    try:
        made += os.pipe()
        made += os.pipe()
        pid = os.fork()
    except OSError as err:
        for fd in made:
            os.close(fd)
        control.sendall((-(err.errno or 1)).to_bytes(4, "little", signed=True))
        return
    requests, replies = made[:2], made[2:]
    if pid == 0:
        try:
            control.close()
            os.close(requests[1])
            os.close(replies[0])
            serve(high_fd(requests[0]), high_fd(replies[1]), block_processes)
        finally:
            _real_exit(0)
    os.close(requests[0])
    os.close(replies[1])
    ends = array.array("i", [requests[1], replies[0]]).tobytes()
    control.sendmsg([pid.to_bytes(4, "little", signed=True)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, ends)])
    os.close(requests[1])
    os.close(replies[0])


def _recv(control, size):
    data = b""
    while len(data) < size and (chunk := control.recv(size - len(data))):
        data += chunk
    return data


def serve(requests_fd, replies_fd, block_processes):
    """The forked program process: limits, then answer requests until the first process closes the channel."""
    setup = _receive(requests_fd)
    limit_resources(setup["limits"])
    sys.dont_write_bytecode = True
    sys.stdin = io.StringIO()
    os._exit = os_exit_in(os.getpid())
    site_exits()
    if setup["limits"]["block_processes"]:
        block_processes(os.path.realpath(os.getcwd()))
    server = Server(setup["code"], setup["limits"], replies_fd)
    while True:
        try:
            request = _receive(requests_fd)
        except (EOFError, OSError):
            break
        try:
            server.answer(request)
        except OSError:  # the program closed the reply channel: nothing more can be answered
            break
    _real_exit(0)


def _flush():
    """What the code printed, into the log now: the process is killed, not exited, once the cases are done."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: B036 - the program may have replaced either with anything
            pass  # no atexit handler of the program runs after the last answer
