"""A test module's namespace, after its code ran -> its test functions and classes called as pytest collects
them; the first that fails raises ``Failed``. Runs in the sandbox's first process; knows nothing of the program.

A test file of the KodCode/pytest shape (``from solution import add`` then ``def test_add(): assert ...``) asserts
nothing when it merely runs: its functions are defined, never called. pytest collects, in the order the module
defines them: functions named ``test*``; classes named ``Test*`` (without an ``__init__``), each ``test*`` method
called on a fresh instance; and ``unittest.TestCase`` subclasses of any name, which unittest runs itself. pytest's
xunit hooks run around them as it runs them (``setup_module``/``teardown_module``, ``setup_function``,
``setup_class``, ``setup_method`` and their teardowns). Only what the test defined is collected, never the
program's names it imported. A test function that takes arguments asks for pytest fixtures, and pytest is not
here: unless the test calls it itself, the test is refused (``NotRunnable``), a failed test, never a call with
arguments missing.
"""

import sys
import types

MODULE = "__test__"  # the test's ``__name__`` (``grader.Names``): what it defines carries it as ``__module__``


class Failed(Exception):
    """A collected test failed or raised; the message names it and what it raised."""


class NotRunnable(Failed):
    """The test needs what only pytest gives (fixtures), or pytest could not collect it (a class's ``__init__``)."""


def run_collected(names, source):
    """Call every test the module ``names`` (its globals, after ``source`` ran) defines, as pytest would."""
    items = list(names.items())  # a snapshot: a function's first look-up of a program name adds it to ``names``
    tests = [(name, value) for name, value in items if _defined_here(value) and _is_test(name, value)]
    if not tests:
        return
    module = types.SimpleNamespace(**dict(items))
    _hook(module, "setup_module", module)
    for name, value in tests:
        if type(value) is types.FunctionType:
            _run_function(module, name, value, source)
        elif _is_unittest(value):
            _run_unittest(value)
        else:
            _run_class(name, value)
    _hook(module, "teardown_module", module)


def _defined_here(value):
    return (type(value) is types.FunctionType or isinstance(value, type)) and value.__module__ == MODULE


def _is_test(name, value):
    if type(value) is types.FunctionType:
        return name.startswith("test")
    return name.startswith("Test") or _is_unittest(value)


def _is_unittest(value):
    unittest = sys.modules.get("unittest")  # a TestCase subclass means the test imported unittest
    return unittest is not None and isinstance(value, type) and issubclass(value, unittest.TestCase)


def _run_function(module, name, function, source):
    if _required(function, 0) and name in _called_by(source):
        return  # the test's own helper (``def test_sum(f)`` ... ``test_sum(add)``): it ran when the code did
    _refuse_fixtures(name, function, 0)
    _hook(module, "setup_function", function)
    _call(name, function)
    _hook(module, "teardown_function", function)


def _run_class(name, cls):
    """A plain ``Test*`` class: each ``test*`` method (its own or inherited) on a fresh instance."""
    if cls.__init__ is not object.__init__ or cls.__new__ is not object.__new__:
        raise NotRunnable(f"pytest cannot collect {name}: it has an __init__ (or __new__) constructor")
    members = {}
    for klass in reversed(cls.__mro__[:-1]):
        members.update(vars(klass))
    _hook(cls, "setup_class", cls)
    for method_name, member in members.items():
        function, skip = _function_of(member)
        if function is None or not method_name.startswith("test"):
            continue
        _refuse_fixtures(f"{name}.{method_name}", function, skip)
        instance = cls()
        method = getattr(instance, method_name)
        _hook(instance, "setup_method", method)
        _call(f"{name}.{method_name}", method)
        _hook(instance, "teardown_method", method)
    _hook(cls, "teardown_class", cls)


def _function_of(member):
    """(the function, how many leading parameters the call fills: self or cls) of a class member, else (None, 0)."""
    if isinstance(member, staticmethod):
        return member.__func__, 0
    if isinstance(member, classmethod):
        return member.__func__, 1
    return (member, 1) if type(member) is types.FunctionType else (None, 0)


def _run_unittest(cls):
    """A ``unittest.TestCase``: run by unittest (``setUp``, ``setUpClass``, skips, expected failures as it has them)."""
    import unittest

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
    for test, trace in result.errors + result.failures:
        last = trace.strip().splitlines()[-1] if trace.strip() else "failed"
        raise Failed(f"{_test_id(test)}: {last}")
    if result.unexpectedSuccesses:
        raise Failed(f"{_test_id(result.unexpectedSuccesses[0])}: passed, but is marked expectedFailure")


def _test_id(test):
    return test.id().removeprefix(f"{MODULE}.")


def _call(name, function):
    try:
        function()
    except BaseException as err:  # noqa: B036 - a test fails on anything it raises, as under pytest
        raise Failed(f"{name}: {type(err).__name__}: {err}") from None


def _hook(owner, hook, argument):
    """pytest's xunit ``hook`` of ``owner`` (the module, a class, an instance) if the test defines it, given
    ``argument`` when it takes one (pytest's rule)."""
    function = getattr(owner, hook, None)
    if type(function) is types.MethodType:  # its self or cls is given
        takes = function.__func__.__code__.co_argcount - 1
    elif type(function) is types.FunctionType:
        takes = function.__code__.co_argcount
    else:
        return  # none, or not the test's (never a name it took from the program)
    try:
        function(argument) if takes > 0 else function()
    except BaseException as err:  # noqa: B036 - a failing setup or teardown fails the test
        raise Failed(f"{hook}: {type(err).__name__}: {err}") from None


def _required(function, skip):
    """The parameters of ``function`` (after the first ``skip``) that have no default: pytest fixtures."""
    code = function.__code__
    positional = code.co_varnames[skip : code.co_argcount]
    defaults = len(function.__defaults__ or ())
    keyword = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    given = function.__kwdefaults__ or {}
    return [*positional[: max(len(positional) - defaults, 0)], *(k for k in keyword if k not in given)]


def _refuse_fixtures(name, function, skip):
    required = _required(function, skip)
    if required:
        wanted = ", ".join(required)
        raise NotRunnable(f"{name} takes pytest fixtures ({wanted}): pytest is not in the sandbox to give them")


def _called_by(source):
    """Names the test's code calls itself (``check(add)``), outside ``if __name__ == "__main__":``, which never
    runs here: such a function is the test's helper, already run by it, not one for pytest to collect."""
    import ast

    called, pending = set(), [ast.parse(source)]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            called.add(node.func.id)
        pending.extend(ast.iter_child_nodes(node))
    return called
