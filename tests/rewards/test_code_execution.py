import json
import math
import time
from fractions import Fraction

import pytest

from lightning_grpo.rewards.code_execution import CodeExecutionReward, code_execution_reward, parse_tests, score
from lightning_grpo.rewards.convention import check_reward_range
from lightning_grpo.sandbox.runner import SandboxResult

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


def test_stdin_programs_that_end_with_status_0_pass(reward):
    """Issue 58: ``sys.exit(0)``, ``exit()`` and a flushed ``os._exit(0)`` after the right output pass; a
    non-zero status fails, as it would on a judge."""
    endings = ["import sys\nsys.exit(0)", "exit()", "import os, sys\nsys.stdout.flush()\nos._exit(0)", "quit(1)"]
    programs = [f"```python\nprint(int(input()) * 2)\n{ending}\n```" for ending in endings]
    assert reward(programs, test_cases=[[{"input": "2\n", "output": "4\n"}]] * 4) == [1.0, 1.0, 1.0, 0.0]


RESULTS = """
from collections import Counter, OrderedDict, defaultdict, namedtuple
from fractions import Fraction
import enum
Point = namedtuple("Point", "x y")
class Color(enum.IntEnum):
    RED = 1
class Cheat(dict):
    def __eq__(self, other):
        return True
def letters(s):
    return Counter(s)
def by_parity(xs):
    groups = defaultdict(list)
    for x in xs:
        groups[x % 2].append(x)
    return groups
def ordered():
    return OrderedDict(a=1)
def point():
    return Point(1, 2)
def red():
    return Color.RED
def forever():
    return float("inf")
def undefined():
    return float("nan")
def third():
    return Fraction(1, 3)
def mixed():
    return [Counter("ab"), Point(3, 4), -float("inf"), float("nan")]
def cheat():
    return Cheat()
"""
RESULT_TESTS = {  # test -> its score: Python's ==, with nan matching nan
    "assert letters('aab') == {'a': 2, 'b': 1}": 1.0,  # a Counter equals its dict
    "assert by_parity([1, 2, 3]) == {1: [1, 3], 0: [2]}": 1.0,  # a defaultdict too
    "assert ordered() == {'a': 1}": 1.0,
    "assert point() == (1, 2)": 1.0,  # a namedtuple equals its tuple
    "assert point().x == 1 and letters('aab').most_common(1) == [('a', 2)]": 1.0,  # and keeps its attributes
    "assert letters('aab')['a'] == 2 and sorted(letters('ba')) == ['a', 'b']": 1.0,
    "assert red() == 1": 1.0,  # an IntEnum equals its int
    "assert forever() == float('inf')": 1.0,
    "assert forever() == math.inf": 1.0,
    "assert forever() == 1e308": 0.0,
    "import math\nassert math.isinf(forever()) and math.isnan(undefined())": 1.0,
    "assert undefined() == float('nan')": 1.0,  # nan matches nan, as numpy.testing has it
    "assert undefined() == 0.0": 0.0,
    "assert third() == Fraction(1, 3)": 1.0,
    "from fractions import Fraction\nassert third() == Fraction(1, 3)": 1.0,
    "assert third() == 0.5": 0.0,  # exact, as Python compares a Fraction
    "assert mixed() == [{'a': 1, 'b': 1}, (3, 4), float('-inf'), float('nan')]": 1.0,
    "assert cheat() == {'a': 1}": 0.0,  # a dict subclass is compared as its dict: its own __eq__ never runs
}


def test_results_compare_as_python_compares_them(reward):
    """Issue 58: a Counter, defaultdict or namedtuple result, inf, nan and a Fraction failed correct programs:
    their reprs are no literals, so they came back as opaque handles equal to nothing."""
    tests = list(RESULT_TESTS)
    scores = reward([RESULTS] * len(tests), test_cases=[[t] for t in tests])
    assert dict(zip(tests, scores)) == RESULT_TESTS


