"""The program's objects as the grader sees them: handles (``Remote``), the built-in values of the program's
subclasses of built-in types (``Handled``), and how a call's arguments cross (``argument``). Runs in the sandbox's
first process; nothing here ever runs the program's code or parses more than a literal of what it sent.
"""

import marshal


class ProgramError(Exception):
    """The program raised something that is not a built-in exception (or the program's process is gone)."""


class Remote:
    """An object living in the program's process; equal only to itself."""

    __slots__ = ("_program", "_id")

    def __init__(self, program, ident):
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_id", ident)

    def __call__(self, *args, **kwargs):
        wire = [argument(a) for a in args], {k: argument(v) for k, v in kwargs.items()}
        sent = {**{str(i): a for i, a in enumerate(args)}, **kwargs}  # the program's in-place changes come back
        return self._program.result(("call", self._id, *wire), sent)

    def __getattr__(self, name):
        return self._program.result(("attr", self._id, name))

    def __bool__(self):
        return _exactly(bool, self._program.result(("op", self._id, "bool")))

    def __len__(self):
        return _exactly(int, self._program.result(("op", self._id, "len")))

    def __iter__(self):
        return iter(_exactly(list, self._program.result(("op", self._id, "list"))))

    def __repr__(self):
        return f"<object {self._id} of the program>"


class Handled:
    """What the program's instance of a subclass of a built-in type (a ``Counter``, a ``namedtuple``, an
    ``IntEnum``) is here: its built-in value (compared, hashed, indexed, iterated as one, as the built-in's ``==``
    compares the program's object), in a subclass of the built-in made here, one per type, whose other attributes
    (a field, ``most_common``) are asked of the program's object."""

    types = {}  # built-in type -> its Handled subclass

    @classmethod
    def of(cls, value, remote):
        kind = type(value)
        if kind not in cls.types:
            cls.types[kind] = type(f"Program{kind.__name__.title()}", (kind,), {"__getattr__": cls.__getattr__})
        handled = cls.types[kind](value)
        handled._remote = remote
        return handled

    def __getattr__(self, name):
        remote = self.__dict__.get("_remote")
        if remote is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(remote, name)


def _exactly(kind, value):
    if type(value) is not kind:
        raise TypeError(f"the program answered a {type(value).__name__} where a {kind.__name__} was due")
    return value


def argument(value):
    """How a call's argument crosses: the program's own object by its id, a literal as itself (marshal), else
    pickled here (``arguments``: a ``range``, a lambda the test defines)."""
    ident = _handle(value)
    if ident is not None:
        return ("h", ident)
    try:
        marshal.dumps(value)
        return ("v", value)
    except ValueError:
        pass
    try:
        from . import arguments
    except ImportError:  # inside the sandbox
        import arguments
    try:
        return ("p", arguments.dumps(value, _handle))
    except ValueError as err:
        raise ProgramError(f"arguments must be data, the test's functions or the program's objects: {err}") from None


def _handle(value):
    """The program's id of an object that lives there (a handle, or the value of one: a ``Counter`` it returned,
    passed back as a caller would pass it), else None."""
    if type(value) is Remote:
        return value._id
    if type(value) in Handled.types.values():
        return value._remote._id
    return None
