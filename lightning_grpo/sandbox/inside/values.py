"""Text <-> literal values of built-in types, inside the sandbox. Knows nothing of programs or tests.

``plain`` turns a value into the built-in value its ``==`` compares (a ``Counter`` into its dict, a ``namedtuple``
into its tuple) before the program's process sends its ``repr``; ``literal`` reads that ``repr`` (untrusted: capped,
then parsed as an AST whose nodes may only be literals, ``inf``, ``nan`` and ``Fraction(n, d)``, so no code runs and
no other type comes out); ``encode`` writes a value as tagged JSON for the trainer, which parses it with ``json`` in
C (``records.decode_value``).
"""

import _json
import sys

_LITERALS = (int, float, complex, str, bytes, bool, type(None))
_REPR_NAMES = {"inf": float("inf"), "nan": float("nan")}  # how repr writes these floats
PLAIN_DEPTH = 100  # deeper than this a value is left as it is (its repr will not parse: it stays a handle)
# the built-in value of an instance of a subclass, read past any override, as the built-in's == reads it
_SCALAR_VALUE = {
    int: int.__int__,
    float: float.__float__,
    complex: lambda v: complex(complex.real.__get__(v), complex.imag.__get__(v)),
    str: str.__str__,
    bytes: lambda v: bytes(memoryview(v)),
}
_CONTAINERS = (list, tuple, set, frozenset, dict)
PLAIN_BASES = (*_SCALAR_VALUE, *_CONTAINERS)  # the built-in types a subclass is read as (bool has no subclasses)


def literal(text, cap):
    """A literal of built-in types parsed from ``text`` (at most ``cap`` bytes); ValueError for anything else.

    >>> literal(b"(1, [2.5, None], {'a': {3}}, -1j, b'x', -inf, Fraction(1, 3))", 100)
    (1, [2.5, None], {'a': {3}}, (-0-1j), b'x', -inf, Fraction(1, 3))
    """
    if len(text) > cap:
        raise ValueError(f"value text longer than {cap} bytes")
    try:
        import _ast

        tree = compile(text.decode("utf-8", "strict"), "<value>", "eval", _ast.PyCF_ONLY_AST)
        return _node(_ast, tree.body, reprs=True)
    except (SyntaxError, UnicodeDecodeError, TypeError, MemoryError, RecursionError, ZeroDivisionError) as err:
        raise ValueError(f"not a literal: {type(err).__name__}") from None


def _node(_ast, node, reprs=False):
    """The value of a literal node; with ``reprs`` also what ``repr`` writes that is no literal: ``inf``, ``nan``
    and ``Fraction(n, d)``."""
    kind = type(node)
    if kind is _ast.Constant and type(node.value) in _LITERALS:
        return node.value
    if kind in (_ast.Tuple, _ast.List, _ast.Set):
        items = [_node(_ast, e, reprs) for e in node.elts]
        return {_ast.Tuple: tuple, _ast.List: list, _ast.Set: set}[kind](items)
    if kind is _ast.Dict and None not in node.keys:
        return {_node(_ast, k, reprs): _node(_ast, v, reprs) for k, v in zip(node.keys, node.values)}
    if kind is _ast.Call and type(node.func) is _ast.Name and node.func.id == "set" and not node.args:
        return set()
    if reprs and kind is _ast.Name and node.id in _REPR_NAMES:
        return _REPR_NAMES[node.id]
    if reprs and kind is _ast.Call and type(node.func) is _ast.Name and node.func.id == "Fraction":
        return _fraction([_node(_ast, a, reprs) for a in node.args], node.keywords)
    if kind is _ast.UnaryOp and type(node.op) in (_ast.USub, _ast.UAdd):
        operand = _node(_ast, node.operand, reprs)
        if type(operand) in (int, float, complex):
            return -operand if type(node.op) is _ast.USub else operand
    if kind is _ast.BinOp and type(node.op) in (_ast.Add, _ast.Sub):
        left, right = _node(_ast, node.left, reprs), _node(_ast, node.right, reprs)
        if type(left) in (int, float) and type(right) is complex:
            return left + right if type(node.op) is _ast.Add else left - right
    raise TypeError(f"{kind.__name__} is not a literal")


