"""Test code + the program's process behind a pipe -> what each case produced. Knows no expected values.

Runs in the sandbox's first process, never in the program's: a value case's expression and a script case's test
code run here, and every name they take from the program is a ``Remote``, so a call goes over the pipe and only
the ``repr`` of the result comes back, parsed here as a literal of built-in types (capped in size first). What
the program defines (shadowed builtins, patched standard-library modules, always-equal objects, frame or memory
inspection) never reaches the test code: names resolve to this process's builtins, then to this process's own
standard library, then to the program. A result that is an instance of a subclass of a built-in type (a
``Counter``) comes as its built-in value (``values.plain``) that also reads the object's other attributes
(``Handled``); any other result that is not a literal stays an opaque ``Remote``: it can be called, its
attributes read, and ``bool``/``len``/iteration asked of the program, but it compares equal only to itself.
Values go to the trainer as tagged JSON (``values.encode``), which it parses in C.
"""

import builtins
import marshal
import os
import sys

try:
    from .collect import run_collected
    from .remote import Handled, ProgramError, Remote
    from .values import encode, is_literal, literal
except ImportError:  # inside the sandbox, where these modules are top-level
    from collect import run_collected
    from remote import Handled, ProgramError, Remote
    from values import encode, is_literal, literal

STDLIB = frozenset(sys.stdlib_module_names)


class Program:
    """The first process's side of the pipes to the program's process.

    Args:
        requests_fd: where requests are written (marshal).
        replies_fd: where framed replies are read (untrusted: every length is checked against the caps).
        limits: ``max_output_bytes`` and ``max_value_bytes``.
    """

    def __init__(self, requests_fd, replies_fd, limits):
        self.requests_fd, self.replies_fd = requests_fd, replies_fd
        self.output_cap, self.value_cap = limits["max_output_bytes"] + 1, limits["max_value_bytes"]
        self.dead = None  # why the program's process can no longer answer
        self.definition = None  # "" once the code ran, else its error
        self.names = {}  # the program's functions and classes, by name
        self.exceptions = {}  # (name, built-in bases) -> the class the program's exception class is raised as here

    def ask(self, request):
        """(kind, payload, changes) of the program's reply, ``changes`` the frames that say which arguments it
        mutated; raises ProgramError once the process is gone or misbehaved."""
        self.send(request)
        return self.receive()

    def send(self, request):
        if self.dead:
            raise ProgramError(self.dead)
        try:
            data = marshal.dumps(request)
        except ValueError as err:  # a request the grader built wrongly: its arguments went through remote.argument
            raise ProgramError(f"the request cannot be sent: {err}") from None
        self._guard(write_all, self.requests_fd, len(data).to_bytes(4, "little") + data)

    def receive(self):
        changes = []
        while True:
            header = self._guard(_read_exactly, self.replies_fd, 5)
            size = int.from_bytes(header[1:], "little")
            if header[:1] not in b"voerkmx" or size > self.output_cap + self.value_cap + 32 or len(changes) > 256:
                self.dead = f"the program's process broke its channel (a malformed reply of {size} bytes)"
                raise ProgramError(self.dead)
            payload = self._guard(_read_exactly, self.replies_fd, size)
            if header[:1] != b"m":
                return header[:1], payload, changes
            changes.append(payload)

    def _guard(self, function, *args):
        if self.dead:
            raise ProgramError(self.dead)
        try:
            return function(*args)
        except (OSError, EOFError) as err:
            self.dead = f"the program's process exited before finishing every case ({err})"
            raise ProgramError(self.dead) from None

    def define(self):
        """Run the code once, before any test (its error is every test's); the names it gives, remembered."""
        if self.definition is None:
            self.definition = ""
            try:
                self.result(("define",))
            except ProgramError as err:
                self.definition = str(err)
        if self.definition:
            raise ProgramError(self.definition)

    def exception(self, name, bases):
        """The class the program's exception class ``name`` is here, from its built-in ``bases`` (comma-separated,
        from the program's process, untrusted): the built-in class when it is one, else a class of that name
        derived from them, one per program class, so ``except ValueError`` (or ``except Invalid``, the name looked
        up) catches it as Python would; None when no ``Exception`` is among them."""
        found = [getattr(builtins, base, None) for base in bases.split(",")[:8]]
        if not found or not all(isinstance(c, type) and issubclass(c, Exception) for c in found):
            return None
        if [name] == bases.split(","):
            return found[0]
        if (name, bases) not in self.exceptions:
            try:
                made = type(name, tuple(found), {"__module__": "solution"})
            except (TypeError, ValueError):  # bases whose layouts conflict, a name type() refuses
                made = found[0]
            self.exceptions[name, bases] = made
        return self.exceptions[name, bases]

    def lookup(self, name):
        """The program's global ``name`` (KeyError if none); an object's handle is kept for the next test."""
        if name not in self.names:
            value = self.result(("name", name))
            if type(value) is not Remote:
                return value  # data may change between calls: asked again next time
            self.names[name] = value
        return self.names[name]

    def module(self):
        """A ``solution`` module whose attributes are the program's names (``from solution import f``)."""
        module = type(sys)("solution")

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            try:
                return self.result(("name", name))
            except KeyError:
                raise AttributeError(f"the program defines no {name!r}") from None

        module.__getattr__ = attribute
        return module

    def result(self, request, arguments=None):
        """The value of a request: a literal, or a ``Remote`` for anything else; the program's exception raised.
        ``arguments`` (position or keyword -> object) take the new contents the program gave them in place."""
        return self.decode(self.ask(request), arguments)

    def decode(self, reply, arguments=None):
        """The value in one reply (see ``result``)."""
        kind, payload, changes = reply
        for change in changes:
            key, _, text = change.partition(b" ")
            _update((arguments or {}).get(key.decode("ascii", "replace")), text, self.value_cap)
        if kind == b"v":
            ident, base, text = (payload.split(b" ", 2) + [b"", b""])[:3]
            try:
                value = literal(text, self.value_cap)
            except ValueError:
                return Remote(self, int(ident))
            if type(value).__name__ != base.decode("ascii", "replace"):
                return value  # a built-in value, or a subclass whose repr did not read as its base
            return Handled.of(value, Remote(self, int(ident)))
        if kind == b"x":
            ident, name, bases = (payload.decode("utf-8", "replace").split(" ", 2) + ["", ""])[:3]
            return self.exception(name, bases) or Remote(self, int(ident))
        if kind == b"r":
            head, _, message = payload.decode("utf-8", "replace").partition("\n")
            name, _, bases = head.partition(" ")
            found = self.exception(name, bases)
            raise found(message) if found else ProgramError(f"{name}: {message}")
        raise ProgramError(payload.decode("utf-8", "replace")[:500])