ARGUMENTS = """
from collections import Counter
def apply(f, xs):
    return [f(x) for x in xs]
def total(numbers):
    return sum(numbers)
def sort_by(xs, key):
    return sorted(xs, key=key)
def half(q):
    return q / 2
def letters(s):
    return Counter(s)
def merged(a, b):
    return a + b
"""
ARGUMENT_TESTS = [  # each passes under python; none could be sent before (marshal takes literals only)
    "assert apply(lambda x: x * 2, [1, 2]) == [2, 4]",
    "assert total(range(5)) == 10",
    "assert sort_by(['bb', 'a', 'ccc'], key=lambda s: -len(s)) == ['ccc', 'bb', 'a']",
    "from fractions import Fraction\nassert half(Fraction(1, 3)) == Fraction(1, 6)",
    "k = 3\nimport math\nassert apply(lambda x: math.sqrt(x) + k, [4]) == [5.0]",  # its globals cross too
    "def check(candidate):\n    assert candidate(lambda x: x * x, [3]) == [9]\ncheck(apply)",  # HumanEval's
    "def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\nassert apply(fact, [5]) == [120]",
    "def times(m):\n    return lambda x: x * m\nassert apply(times(3), [2]) == [6]",  # a closure
    "assert merged(letters('ab'), letters('a')) == {'a': 2, 'b': 1}",  # the program's Counters go back as such
]


def test_arguments_that_pickle_and_the_test_s_functions_reach_the_program(reward):
    """Issue 58: a lambda or ``range`` argument could not be sent to the function under test."""
    scores = reward([ARGUMENTS] * len(ARGUMENT_TESTS), test_cases=[[t] for t in ARGUMENT_TESTS])
    assert dict(zip(ARGUMENT_TESTS, scores)) == dict.fromkeys(ARGUMENT_TESTS, 1.0)


EXCEPTIONS = """
class InvalidInput(ValueError):
    pass
class Missing(KeyError, TypeError):
    pass
def check(x):
    if x < 0:
        raise InvalidInput(f"negative: {x}")
    return x
def missing():
    raise Missing("m")
def impostor():
    class ValueError(Exception):  # not the built-in, whatever its name
        pass
    raise ValueError("no")
"""
EXCEPTION_TESTS = {  # test -> its score under python
    "try:\n    check(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative: -1'\nelse:\n    assert False": 1.0,
    "try:\n    check(-1)\nexcept InvalidInput:\n    pass\nelse:\n    assert False": 1.0,  # the class by name
    "import unittest\nunittest.TestCase().assertRaises(ValueError, check, -1)": 1.0,
    "try:\n    missing()\nexcept TypeError:\n    pass": 1.0,  # every built-in base
    "try:\n    check(-1)\nexcept TypeError:\n    pass": 0.0,
    "try:\n    impostor()\nexcept ValueError:\n    pass\nexcept Exception:\n    assert False": 0.0,
}


def test_the_program_s_exceptions_are_caught_by_their_built_in_bases(reward):
    """Issue 58: an exception of the program's own class (``class InvalidInput(ValueError)``) reached the test as
    an error no ``except ValueError`` caught, and one merely named ``ValueError`` was caught as the built-in."""
    tests = list(EXCEPTION_TESTS)
    scores = reward([EXCEPTIONS] * len(tests), test_cases=[[t] for t in tests])
    assert dict(zip(tests, scores)) == EXCEPTION_TESTS


