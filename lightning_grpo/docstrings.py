"""A settings section's field docstrings -> its ``Attributes:`` help, where ``--help`` reads it: each option's help
written once, under its field (STYLE 15). Knows ``ast`` and ``inspect``; nothing of what the settings mean."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import TypeVar

Section = TypeVar("Section", bound=type)


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
