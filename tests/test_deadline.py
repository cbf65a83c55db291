"""deadline.py: a callable with a timeout, on the main thread (by a signal) and off it (an abandoned thread)."""

import threading
import time

import pytest

from lightning_grpo.deadline import DeadlineExceeded, call_with_deadline, run_on_thread


def test_a_sleep_on_the_main_thread_is_interrupted_at_the_deadline():
    start = time.perf_counter()
    with pytest.raises(DeadlineExceeded, match="nap took longer than 0.2s"):
        call_with_deadline(lambda: time.sleep(30), 0.2, "nap")
    assert time.perf_counter() - start < 5


def test_off_the_main_thread_the_call_is_abandoned_and_the_caller_goes_on():
    out = {}

    def caller():
        try:
            call_with_deadline(lambda: time.sleep(30), 0.2, "nap")
        except DeadlineExceeded as err:
            out["err"] = err

    worker = threading.Thread(target=caller)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and out["err"].timeout == 0.2


def test_results_and_errors_come_back_and_no_limit_means_none():
    assert call_with_deadline(lambda: 42, None, "quick") == 42
    assert call_with_deadline(lambda: 42, 5.0, "quick") == 42
    with pytest.raises(ZeroDivisionError):
        run_on_thread(lambda: 1 / 0, 5.0, "broken")
