import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lightning_grpo.rewards.math_equivalence import MathVerifyReward, math_verify_reward

# sympy tries to expand both towers and does not come back (minutes at least).
HANGING_GOLD, HANGING_ANSWER = "$2^{2^{2^{2^{2}}}}$", r"\boxed{3^{3^{3^{3}}}}"


def chat(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def reward():
    reward = MathVerifyReward(timeout_seconds=1.0)
    yield reward
    reward._worker.stop()


def test_equivalent_forms_score_one(reward):
    completions = [
        r"so the answer is \boxed{\frac{2}{4}}",
        chat("<think>halve it</think>The answer is 0.5"),
        "<reasoning>expand</reasoning><answer>$(x+1)^2$</answer>",
        r"\boxed{\frac{1}{3}}",
        "I don't know",
        "",
        chat(None),
    ]
    answer = ["1/2", r"\frac{1}{2}", "$x^2 + 2x + 1$", "$0.5$", "3", "3", "3"]
    assert reward(completions, answer=answer) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_gold_none_or_unparseable_is_not_applicable(reward):
    assert reward(["1", "1"], answer=[None, "no math here"]) == [None, None]


def test_reads_solution_column_like_trl_and_ignores_other_columns(reward):
    scores = reward(
        completions=[chat(r"\boxed{4}")], solution=["$4$"], prompts=["2+2?"], completion_ids=[[1]], level=["easy"]
    )
    assert scores == [1.0]


def test_missing_gold_column_is_named(reward):
    with pytest.raises(ValueError, match="needs gold answers in an 'answer' or 'solution' column"):
        reward(["1"])


def test_hanging_comparison_times_out_scores_zero_and_worker_recovers(reward):
    reward(["1"], answer=["1"])  # worker started, so the timing below is the comparison only
    start = time.monotonic()
    scores = reward([HANGING_ANSWER, r"\boxed{2}"], answer=[HANGING_GOLD, "2"])
    elapsed = time.monotonic() - start
    assert scores == [0.0, 1.0]  # the next comparison ran on a fresh worker
    assert elapsed < 1.0 + 5.0  # the 1 s timeout, plus restarting the worker (~0.5 s) on a busy machine


def test_timeout_works_off_the_main_thread(reward):
    out = {}

    def score():
        out["scores"] = reward([HANGING_ANSWER, "7"], answer=[HANGING_GOLD, "7"])

    thread = threading.Thread(target=score)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive() and out["scores"] == [0.0, 1.0]


def test_concurrent_callers_get_their_own_answers(reward):
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda n: reward([str(n), str(n + 1)], answer=[str(n), str(n)]), range(8)))
    assert results == [[1.0, 0.0]] * 8


def test_name_settings_and_pickling():
    assert math_verify_reward.__name__ == "math_verify_reward" and math_verify_reward.is_slow
    copy = pickle.loads(pickle.dumps(MathVerifyReward(timeout_seconds=2.0)))
    assert copy.timeout_seconds == 2.0 and copy(["3"], answer=["3"]) == [1.0]
    copy._worker.stop()
    with pytest.raises(ValueError, match="timeout_seconds must be > 0, got 0"):
        MathVerifyReward(timeout_seconds=0)


# A trainer that handles run-ending signals (PreemptionCheckpoint does) and keeps scoring after them.
TRAINER = """
import json, signal, sys
from lightning_grpo.rewards.math_equivalence import MathVerifyReward
received = []
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(number, lambda signum, frame: received.append(signum))
reward = MathVerifyReward(timeout_seconds=30)
reward(["1"], answer=["1"])
print(reward._worker.proc.pid, flush=True)
sys.stdin.readline()
alive = reward._worker.proc.poll() is None
pid = reward._worker.proc.pid
print(json.dumps({"alive": alive, "scores": reward(["2"], answer=["2"]), "same": reward._worker.proc.pid == pid,
                  "received": sorted(received)}), flush=True)
sys.stdin.readline()
"""


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow  # the trainer process imports lightning_grpo (torch): ~5-30 s on 2 busy cores
def test_worker_survives_signals_to_the_process_group_and_dies_with_the_trainer():
    import json
    import os
    import signal
    import subprocess
    import sys

    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a scheduler's job or a terminal's foreground job
    )
    try:
        worker_pid = int(trainer.stdout.readline())
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            os.killpg(trainer.pid, number)  # what Ctrl+C, a closed terminal and schedulers do
        time.sleep(0.5)
        trainer.stdin.write("\n")
        trainer.stdin.flush()
        result = json.loads(trainer.stdout.readline())
        assert result["received"] == sorted([signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
        assert result["alive"] and result["same"] and result["scores"] == [1.0]  # no restart, no lost comparison
        trainer.kill()  # the trainer dies without running atexit: the orphaned worker must still go
        trainer.wait()
        deadline = time.monotonic() + 10.0
        while _running(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker_pid)
    finally:
        trainer.kill()
        trainer.wait()