def _update(target, text, cap):
    """An argument the program mutated (a list, dict or set) takes its new contents, as a caller's would."""
    try:
        new = literal(text, cap)
    except ValueError:
        return
    if type(target) is list and type(new) is list:
        target[:] = new
    elif type(target) in (dict, set) and type(new) is type(target):
        target.clear()
        target.update(new)


class Names(dict):
    """A test's globals: its own names, then builtins, then this process's standard library, then the program's."""

    def __init__(self, program):
        super().__init__(__builtins__=builtins, __name__="__test__")
        self.program = program

    def __missing__(self, name):
        if hasattr(builtins, name):
            raise KeyError(name)  # the lookup falls through to this process's builtins
        if name in STDLIB:
            value = __import__(name)
        else:
            try:
                value = self.program.lookup(name)
            except KeyError:
                raise KeyError(name) from None
        self[name] = value
        return value


def run_stdin_cases(program, sources):
    """[(stdout, None) or (None, error)] for consecutive stdin cases: one request, one reply each."""
    try:
        program.send(("stdin", sources))
    except ProgramError as err:
        return [(None, str(err)[:500])] * len(sources)
    outcomes = []
    for _ in sources:
        try:
            reply, payload, _ = program.receive()
            outcomes.append((payload, None) if reply == b"o" else (None, payload.decode("utf-8", "replace")[:500]))
        except ProgramError as err:
            outcomes.append((None, str(err)[:500]))
    return outcomes


def is_program_call(source):
    """Whether a value case is a call chain of the program's own names with literal arguments (``f(1, [2])``,
    ``Solution().add(2, 7)``): such cases go to the program's process at once, evaluated there, as calls over
    the pipe would be. Anything rooted at a builtin or a standard-library module is evaluated here."""
    import _ast

    try:
        node = compile(source, "<test>", "eval", _ast.PyCF_ONLY_AST).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    if type(node) is not _ast.Call:
        return False
    while type(node) in (_ast.Call, _ast.Attribute):
        if type(node) is _ast.Call:
            arguments = [*node.args, *(k.value for k in node.keywords)]
            if any(k.arg is None for k in node.keywords) or not all(is_literal(_ast, a) for a in arguments):
                return False
            node = node.func
        else:
            node = node.value
    return type(node) is _ast.Name and not hasattr(builtins, node.id) and node.id not in STDLIB


def run_calls(program, sources):
    """[(tagged JSON, None) or (None, error)] for consecutive value cases that are program calls: one request."""
    try:
        program.define()
        program.send(("calls", sources))
    except ProgramError as err:
        return [(None, str(err)[:500])] * len(sources)
    outcomes = []
    for _ in sources:
        try:
            outcomes.append(_output(program, program.decode(program.receive())))
        except ProgramError as err:
            outcomes.append((None, str(err)[:500]))
        except BaseException as err:  # noqa: B036 - the program's exception, raised here by name
            outcomes.append((None, f"{type(err).__name__}: {err}"[:500]))
    return outcomes


def run_case(program, kind, source):
    """(output, None) or (None, error) for a value or script case: a value's tagged JSON, or b"" for a script."""
    try:
        program.define()
        sys.modules["solution"] = program.module()
        if kind == "script":  # run to the end, then its test functions and classes called (``collect``)
            names = Names(program)
            exec(compile(source, "<test>", "exec"), names)
            run_collected(names, source)
            return b"", None
        return _output(program, eval(compile(source, "<test>", "eval"), Names(program)))
    except ProgramError as err:  # the program's own error (or its death), as it reported it
        return None, str(err)[:500]
    except SystemExit as err:
        return None, f"SystemExit: {err.code}"
    except BaseException as err:  # noqa: B036 - test code and the program's answers may raise anything
        return None, f"{type(err).__name__}: {err}"[:500]


def _output(program, value):
    """A value case's record: its tagged JSON, refused past the cap (a ``Remote`` is no value: TypeError)."""
    text = encode(value).encode()
    if len(text) > program.value_cap:
        return None, f"value longer than {program.value_cap} bytes"
    return text, None


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd, size):
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the program's process closed its channel")
        data += chunk
    return bytes(data)
