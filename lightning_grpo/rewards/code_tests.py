"""A row's ``test_cases`` -> sandbox cases plus expected values kept here, and the verdict from their outputs.

The verdict is made in the trainer's process, from data the sandbox returned: the program's stdout per stdin
case, or a value as tagged JSON (``decode_value``: built-in types and fractions, length-capped before it is
parsed, so no object with an always-equal ``__eq__`` reaches the comparison), compared by ``equal`` (Python's
``==``, NaN matching NaN). Expected values never enter the sandbox.

Asserts of the HumanEval/MBPP shape, ``assert f(1, [2]) == (3, 4)`` (also ``is None/True/False``, a bare
``assert f(1)`` or ``assert not f(1)``; directly, or in HumanEval's ``def check(candidate)`` called on ``f``),
become a value case ``f(1, [2])`` and an expected ``(3, 4)``; data converters around the call (``sorted(f(1))``)
are applied by the sandbox's grader, outside the program's process, with its own builtins. Any other test code
(``math.isclose(f(1), 2.5)``, a mix of asserts) becomes a script case: it also runs in the grader, never in the
program's process, calling the program over a pipe with only literals coming back, and passes when it runs to
the end and every test function or class it defines passes, called as pytest would collect it
(``sandbox/inside/collect.py``: a KodCode file of ``def test_*`` functions asserts nothing by merely running). A
test string that mixes plain asserts with other code runs whole as one script there, so its expected values never
reach the program either.
"""

from __future__ import annotations

import ast
import copy
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from lightning_grpo.sandbox.records import decode_value
from lightning_grpo.sandbox.runner import Case

TEST_FORMATS = "a list of assert strings, a list of {'input', 'output'} dicts, {'inputs': [...], 'outputs': [...]}"
CONVERTERS = frozenset({"set", "frozenset", "sorted", "list", "tuple", "str", "int", "float", "abs", "round", "len"})
SINGLETONS = (None, True, False)
SPELLED = {"math.inf": math.inf, "math.nan": math.nan}  # expected values a test spells as a name (no literal)
FRACTION_NAMES = ("Fraction", "fractions.Fraction")
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


@dataclass(frozen=True)
class Check:
    """One case and how its output is judged: ``compare`` in "stdout", "eq", "is", "truthy", "falsy", "ran"."""

    case: Case
    compare: str
    expected: Any = None


Test = tuple[Check, ...]  # a test passes when all its checks pass


def parse_tests(value: Any) -> list[Test] | None:
    """One row's tests; None when there are none. Formats: see ``TEST_FORMATS``, or a JSON string of one.

    >>> [c.compare for t in parse_tests(["assert f(1) == 2", "assert g(x) > 1"]) for c in t]
    ['eq', 'ran']
    >>> parse_tests('{"inputs": ["1\\\\n"], "outputs": ["2\\\\n"]}')[0][0].expected
    '2\\n'
    >>> parse_tests([]), parse_tests(None)
    (None, None)
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [value]  # a script of asserts, all-or-nothing
    if isinstance(value, dict) and "inputs" in value:
        value = [{"input": i, "output": o} for i, o in zip(value["inputs"], value.get("outputs", []), strict=True)]
    elif isinstance(value, dict):
        value = [value]
    if value is None or (isinstance(value, list) and not value):
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) or _is_io_test(t) for t in value):
        raise ValueError(f"test_cases must be {TEST_FORMATS} (or such a JSON string), got {value!r:.200}")
    return [_assert_test(t) if isinstance(t, str) else _stdin_test(t) for t in value]


def _is_io_test(test: Any) -> bool:
    return isinstance(test, dict) and "input" in test and "output" in test


def _stdin_test(test: dict) -> Test:
    return (Check(Case("stdin", str(test["input"])), "stdout", str(test["output"])),)


def _assert_test(source: str) -> Test:
    """Every statement a simple assert (directly or in a HumanEval ``check``): one value check each; otherwise
    the whole source as one script."""
    try:
        statements = _unwrap_check_function(ast.parse(source).body)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        statements = []
    checks = [_simple_check(s) for s in statements if not _is_assert_true(s)]
    if checks and all(checks):
        return tuple(checks)
    return (Check(Case("script", source), "ran"),)


def _unwrap_check_function(statements: list[ast.stmt]) -> list[ast.stmt]:
    """HumanEval's ``[METADATA = {...}] def check(candidate): <asserts>  check(name)`` -> the asserts on ``name``.

    Anything else is returned as it is.
    """
    body = [s for s in statements if not (isinstance(s, ast.Assign) and _literal(s.value)[0])]
    if len(body) != 2 or not isinstance(body[0], ast.FunctionDef) or not isinstance(body[1], ast.Expr):
        return statements
    check, call = body[0], body[1].value
    parameters = [a.arg for a in check.args.args]
    if not (
        len(parameters) == 1
        and not check.decorator_list
        and isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == check.name
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Name)
        and not call.keywords
    ):
        return statements
    rename = _Rename(parameters[0], call.args[0].id)
    return [rename.visit(s) for s in check.body if not _is_docstring(s)]


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _is_assert_true(statement: ast.stmt) -> bool:
    """HumanEval's ``assert True`` filler lines: nothing to run."""
    return (
        isinstance(statement, ast.Assert) and isinstance(statement.test, ast.Constant) and statement.test.value is True
    )