RIGHT_ADD, WRONG_ADD = "def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b"
PYTEST_STYLE = [  # (a KodCode/pytest-style test file, its score on a right add, on a wrong one), as under pytest
    ("from solution import add\ndef test_add():\n    assert add(1, 2) == 3", 1.0, 0.0),
    # every function is called: a - b passes the first, the second fails it
    (
        "import solution\ndef test_zero():\n    assert solution.add(0, 0) == 0\ndef test_add():\n"
        "    assert solution.add(1, 2) == 3",
        1.0,
        0.0,
    ),
    # an exception in one function fails the test, whatever the others do
    (
        "from solution import add\ndef test_add():\n    assert add(1, 2) == 3\ndef test_none():\n    add(None, 1)",
        0.0,
        0.0,
    ),
    # a typo'd name is no test function: pytest would not call it either, nor a helper
    (
        "from solution import add\ndef test_add():\n    assert add(1, 2) == 3\ndef tset_add():\n"
        "    assert add(1, 2) == 4\ndef helper():\n    return add(2, 2)\ndef test_helped():\n"
        "    assert helper() == 4",
        1.0,
        0.0,
    ),
    ("from solution import add\nassert add(1, 2) == 3\ndef test_more():\n    assert add(2, 2) == 4", 1.0, 0.0),
    (
        "from solution import add\nclass TestAdd:\n    def setup_method(self, method):\n        self.a = 1\n"
        "    def test_add(self):\n        assert add(self.a, 2) == 3",
        1.0,
        0.0,
    ),  # a pytest test class
    (
        "import unittest\nfrom solution import add\nclass AddTest(unittest.TestCase):\n    def test_add(self):\n"
        "        self.assertEqual(add(1, 2), 3)\nif __name__ == '__main__':\n    unittest.main()",
        1.0,
        0.0,
    ),
    ("from solution import add\ndef test_add(tmp_path):\n    assert add(1, 2) == 3", 0.0, 0.0),  # a fixture
    (
        "import pytest\nfrom solution import add\ndef test_add():\n    with pytest.raises(TypeError):\n"
        "        add(None, 1)",
        0.0,
        0.0,
    ),  # pytest is not in the sandbox (references/rewards.md says so)
    ("def test_sum(f):\n    assert f(1, 2) == 3\ntest_sum(add)", 1.0, 0.0),  # the test's own helper, called by it
]


def test_test_functions_of_a_pytest_style_file_are_called(reward):
    """Issue 58: ``from solution import add`` then ``def test_add(): assert ...`` ran as a script whose functions
    were never called, so a wrong ``add`` scored 1.0."""
    tests = [test for test, _, _ in PYTEST_STYLE]
    scores = reward([RIGHT_ADD, WRONG_ADD] * len(tests), test_cases=[[t] for t in tests for _ in range(2)])
    assert list(zip(tests, scores[::2], scores[1::2])) == PYTEST_STYLE


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


def kinds(tests):
    return [[(c.case.kind, c.case.source, c.compare, c.expected) for c in test] for test in tests]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["assert f(1) == 2"], [[("value", "f(1)", "eq", 2)]]),
        ('["assert f(1) == 2"]', [[("value", "f(1)", "eq", 2)]]),
        (["assert (1, 2) == f([1], k='x')"], [[("value", "f([1], k='x')", "eq", (1, 2))]]),
        (["assert sorted(m.f(1)) == [1]"], [[("value", "sorted(m.f(1))", "eq", [1])]]),
        (["assert f(1) is None"], [[("value", "f(1)", "is", None)]]),
        (["assert Solution().add(2, 7) == 9"], [[("value", "Solution().add(2, 7)", "eq", 9)]]),
        (["assert f(1)", "assert not f(2)"], [[("value", "f(1)", "truthy", None)], [("value", "f(2)", "falsy", None)]]),
        ("assert f()\nassert g()", [[("value", "f()", "truthy", None), ("value", "g()", "truthy", None)]]),
        ({"input": "1", "output": "2"}, [[("stdin", "1", "stdout", "2")]]),
        (  # HumanEval: a check(candidate) function of simple asserts, called on the entry point
            [
                'METADATA = {"a": 1}\ndef check(candidate):\n    """doc"""\n    assert candidate([1]) == 2\n'
                "    assert True\n    assert not candidate([])\ncheck(f)"
            ],
            [[("value", "f([1])", "eq", 2), ("value", "f([])", "falsy", None)]],
        ),
        ({"inputs": ["1"], "outputs": ["2"]}, [[("stdin", "1", "stdout", "2")]]),
        (["assert f() == [float('-inf'), math.inf]"], [[("value", "f()", "eq", [-math.inf, math.inf])]]),
        (["assert f() == Fraction(1, 3)"], [[("value", "f()", "eq", Fraction(1, 3))]]),  # built here, not taken
    ],
)
def test_parse_tests_formats(value, expected):
    assert kinds(parse_tests(value)) == expected


