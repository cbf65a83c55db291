"""Settings checks shared by every settings section: a list of (ok, message) -> one error naming them all."""

from __future__ import annotations

from collections.abc import Iterable


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
