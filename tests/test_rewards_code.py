import json
import time

import pytest

from lightning_grpo.rewards.code_execution import CodeExecutionReward, code_execution_reward, parse_tests

ADD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds."
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]


def chat(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def reward():
    return CodeExecutionReward(timeout_seconds=1.0, max_workers=2)


def test_fraction_of_tests_passed(reward):
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    scores = reward([ADD, chat(ADD), wrong, "def add(a, b): return a + b"], test_cases=[ADD_TESTS] * 4)
    assert scores == [1.0, 1.0, 0.5, 1.0]  # a - b passes add(0, 0) == 0 only; no fence: the whole text


def test_stdin_stdout_tests_in_open_r1_and_apps_formats(reward):
    program = "```python\nn = int(input())\nprint(n * 2)\n```"
    open_r1 = [{"input": "2\n", "output": "4\n"}, {"input": "5", "output": "11"}]
    apps = json.dumps({"inputs": ["1\n", "3\n"], "outputs": ["2\n", "6\n"]})
    assert reward([program, program], test_cases=[open_r1, apps]) == [0.5, 1.0]


def test_no_code_no_tests_and_malformed_completions(reward):
    completions = ["", chat(None), [], None, ADD, ADD]
    scores = reward(completions, test_cases=[ADD_TESTS] * 4 + [None, []], prompts=["p"] * 6, unknown=[0] * 6)
    assert scores == [0.0, 0.0, 0.0, 0.0, None, None]


def test_timeouts_and_crashes_score_zero_without_raising(reward):
    completions = ["while True:\n    pass", "import os\nos.fork()", "raise RuntimeError('boom')", ADD]
    start = time.monotonic()
    scores = reward(completions, test_cases=[ADD_TESTS] * 4)
    assert scores == [0.0, 0.0, 0.0, 1.0]
    assert time.monotonic() - start < 1.0 + 2.0


@pytest.mark.parametrize(
    ("value", "tests"),
    [
        (["assert f()"], ["assert f()"]),
        ('["assert f()"]', ["assert f()"]),
        ("assert f()\nassert g()", ["assert f()\nassert g()"]),  # a non-JSON string is one script
        ({"input": "1", "output": "2"}, [{"input": "1", "output": "2"}]),
        ({"inputs": ["1"], "outputs": ["2"]}, [{"input": "1", "output": "2"}]),
        (None, None),
        ([], None),
        ("[]", None),
    ],
)
def test_parse_tests_formats(value, tests):
    assert parse_tests(value) == tests


@pytest.mark.parametrize("value", [[1, 2], [{"stdin": "1"}], 3.5])
def test_parse_tests_rejects_unknown_formats(value):
    with pytest.raises(ValueError, match="test_cases must be a list of assert strings"):
        parse_tests(value)


def test_one_test_list_per_completion_and_name():
    with pytest.raises(ValueError, match="got 2 completions but 1 test_cases"):
        code_execution_reward([ADD, ADD], test_cases=[ADD_TESTS])
    assert code_execution_reward.__name__ == "code_execution_reward" and code_execution_reward.is_slow
