"""Completions + the ``test_cases`` column -> the fraction of tests their Python code passes, run in the sandbox.

A completion's code is its last ```` ```python ```` block, else the whole text. Test formats accepted per row:
a list of assert statements (MBPP, HumanEval-style), a list of ``{"input": stdin, "output": stdout}`` dicts
(open-r1, Codeforces-style), APPS' ``{"inputs": [...], "outputs": [...]}``, or any of these as a JSON string.
"""

from __future__ import annotations

import json
from typing import Any

from lightning_grpo.rewards.sandbox import Sandbox
from lightning_grpo.rewards.text import completion_text, extract_code

TEST_FORMATS = "a list of assert strings, a list of {'input', 'output'} dicts, {'inputs': [...], 'outputs': [...]}"


def parse_tests(value: Any) -> list[Any] | None:
    """One row's tests as a list of assert strings and ``{"input", "output"}`` dicts; None when there are none.

    >>> parse_tests('{"inputs": ["1\\\\n"], "outputs": ["2\\\\n"]}')
    [{'input': '1\\n', 'output': '2\\n'}]
    >>> parse_tests(["assert f(1) == 2"]), parse_tests([]), parse_tests(None)
    (['assert f(1) == 2'], None, None)
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return [value]  # a script of asserts, all-or-nothing
    if isinstance(value, dict) and "inputs" in value:
        value = [{"input": i, "output": o} for i, o in zip(value["inputs"], value.get("outputs", []), strict=True)]
    elif isinstance(value, dict):
        value = [value]
    if value is None or (isinstance(value, list) and not value):
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) or _is_io_test(t) for t in value):
        raise ValueError(f"test_cases must be {TEST_FORMATS} (or such a JSON string), got {value!r:.200}")
    return value


def _is_io_test(test: Any) -> bool:
    return isinstance(test, dict) and "input" in test and "output" in test


class CodeExecutionReward:
    """Fraction of the row's tests the completion's code passes; 0.0 on timeout, crash or no code.

    Programs run in parallel in a ``Sandbox`` (see ``sandbox.py`` for the limits). Rows whose
    ``test_cases`` is ``None`` or empty score ``None``.

    Args:
        timeout_seconds: wall-clock limit per completion (its tests run in one process).
        memory_mb: address-space limit per program.
        max_workers: programs run at once; default the number of CPUs.

    >>> reward = CodeExecutionReward(timeout_seconds=2)
    >>> solution = "```python\\ndef add(a, b):\\n    return a + b\\n```"
    >>> reward([solution, "I can't", solution], test_cases=[["assert add(1, 2) == 3"], ["assert add(1, 2) == 3"], None])
    [1.0, 0.0, None]
    """

    __name__ = "code_execution_reward"
    is_slow = True  # scoring runs it on a thread, overlapping other reward functions

    def __init__(self, timeout_seconds: float = 5.0, memory_mb: int = 512, max_workers: int | None = None) -> None:
        self.sandbox = Sandbox(timeout_seconds=timeout_seconds, memory_mb=memory_mb, max_workers=max_workers)

    def __call__(self, completions: list[Any], test_cases: list[Any], **kwargs: Any) -> list[float | None]:
        tests = [parse_tests(t) for t in test_cases]
        codes = [extract_code(completion_text(c)) for c in completions]
        if len(codes) != len(tests):
            raise ValueError(f"got {len(codes)} completions but {len(tests)} test_cases: give one per completion")
        runnable = [i for i, (code, t) in enumerate(zip(codes, tests)) if t is not None and code.strip()]
        results = self.sandbox.run_many([codes[i] for i in runnable], [tests[i] for i in runnable])
        scores: list[float | None] = [None if t is None else 0.0 for t in tests]
        for i, result in zip(runnable, results):
            scores[i] = result.score
        return scores


code_execution_reward = CodeExecutionReward()
