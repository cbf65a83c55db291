"""Settings checks shared by every settings section and data file: a list of (ok, message) -> one error naming
every problem at once, before any compute; a long list of problems shortened to its first ten."""

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