def _simple_check(statement: ast.stmt) -> Check | None:
    if not isinstance(statement, ast.Assert):
        return None
    test = statement.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq | ast.Is):
        compare = "eq" if isinstance(test.ops[0], ast.Eq) else "is"
        for expression, literal in [(test.left, test.comparators[0]), (test.comparators[0], test.left)]:
            found, expected = _expected(literal)
            if found and _is_data_call(expression) and (compare == "eq" or expected in SINGLETONS):
                return Check(Case("value", ast.unparse(expression)), compare, expected)
        return None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_data_call(test.operand):
        return Check(Case("value", ast.unparse(test.operand)), "falsy")
    if _is_data_call(test):
        return Check(Case("value", ast.unparse(test)), "truthy")
    return None


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except _LITERAL_ERRORS:
        return False, None


def _expected(node: ast.expr) -> tuple[bool, Any]:
    """An expected value: a literal, at any depth also ``float('inf')``, ``math.inf``, ``math.nan`` and
    ``Fraction(1, 3)`` (built here, never taken from the program). Arguments stay plain literals (``_literal``).

    >>> _expected(ast.parse("[float('-inf'), math.nan, Fraction(1, 3)]", mode="eval").body)
    (True, [-inf, nan, Fraction(1, 3)])
    """
    return _literal(_Spelled().visit(copy.deepcopy(node)))


class _Spelled(ast.NodeTransformer):
    """Values Python spells with a name or a call -> constants, which ``ast.literal_eval`` reads as they are."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        name = _dotted(node)
        return ast.Constant(SPELLED[name]) if name in SPELLED else node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        name, found, arguments = _dotted(node.func), *_literal(ast.Tuple(node.args, ast.Load()))
        if not found or node.keywords:
            return self.generic_visit(node)
        try:
            if name == "float" and len(arguments) == 1 and isinstance(arguments[0], str):
                return ast.Constant(float(arguments[0]))
            if name in FRACTION_NAMES and 1 <= len(arguments) <= 2:
                return ast.Constant(Fraction(*arguments))
        except (ValueError, TypeError, ZeroDivisionError):
            pass
        return self.generic_visit(node)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return f"{_dotted(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else ""


def _is_data_call(node: ast.expr) -> bool:
    """``f(literals)``, ``obj.f(literals)``, or a converter (``sorted``, ``set`` ...) of one such call."""
    if not isinstance(node, ast.Call) or not _is_name_chain(node.func):
        return False
    arguments = [*node.args, *(k.value for k in node.keywords)]
    if isinstance(node.func, ast.Name) and node.func.id in CONVERTERS and arguments:
        first, rest = arguments[0], arguments[1:]
        return _is_data_call(first) and all(_literal(a)[0] for a in rest)
    return all(_literal(a)[0] for a in arguments)


def _is_name_chain(node: ast.expr) -> bool:
    """``f``, ``m.f``, or LeetCode's ``Solution().f``: names, attributes and calls with literal arguments."""
    while isinstance(node, ast.Attribute | ast.Call):
        if isinstance(node, ast.Call):
            if not all(_literal(a)[0] for a in [*node.args, *(k.value for k in node.keywords)]):
                return False
            node = node.func
        else:
            node = node.value
    return isinstance(node, ast.Name)


def passes(check: Check, output: bytes | None) -> bool:
    """The verdict for one check from what the sandbox returned (None: the case did not finish)."""
    if output is None:
        return False
    if check.compare == "stdout":
        return _lines(output.decode("utf-8", errors="replace")) == _lines(check.expected)
    if check.compare == "ran":
        return True
    try:
        value = decode_value(output)  # refuses an over-long text before parsing it
    except ValueError:
        return False  # not a value of built-in types
    if check.compare == "eq":
        return equal(value, check.expected)
    if check.compare == "is":
        return value is check.expected
    return bool(value) == (check.compare == "truthy")


def equal(value: Any, expected: Any) -> bool:
    """Python's ``==`` (built-in types and fractions on both sides, as the assert had them), except that NaN
    matches NaN at any depth, as ``numpy.testing.assert_equal`` has it: a test expecting ``float('nan')`` means one.

    >>> equal([1.0, float("nan")], [1, math.nan]), equal(float("nan"), 0.0), equal(Fraction(1, 2), 0.5)
    (True, False, True)
    """
    if isinstance(value, float) and isinstance(expected, float) and math.isnan(value) and math.isnan(expected):
        return True
    if type(value) is type(expected) and type(value) in (list, tuple):
        return len(value) == len(expected) and all(map(equal, value, expected))
    if type(value) is type(expected) is dict:
        return value.keys() == expected.keys() and all(equal(value[k], expected[k]) for k in value)
    return value == expected


def _lines(text: str) -> list[str]:
    """Output compared as judges do: trailing spaces and blank lines at either end do not count."""
    return [line.rstrip() for line in str(text).strip().splitlines()]
