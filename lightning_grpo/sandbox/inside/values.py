"""Text <-> literal values of built-in types, inside the sandbox. Knows nothing of programs or tests.

``literal`` reads what the program's process sent (a ``repr``, untrusted: capped, then parsed as an AST whose
nodes may only be literals, so no code runs and no other type comes out); ``encode`` writes a value as tagged
JSON for the trainer, which parses it with ``json`` in C (``records.decode_value``).
"""

import _json

_LITERALS = (int, float, complex, str, bytes, bool, type(None))


def literal(text, cap):
    """A literal of built-in types parsed from ``text`` (at most ``cap`` bytes); ValueError for anything else.

    >>> literal(b"(1, [2.5, None], {'a': {3}}, -1j, b'x')", 100)
    (1, [2.5, None], {'a': {3}}, (-0-1j), b'x')
    """
    if len(text) > cap:
        raise ValueError(f"value text longer than {cap} bytes")
    try:
        import _ast

        tree = compile(text.decode("utf-8", "strict"), "<value>", "eval", _ast.PyCF_ONLY_AST)
        return _node(_ast, tree.body)
    except (SyntaxError, UnicodeDecodeError, TypeError, MemoryError, RecursionError) as err:
        raise ValueError(f"not a literal: {type(err).__name__}") from None


def _node(_ast, node):
    kind = type(node)
    if kind is _ast.Constant and type(node.value) in _LITERALS:
        return node.value
    if kind in (_ast.Tuple, _ast.List, _ast.Set):
        items = [_node(_ast, e) for e in node.elts]
        return {_ast.Tuple: tuple, _ast.List: list, _ast.Set: set}[kind](items)
    if kind is _ast.Dict and None not in node.keys:
        return {_node(_ast, k): _node(_ast, v) for k, v in zip(node.keys, node.values)}
    if kind is _ast.Call and type(node.func) is _ast.Name and node.func.id == "set" and not node.args:
        return set()
    if kind is _ast.UnaryOp and type(node.op) in (_ast.USub, _ast.UAdd):
        operand = _node(_ast, node.operand)
        if type(operand) in (int, float, complex):
            return -operand if type(node.op) is _ast.USub else operand
    if kind is _ast.BinOp and type(node.op) in (_ast.Add, _ast.Sub):
        left, right = _node(_ast, node.left), _node(_ast, node.right)
        if type(left) in (int, float) and type(right) is complex:
            return left + right if type(node.op) is _ast.Add else left - right
    raise TypeError(f"{kind.__name__} is not a literal")


def is_literal(_ast, node):
    """Whether an AST node is a literal ``literal`` would accept."""
    try:
        _node(_ast, node)
        return True
    except (TypeError, RecursionError, MemoryError):
        return False


def encode(value):
    """Tagged JSON of a literal: lists and scalars as JSON; tuples, sets, frozensets, dicts, bytes and complex
    numbers as one-key objects (``t``, ``s``, ``f``, ``d``, ``b``, ``c``). TypeError for anything else.

    >>> encode((1, [2.5, None], {"a": {True}}, b"x"))
    '{"t":[1,[2.5,null],{"d":[["a",{"s":[true]}]]},{"b":"x"}]}'
    """
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
        return "[" + ",".join(encode(v) for v in value) + "]"
    if kind in _TAGS:
        return f'{{"{_TAGS[kind]}":{_TAGS_BODY[kind](value)}}}'
    raise TypeError(f"a {kind.__name__} is not a literal of built-in types")


_TAGS = {tuple: "t", set: "s", frozenset: "f", dict: "d", bytes: "b", complex: "c"}
_TAGS_BODY = {
    tuple: lambda v: encode(list(v)),
    set: lambda v: encode(list(v)),
    frozenset: lambda v: encode(list(v)),
    dict: lambda v: encode([[k, x] for k, x in v.items()]),
    bytes: lambda v: _json.encode_basestring_ascii(v.decode("latin-1")),
    complex: lambda v: encode([v.real, v.imag]),
}