def _fraction(arguments, keywords):
    if keywords or len(arguments) != 2 or not all(type(a) is int for a in arguments):
        raise TypeError("Fraction(numerator, denominator) takes two ints")
    from fractions import Fraction

    return Fraction(*arguments)


def is_literal(_ast, node):
    """Whether an AST node is a literal ``literal`` would accept (names and calls excluded)."""
    try:
        _node(_ast, node)
        return True
    except (TypeError, RecursionError, MemoryError):
        return False


def plain(value, budget=None):
    """``value`` with every instance of a subclass of a built-in type (a ``Counter``, ``defaultdict``,
    ``namedtuple``, ``IntEnum``) replaced by the built-in value it compares as, at any depth; anything else left as
    it is. ``budget``: the most items to visit, OverflowError past it (a value that large has too long a repr).

    >>> from collections import Counter, namedtuple
    >>> plain([Counter("aab"), namedtuple("P", "x y")(1, 2)])
    [{'a': 2, 'b': 1}, (1, 2)]
    """
    return _plain(value, [budget], 0)


def _plain(value, budget, depth):
    kind = type(value)
    if budget[0] is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise OverflowError("too many items")
    if kind in _LITERALS:
        return value
    base = kind if kind in _CONTAINERS else built_in_base(value)
    if base is None or depth > PLAIN_DEPTH:
        return value
    if base in _SCALAR_VALUE:
        return _SCALAR_VALUE[base](value)
    if base is dict:
        return {_plain(k, budget, depth + 1): _plain(v, budget, depth + 1) for k, v in dict.items(value)}
    return base(_plain(v, budget, depth + 1) for v in base.__iter__(value))


def built_in_base(value):
    """The built-in type whose subclass ``value`` is an instance of (``dict`` for a ``Counter``), else None."""
    if type(value) in _LITERALS or type(value) in _CONTAINERS:
        return None
    return next((b for b in PLAIN_BASES if isinstance(value, b)), None)


def encode(value):
    """Tagged JSON of a literal: lists and scalars as JSON; tuples, sets, frozensets, dicts, bytes, complex numbers
    and fractions as one-key objects (``t``, ``s``, ``f``, ``d``, ``b``, ``c``, ``q``); a subclass of a built-in
    type as the built-in value (``plain``). TypeError for anything else.

    >>> encode((1, [2.5, None], {"a": {True}}, b"x"))
    '{"t":[1,[2.5,null],{"d":[["a",{"s":[true]}]]},{"b":"x"}]}'
    """
    return _encode(plain(value))


def _encode(value):
    kind = type(value)
    if value is None or kind is bool:
        return {None: "null", True: "true", False: "false"}[value]
    if kind is int:
        return str(value)
    if kind is float:
        return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(repr(value), repr(value))
    if kind is str:
        return _json.encode_basestring_ascii(value)
    if kind is list:
        return "[" + ",".join(_encode(v) for v in value) + "]"
    if kind in _TAGS:
        return f'{{"{_TAGS[kind]}":{_TAGS_BODY[kind](value)}}}'
    if kind is getattr(sys.modules.get("fractions"), "Fraction", None):  # only once something made one
        return f'{{"q":[{value.numerator},{value.denominator}]}}'
    raise TypeError(f"a {kind.__name__} is not a literal of built-in types")


_TAGS = {tuple: "t", set: "s", frozenset: "f", dict: "d", bytes: "b", complex: "c"}
_TAGS_BODY = {
    tuple: lambda v: _encode(list(v)),
    set: lambda v: _encode(list(v)),
    frozenset: lambda v: _encode(list(v)),
    dict: lambda v: _encode([[k, x] for k, x in v.items()]),
    bytes: lambda v: _json.encode_basestring_ascii(v.decode("latin-1")),
    complex: lambda v: _encode([v.real, v.imag]),
}
