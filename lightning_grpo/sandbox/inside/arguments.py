"""A test's call argument that is not a literal -> a pickle made in the grader -> the object in the program's process.

Literals cross as marshal and the program's own objects as handles (``remote.argument``); anything else that
pickles (a ``range``, a ``Fraction``, a ``deque``) crosses as a pickle made here, in the trusted grader, and is read
in the program's process, which can only hurt itself with it: nothing is ever unpickled in the grader, whose values
come back as literals. Functions the test code defines (a lambda passed as a ``key``) cross as their code
(``marshal``) with their defaults, closure and the globals the test gave them, and are rebuilt in the program's
process, where they run as the function under test runs any argument: the test's lambda is handed to the program,
as a call hands it in Python. Their other names resolve as the grader's do (``grader.Names``): builtins, the
standard library, then the program's names. Standard library only; knows nothing of verdicts.
"""

import builtins
import io
import marshal
import pickle
import sys
import types

TEST_FILENAME = "<test>"  # what the grader compiles test code as: the functions that cross as code
NAMESPACE = ("namespace",)  # the persistent id of the program's namespace
_Namespace = type("_Namespace", (), {})  # a marker the pickler replaces by NAMESPACE


class Pickler(pickle.Pickler):
    """Pickles an argument in the grader; ``handle(obj)`` is the program's id of an object that lives there."""

    def __init__(self, file, handle):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.handle = handle

    def persistent_id(self, obj):
        if type(obj) is _Namespace:
            return NAMESPACE
        ident = self.handle(obj)
        return None if ident is None else ("h", ident)

    def reducer_override(self, obj):
        if type(obj) is types.FunctionType and obj.__code__.co_filename == TEST_FILENAME:
            return function, self.function_parts(obj)
        if type(obj) is types.ModuleType:
            return _module, (obj.__name__,)
        return NotImplemented

    def function_parts(self, fn):
        """What ``function`` rebuilds ``fn`` from: its code, the globals the test gave it that can cross (itself
        by name only: a recursive function), defaults, closure (ValueError: an empty cell cannot cross), and the
        program's namespace as the fallback of its globals."""
        given = [name for name in _names(fn.__code__) if dict.__contains__(fn.__globals__, name)]
        names = {name: fn.__globals__[name] for name in sorted(given)}
        recursive = [name for name, value in names.items() if value is fn]
        names = {name: value for name, value in names.items() if value is not fn and self.crosses(value)}
        cells = [cell.cell_contents for cell in fn.__closure__ or ()]
        return marshal.dumps(fn.__code__), names, recursive, fn.__defaults__, fn.__kwdefaults__, cells, _Namespace()

    def crosses(self, value):
        """Whether ``value`` pickles: a name the function may not use (``co_names`` holds attribute names too)
        is left out rather than failing the call."""
        try:
            Pickler(io.BytesIO(), self.handle).dump(value)
            return True
        except (pickle.PicklingError, TypeError, AttributeError, ValueError, RecursionError):
            return False


def dumps(value, handle):
    """``value`` pickled for the program's process; ValueError naming what cannot cross."""
    buffer = io.BytesIO()
    try:
        Pickler(buffer, handle).dump(value)
    except (pickle.PicklingError, TypeError, AttributeError, ValueError, RecursionError) as err:
        raise ValueError(f"cannot send {type(value).__name__} to the program: {err}") from None
    return buffer.getvalue()


def loads(data, objects, namespace):
    """In the program's process: the argument, its handles the program's ``objects``, functions in ``namespace``."""
    unpickler = pickle.Unpickler(io.BytesIO(data))
    unpickler.persistent_load = lambda ident: namespace if ident == NAMESPACE else objects[ident[1]]
    return unpickler.load()


def _names(code):
    """The global (and attribute) names ``code`` and the functions nested in it read."""
    found = set(code.co_names)
    for const in code.co_consts:
        if type(const) is types.CodeType:
            found |= _names(const)
    return found


class Globals(dict):
    """A test function's globals in the program's process: the names the test gave it, then builtins, the standard
    library and the program's names, in the order the grader's ``Names`` has them."""

    def __init__(self, names, namespace):
        super().__init__(names, __builtins__=builtins)
        self.namespace = namespace

    def __missing__(self, name):
        if hasattr(builtins, name):
            raise KeyError(name)  # the lookup falls through to builtins
        if name in sys.stdlib_module_names:
            return __import__(name)
        return self.namespace[name]


def function(code, names, recursive, defaults, kwdefaults, cells, namespace):
    """A test's function rebuilt in the program's process (``pickle`` calls it with ``_function_parts``)."""
    closure = tuple(types.CellType(value) for value in cells) or None
    rebuilt = types.FunctionType(marshal.loads(code), Globals(names, namespace), None, defaults, closure)
    rebuilt.__kwdefaults__ = kwdefaults
    for name in recursive:
        rebuilt.__globals__[name] = rebuilt
    return rebuilt


def _module(name):
    __import__(name)
    return sys.modules[name]
