"""Hostile programs in the sandbox: each is contained within a bounded time and leaves the machine healthy."""

import os
import time
from pathlib import Path

import pytest

from lightning_grpo.rewards.sandbox import Sandbox, SandboxResult, network_namespace_prefix

TIMEOUT = 1.0
SLACK = 1.5  # start-up, kill and reap on a loaded 2-core machine
PASSING = ["assert True"]


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(timeout_seconds=TIMEOUT, memory_mb=256, file_size_mb=1, max_output_bytes=1000)


def sandbox_processes():
    """PIDs of live sandbox children anywhere on the machine (their command line names the bootstrap)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"_sandbox_boot.py" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue  # exited while we looked
    return pids


def zombie_children():
    ours = str(os.getpid())
    zombies = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and fields[1] == ours:
            zombies.append(stat.parent.name)
    return zombies


def run(sandbox, code, tests=PASSING):
    start = time.monotonic()
    result = sandbox.run(code, tests)
    elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT + SLACK, f"took {elapsed:.1f} s: {result}"
    assert sandbox_processes() == [] and zombie_children() == []
    return result


def test_passing_and_failing_asserts_are_counted(sandbox):
    result = run(sandbox, "def add(a, b):\n    return a + b", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"])
    assert (result.passed, result.total, result.timed_out, result.score) == (1, 2, False, 0.5)
    assert result.error.startswith("AssertionError")


def test_stdin_stdout_tests(sandbox):
    code = "a, b = map(int, input().split())\nprint(a + b)"
    tests = [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2", "output": "5"}, {"input": "x", "output": ""}]
    result = run(sandbox, code, tests)
    assert (result.passed, result.total) == (1, 3) and "ValueError" in result.error


def test_main_guard_waiting_on_input_does_not_break_assert_tests(sandbox):
    code = "def f():\n    return 1\nif __name__ == '__main__':\n    input()"
    assert run(sandbox, code, ["assert f() == 1"]).score == 1.0


def test_infinite_loop_is_killed_at_the_deadline(sandbox):
    result = run(sandbox, "while True:\n    pass")
    assert result.timed_out and result.score == 0.0 and "timed out" in result.error


def test_sleeping_program_is_killed_at_the_wall_clock_deadline(sandbox):
    # Uses no CPU, so only the wall-clock kill can stop it.
    result = run(sandbox, "import time\ntime.sleep(60)")
    assert result.timed_out and result.score == 0.0


def test_cpu_limit_kills_a_busy_program_before_a_long_deadline():
    sandbox = Sandbox(timeout_seconds=20, cpu_seconds=1)
    start = time.monotonic()
    result = sandbox.run("while True:\n    pass", PASSING)
    assert time.monotonic() - start < 2 + SLACK  # RLIMIT_CPU: SIGXCPU at 1 s, SIGKILL at 2 s
    assert not result.timed_out and result.score == 0.0 and "killed by SIG" in result.error


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import os\nos.system('sleep 30 &')",
        "import subprocess\nsubprocess.Popen(['sleep', '30'])",
        "import multiprocessing as mp\nmp.Process(target=print).start()",
        "import pty\npty.spawn('/bin/sh')",
        "import os\nos.posix_spawn('/bin/sleep', ['sleep', '30'], {})",
        "import os\nos.execv('/bin/sleep', ['sleep', '30'])",
        "import threading\nthreading.Thread(target=print).start()",
        "import sys\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess",
        "import ctypes\nctypes.CDLL(None).fork()",
        "import os\nos.kill(os.getppid(), 0)",  # signal 0 only probes: harmless to the test run if not blocked
    ],
)
def test_process_creation_and_signals_are_blocked(sandbox, code):
    before = len(list(Path("/proc").glob("[0-9]*")))
    result = run(sandbox, code)
    assert result.score == 0.0 and not result.timed_out
    assert "blocked" in result.error, result.error
    assert len(list(Path("/proc").glob("[0-9]*"))) < before + 10  # nothing multiplied


def test_memory_bomb_fails_within_its_limit_and_is_gone(sandbox):
    result = run(sandbox, "hoard = []\nwhile True:\n    hoard.append(bytearray(10**7))")  # run() checks it is gone
    assert result.score == 0.0 and "MemoryError" in result.error
    # How far a program gets: the interpreter takes ~30 MB of the 256 MB address space, the rest is the hoard's.
    counted = "hoard = []\ntry:\n    while True:\n        hoard.append(bytearray(10**7))\nexcept MemoryError:\n"
    grabbed_mb = int(run(sandbox, counted + "    print(len(hoard) * 10)").stdout)
    assert 100 < grabbed_mb < 256


def test_big_allocation_at_once_fails(sandbox):
    assert "MemoryError" in run(sandbox, "x = bytearray(2 * 1024**3)").error


def test_writing_outside_the_working_directory_is_blocked(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    for code in [
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
        f"import os\nos.chdir('/')\nopen({str(target)[1:]!r}, 'a')",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w')",
        f"import os\nos.remove({str(tmp_path / 'keep.txt')!r})",
    ]:
        (tmp_path / "keep.txt").write_text("keep")
        result = run(sandbox, code)
        assert "blocked" in result.error, (code, result.error)
        assert not target.exists() and (tmp_path / "keep.txt").exists()


def test_working_directory_is_writable_and_deleted_afterwards(sandbox):
    code = "import os\nopen('notes.txt', 'w').write('ok')\nprint(os.getcwd())\nassert open('notes.txt').read() == 'ok'"
    result = run(sandbox, code)
    assert result.score == 1.0
    workdir = Path(result.stdout.strip())
    assert workdir.name.startswith("lightning_grpo_sandbox_") and not workdir.exists()


def test_file_size_limit(sandbox):
    result = run(sandbox, "open('big.bin', 'wb').write(b'x' * 2 * 1024**2)")  # limit is 1 MB
    assert result.score == 0.0 and "File too large" in result.error


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.socket().connect(('1.1.1.1', 80))",
        "import socket\nsocket.getaddrinfo('pypi.org', 443)",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)",
        "import _socket\n_socket.socket()",
    ],
)
def test_network_is_blocked(sandbox, code):
    result = run(sandbox, code)
    assert result.score == 0.0 and not result.timed_out
    assert "blocked" in result.error or "URLError" in result.error, result.error


def test_network_namespace_has_no_interface_but_loopback(sandbox):
    if not network_namespace_prefix():
        pytest.skip("`unshare --net` is not permitted here: the audit hook alone blocks sockets")
    code = "print([line.split(':')[0].strip() for line in open('/proc/net/dev').read().splitlines()[2:]])"
    assert run(sandbox, code).stdout.strip() == "['lo']"


def test_endless_output_is_capped_and_killed(sandbox):
    result = run(sandbox, "while True:\n    print('spam' * 1000)")
    assert result.timed_out and len(result.stdout) <= 1000 and result.stdout.endswith("spam\n")


def test_large_finite_output_is_truncated_but_tests_still_count(sandbox):
    result = run(sandbox, "print('x' * 10**7)\nprint('end')")
    assert result.score == 1.0 and len(result.stdout) == 1000 and result.stdout.endswith("x\nend\n")


def test_a_printed_fake_result_is_not_believed(sandbox):
    fake = 'print("\\n" + "0" * 32 + \' {"passed": 9, "total": 9, "error": null}\')'
    assert run(sandbox, fake, ["assert False"]).score == 0.0


def test_exiting_early_scores_zero(sandbox):
    for code in ["import os\nos._exit(0)", "import sys\nsys.exit(0)", "raise SystemExit(3)", "def f(:"]:
        assert run(sandbox, code, ["assert f() == 1"]).score == 0.0


def test_programs_run_in_parallel_and_keep_order():
    sandbox = Sandbox(timeout_seconds=5, max_workers=4)
    codes = [f"import time\ntime.sleep(0.5)\nx = {i}" for i in range(4)]
    start = time.monotonic()
    results = sandbox.run_many(codes, [[f"assert x == {i}"] for i in range(4)])
    assert time.monotonic() - start < 1.8  # 4 x 0.5 s would take 2 s one at a time
    assert [r.score for r in results] == [1.0] * 4
    assert sandbox.run_many([], []) == []


def test_result_score_and_settings():
    assert SandboxResult(passed=2, total=4).score == 0.5
    assert SandboxResult(passed=2, total=2, timed_out=True).score == 0.0
    assert SandboxResult().score == 0.0
    with pytest.raises(ValueError, match="timeout_seconds must be > 0, got 0"):
        Sandbox(timeout_seconds=0)
    with pytest.raises(ValueError, match="max_workers must be >= 1"):
        Sandbox(max_workers=0)
    with pytest.raises(ValueError, match="got 2 programs but 1 test lists"):
        Sandbox().run_many(["a", "b"], [[]])