@pytest.mark.parametrize(
    "source",
    [
        "assert math.isclose(f(1), 2.5)",  # the comparison would run inside: isclose can be patched
        "assert (f(1) == 2) == True",
        "assert f(x) == 2",  # a non-literal argument
        "assert Solution(x).f(1) == 2",
        "assert f(1) == g(2)",
        "assert f(1) is 3",
        "x = 1\nassert f(x) == 2",
        "def check(candidate):\n    assert abs(candidate(1) - 2) < 1e-6\ncheck(f)",
        "def check(candidate):\n    assert candidate(1) == 2\n",  # check is never called
        "assert f(1) ==",
    ],
)
def test_other_test_code_runs_inside_as_a_script(source):
    assert kinds(parse_tests([source])) == [[("script", source, "ran", None)]]


@pytest.mark.parametrize(("value", "empty"), [(None, None), ([], None), ("[]", None)])
def test_no_tests(value, empty):
    assert parse_tests(value) is empty


@pytest.mark.parametrize("value", [[1, 2], [{"stdin": "1"}], 3.5])
def test_parse_tests_rejects_unknown_formats(value):
    with pytest.raises(ValueError, match="test_cases must be a list of assert strings"):
        parse_tests(value)


def test_one_test_list_per_completion_and_name():
    with pytest.raises(ValueError, match="got 2 completions but 1 test_cases"):
        code_execution_reward([ADD, ADD], test_cases=[ADD_TESTS])
    assert code_execution_reward.__name__ == "code_execution_reward" and code_execution_reward.is_slow
    assert code_execution_reward.reward_range == (0.0, 1.0)


def test_reward_outside_the_declared_range_names_the_function():
    with pytest.raises(ValueError, match="reward function 'code_execution_reward' returned -0.5 at index 1"):
        check_reward_range("code_execution_reward", [1.0, -0.5], (0.0, 1.0))
    check_reward_range("code_execution_reward", [0.0, None, 1.0], (0.0, 1.0))


def test_score_is_the_fraction_of_tests_with_every_check_passing():
    tests = parse_tests(["assert f(1) == 1\nassert f(2) == 2", "assert f(3) == 3"])
    result = SandboxResult(outputs=[b"1", b"3", b"3"])  # the first test's second check fails
    assert score(tests, result) == 0.5
    assert score(tests, SandboxResult(outputs=[])) == 0.0  # nothing finished


def test_metrics_count_timeouts(reward):
    reward.metrics()
    reward(["while True:\n    pass", ADD], test_cases=[ADD_TESTS] * 2)
    assert reward.metrics() == {
        "sandbox/programs": 2.0,
        "sandbox/timeouts": 1.0,
        "sandbox/killed": 0.0,
        "sandbox/failures": 0.0,
        "sandbox/cgroup": float(not reward.sandbox.isolation.lost),
    }
    assert reward.metrics()["sandbox/programs"] == 0.0  # reset by the previous call


def test_the_ready_made_reward_copies_and_pickles_as_a_config_s_value_is():
    """Issue 59: ``lightning_grpo.rewards.code_execution_reward`` by import path (YAML, command line) was refused
    with ``cannot pickle '_thread.lock' object``: jsonargparse deep-copies a value, and the sandbox held a lock."""
    import copy
    import pickle

    for clone in (copy.deepcopy(code_execution_reward), pickle.loads(pickle.dumps(code_execution_reward))):
        assert clone.sandbox is not code_execution_reward.sandbox and clone.sandbox.timeout_seconds == 5.0
        assert clone(completions=["print(int(input()) * 2)"], test_cases=[[{"input": "2\n", "output": "4\n"}]]) == [1.0]
