"""The sandbox's record stream -> a ``SandboxResult``; a value case's output -> its Python value. Knows the wire
format of ``inside/boot.py``; nothing about tests or verdicts.

Both parsers read untrusted bytes in the trainer's process, so both are bounded: frames are read from at most
the report cap the runner applies, and a value's text is refused past ``max_bytes`` before it is parsed, then
parsed by ``json`` in C (``ast.literal_eval`` of a ``repr`` costs seconds and hundreds of MB per MiB:
``benchmarks/bench_sandbox.py`` prints both).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from lightning_grpo.sandbox.inside.boot import SANDBOX_FAILED

VALUE_TAGS = {"t": tuple, "s": set, "f": frozenset, "d": dict, "b": bytes, "c": complex, "q": Fraction}
MAX_VALUE_BYTES = 2**16  # a value case's tagged JSON, at most (json parses the worst case in milliseconds)


@dataclass
class SandboxResult:
    """What one program produced, case by case; ``None`` where a case did not finish."""

    outputs: list[bytes | None]  # stdout (stdin case), tagged JSON of the value (value case), b"" (script ran)
    errors: list[str | None] = field(default_factory=list)  # per case: exception, exit, or None
    timed_out: bool = False  # killed at the wall-clock deadline
    killed: bool = False  # died of a signal (a resource limit or a crash), not the deadline
    log: str = ""  # the last LOG_BYTES of what the program wrote to stdout/stderr outside stdin cases
    error: str | None = None  # first failure: case error, timeout, signal or sandbox failure
    sandbox_failed: bool = False  # the sandbox itself failed, not the program: counted in ``sandbox/failures``


def decode_value(output: bytes, max_bytes: int = MAX_VALUE_BYTES) -> Any:
    """A value case's output -> the value (built-in types and ``Fraction``); ValueError if too long or malformed.

    >>> decode_value(b'{"t":[1,[2.5,null],{"d":[["a",{"s":[true]}]]},{"b":"x"},-Infinity,{"q":[1,3]}]}')
    (1, [2.5, None], {'a': {True}}, b'x', -inf, Fraction(1, 3))
    """
    if len(output) > max_bytes:
        raise ValueError(f"value text longer than {max_bytes} bytes: not parsed")
    try:
        return json.loads(output, object_hook=_tagged)
    except (ValueError, TypeError, RecursionError, MemoryError, ZeroDivisionError) as err:
        raise ValueError(f"not a tagged JSON value: {type(err).__name__}") from None


def _tagged(obj: dict) -> Any:
    if len(obj) != 1:
        raise ValueError("a tagged value has one key")
    ((tag, body),) = obj.items()
    if tag not in VALUE_TAGS:
        raise ValueError(f"unknown tag {tag!r}")
    if tag == "b":
        return body.encode("latin-1")
    if tag == "c":
        return complex(*body)
    if tag == "q":
        if not (type(body) is list and len(body) == 2 and all(type(x) is int for x in body)):
            raise TypeError("a fraction is two ints")
        return Fraction(*body)
    if tag == "d":
        return {_hashable(k): v for k, v in body}
    return VALUE_TAGS[tag](body)


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        raise TypeError("a list is not a dict key")
    return key


def records(report: bytes, token: str, n: int) -> tuple[list[bytes | None], list[str | None]]:
    """The first frame of each case index: ``\\n<token> <index> <output length or -1> <error length>\\n`` then the
    output and the error. A malformed frame ends the parse (the cases after it count as unfinished)."""
    outputs: list[bytes | None] = [None] * n
    errors: list[str | None] = [None] * n
    seen, header, at = set(), f"\n{token} ".encode(), 0
    while (at := report.find(header, at)) >= 0:
        end = report.find(b"\n", at + len(header))
        try:
            index, size, error_size = (int(x) for x in report[at + len(header) : end].split(b" "))
        except ValueError:
            break
        start = end + 1
        output = None if size < 0 else report[start : start + size]
        error = report[start + max(size, 0) : start + max(size, 0) + error_size].decode("utf-8", "replace")
        at = start + max(size, 0) + error_size
        if end < 0 or at > len(report) or not -1 <= index < n or error_size < 0:
            break
        if index not in seen:
            seen.add(index)
            if index >= 0:
                outputs[index], errors[index] = output, (error[:500] or None)
            elif error:
                errors.append(error[:500])  # no cases: the definition's error
    return outputs, errors


def result(
    report: bytes, log: bytes, token: str, n: int, timed_out: bool, returncode: int | None, timeout: float, oom: bool
) -> SandboxResult:
    """The records, the log and how the sandbox ended -> a ``SandboxResult`` whose ``error`` names the first cause:
    the deadline, a signal (``oom``: the memory cgroup's OOM killer), the sandbox's own failure (the first process
    exited with ``SANDBOX_FAILED``, its reason in the log), a case's error, or an early exit."""
    outputs, errors = records(report, token, n)
    killed = not timed_out and (oom or (returncode is not None and (returncode < 0 or returncode > 128)))
    result = SandboxResult(outputs[:n], errors[:n], timed_out, killed, log.decode("utf-8", errors="replace"))
    if timed_out:
        result.error = f"timed out after {timeout} s"
    elif oom:
        result.error = "killed: out of memory (the whole sandbox's memory_mb, a cgroup limit)"
    elif killed:
        signum = -returncode if returncode < 0 else returncode - 128
        result.error = f"killed by {_signal_name(signum)} (a resource limit or a crash)"
    elif returncode == SANDBOX_FAILED:
        result.sandbox_failed = True
        result.error = "sandbox failed: no program process could start (see the log): the cases left are unfinished"
    else:
        result.error = next((e for e in errors if e is not None), None)
        if result.error is None and (returncode != 0 or None in result.outputs):
            result.error = f"exited with status {returncode} before finishing every case"
    return result


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
