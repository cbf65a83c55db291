"""A Python interpreter tool: the model's code -> what it printed, run in the kernel sandbox (``sandbox/runner.py``).

``tools: [lightning_grpo.sandbox.python_tool.python]`` gives the model ``python(code)`` with the default limits;
``python_tool(timeout_seconds=..., memory_mb=...)`` builds one with others. The program runs with no network, no
files of the host, no environment and a wall-clock deadline; the tool returns its stdout and stderr (the last
``max_chars``) and, when it failed, the error, as the text of the ``tool`` message. Knows the sandbox; nothing
about models.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from lightning_grpo.sandbox.runner import Case, Sandbox, SandboxResult

EMPTY = "(no output)"


def reply(result: SandboxResult, max_chars: int) -> str:
    """The tool's reply: the last ``max_chars`` of the program's output, then its error (never cut).

    >>> reply(SandboxResult([None], ["ZeroDivisionError: division by zero"], log="a\\n",
    ...                     error="ZeroDivisionError: division by zero"), 100)
    'a\\nZeroDivisionError: division by zero'
    """
    return (result.log[-max_chars:] + (result.error or "")) or EMPTY


def python_tool(max_chars: int = 2000, **sandbox: Any) -> Callable[[str], str]:
    """A ``python(code)`` tool on its own ``Sandbox(**sandbox)`` (``timeout_seconds``, ``memory_mb`` ...).

    Args:
        max_chars: the reply keeps the last this many characters of the output.
        sandbox: ``Sandbox`` settings; checked here, before any compute.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    box = Sandbox(**sandbox)

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: the program; print() what you want to see. No network, no files, a few seconds.
        """
        return reply(box.run(code, [Case("script", "")]), max_chars)  # the code runs, then an empty script

    return python


@cache
def _default() -> Callable[[str], str]:
    return python_tool(timeout_seconds=5.0, memory_mb=512, max_workers=1)


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it printed.

    Args:
        code: the program; print() what you want to see. No network, no files, a few seconds.
    """
    return _default()(code)
