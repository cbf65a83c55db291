"""Completions + the ``test_cases`` column -> the fraction of tests their Python code passes, run in the sandbox.

A completion's code is its last ```` ```python ```` block, else the whole text. Test formats accepted per row:
a list of assert statements (MBPP, HumanEval-style), a list of ``{"input": stdin, "output": stdout}`` dicts
(open-r1, Codeforces-style), APPS' ``{"inputs": [...], "outputs": [...]}``, or any of these as a JSON string.
The sandbox returns what each program printed or returned, test code running apart from the program; the verdict is
made here (``code_tests.py``).
"""

from __future__ import annotations

from typing import Any

from lightning_grpo.rewards.code_tests import Test, parse_tests, passes
from lightning_grpo.rewards.text import completion_text, extract_code
from lightning_grpo.sandbox.runner import Sandbox, SandboxResult

__all__ = ["CodeExecutionReward", "code_execution_reward", "parse_tests"]


def score(tests: list[Test], result: SandboxResult) -> float:
    """Fraction of tests whose every check passes, clamped to [0, 1]; outputs are in the order of the checks."""
    outputs = iter(result.outputs)
    passed = sum(all([passes(check, next(outputs, None)) for check in test]) for test in tests)
    return min(1.0, max(0.0, passed / len(tests)))


class CodeExecutionReward:
    """Fraction of the row's tests the completion's code passes, in [0, 1]; 0.0 on timeout, crash or no code.

    Programs run in parallel in a ``Sandbox`` (see ``sandbox/runner.py`` for the isolation and limits), one per
    completion for all its tests. Rows whose ``test_cases`` is ``None`` or empty score ``None`` and a completion with
    no code (blank) scores 0.0, neither of them run; text without a code block runs as it is. ``metrics()`` returns
    the sandbox counters (``sandbox/programs``, ``sandbox/timeouts``, ``sandbox/killed``, ``sandbox/failures``)
    since its last call, and ``sandbox/cgroup`` (1.0 when a cgroup bounds each sandbox as a whole).

    Args:
        timeout_seconds: wall-clock limit per completion (all its tests, in one sandbox).
        memory_mb: address-space limit per process, and the memory of the whole sandbox where a cgroup is allowed.
        max_workers: programs run at once; default the number of CPUs.
        isolation: "auto" (kernel namespaces, else a loud fallback), "strict" (refuse to run without them),
            "process" (rlimits and an audit hook only).

    >>> reward = CodeExecutionReward(timeout_seconds=5)
    >>> solution = "```python\\ndef add(a, b):\\n    return a + b\\n```"
    >>> test = ["assert add(1, 2) == 3"]
    >>> reward([solution, "I can't", "", solution], test_cases=[test, test, test, None])
    [1.0, 0.0, 0.0, None]
    >>> reward.metrics()["sandbox/programs"]  # the blank completion and the row with no tests did not run
    2.0
    """

    __name__ = "code_execution_reward"
    is_slow = True  # scoring runs it on a thread, overlapping other reward functions
    reward_range = (0.0, 1.0)

    def __init__(
        self,
        timeout_seconds: float = 5.0,
        memory_mb: int = 512,
        max_workers: int | None = None,
        isolation: str = "auto",
    ) -> None:
        self.sandbox = Sandbox(
            timeout_seconds=timeout_seconds, memory_mb=memory_mb, max_workers=max_workers, isolation=isolation
        )

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """The sandbox counters (``sandbox/programs``, ``/timeouts``, ``/killed``, ``/failures``) since last reset."""
        return self.sandbox.metrics(reset=reset)

    def __call__(self, completions: list[Any], test_cases: list[Any], **kwargs: Any) -> list[float | None]:
        tests = [parse_tests(t) for t in test_cases]
        codes = [extract_code(completion_text(c)) for c in completions]
        if len(codes) != len(tests):
            raise ValueError(f"got {len(codes)} completions but {len(tests)} test_cases: give one per completion")
        runnable = [i for i, (code, t) in enumerate(zip(codes, tests)) if t is not None and code.strip()]
        cases = [[check.case for test in tests[i] for check in test] for i in runnable]
        results = self.sandbox.run_many([codes[i] for i in runnable], cases)
        scores: list[float | None] = [None if t is None else 0.0 for t in tests]
        for i, result in zip(runnable, results):
            scores[i] = score(tests[i], result)  # clamped to reward_range; scoring checks every declared range
        return scores


code_execution_reward = CodeExecutionReward()
