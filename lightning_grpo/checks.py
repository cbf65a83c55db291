"""Settings checks shared by every settings section: a list of (ok, message) -> one error naming them all; and
each section's help, written once under its fields, where ``--help`` finds it (``field_help``)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterable
from typing import TypeVar

Section = TypeVar("Section", bound=type)


def failed(checks: Iterable[tuple[bool, str]]) -> list[str]:
    """The messages of the checks that failed.

    >>> failed([(1 > 0, "fine"), (0 > 1, "x must be > 1, got 0")])
    ['x must be > 1, got 0']
    """
    return [message for ok, message in checks if not ok]


def raise_problems(section: str, checks: Iterable[tuple[bool, str]]) -> None:
    """One ``ValueError`` listing every failed check of ``section``, before any compute is spent."""
    problems = failed(checks)
    if problems:
        raise ValueError(f"invalid {section} settings:\n  - " + "\n  - ".join(problems))


PROBLEMS_SHOWN = 10  # a file with thousands of bad rows: the first ten, then how many more


def listing(problems: list[str], shown: int = PROBLEMS_SHOWN) -> str:
    """``problems`` one a line, at most ``shown`` of them, then how many more.

    >>> print(listing(["line 2: a", "line 5: b", "line 9: c"], shown=2))
      - line 2: a
      - line 5: b
      - ... and 1 more
    """
    more = [f"... and {len(problems) - shown} more"] if len(problems) > shown else []
    return "\n".join(f"  - {p}" for p in [*problems[:shown], *more])


def field_help(cls: Section) -> Section:
    """``cls`` with the docstring under each of its fields also in its own docstring, as Google style's
    ``Attributes:``, where jsonargparse reads a section's ``--help``. (Its ``attribute_docstrings`` setting would
    read them itself, but it parses the source of every class the CLI shows: the CLI took 3x as long to start.)

    >>> from lightning_grpo.optim import OptimConfig
    >>> [line for line in OptimConfig.__doc__.splitlines() if "warmup_steps" in line]
    ['        warmup_steps: Optimiser steps of linear warm-up; > 0 overrides warmup_ratio.']
    """
    docs = attribute_docstrings(cls)
    if docs:
        fields = "\n".join(f"        {name}: {' '.join(doc.split())}" for name, doc in docs.items())
        cls.__doc__ = f"{cls.__doc__ or ''}\n\n    Attributes:\n{fields}\n"
    return cls


def attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name -> the string literal right under its annotated assignment in ``cls``'s body; none without the
    source (an install of compiled files only: ``--help`` then lacks the text, nothing else changes)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    body = ast.parse(textwrap.dedent(source)).body[0].body
    return {
        field.target.id: inspect.cleandoc(doc.value.value)
        for field, doc in zip(body, body[1:])
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and _is_string(doc)
    }


def _is_string(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
