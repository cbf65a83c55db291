"""A callable and a number of seconds -> its result, or ``DeadlineExceeded``. Knows threads and signals; nothing
about rewards or tools, which both use it (reward functions and tool calls are user code that may hang).

On the main thread (the trainer's) the call runs right there and a watchdog interrupts it with a signal, so a
function's own ``signal.alarm`` timeouts (math-verify's) keep working; elsewhere no signal can reach the call, so it
runs on a daemon thread and an overdue call is abandoned there (Python cannot kill a thread: code that may truly
hang belongs in the sandbox).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Not SIGALRM: math-verify's own timeouts use signal.alarm, which would cancel ours or be cancelled by it.
TIMEOUT_SIGNAL = getattr(signal, "SIGRTMIN", signal.SIGUSR2)


class DeadlineExceeded(TimeoutError):
    """``name`` took longer than ``timeout`` seconds."""

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(f"{name} took longer than {timeout}s")
        self.name, self.timeout = name, timeout


class _Overdue(BaseException):
    """Raised inside an overdue call; a BaseException so the function's own ``except Exception`` (math-verify's
    ``parse`` has one) does not swallow it."""


@contextmanager
def _main_thread_deadline(name: str, timeout: float) -> Iterator[None]:
    """Raise ``DeadlineExceeded`` in the main thread's ``with`` body after ``timeout`` seconds: a watchdog thread
    sends ``TIMEOUT_SIGNAL`` to the main thread, which interrupts a sleep or a blocking call, and the handler
    raises once Python code runs again (a call stuck inside C code is stopped when it returns)."""
    state = {"armed": True, "fired": False}
    done = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if state["armed"]:
            state["armed"], state["fired"] = False, True
            raise _Overdue

    def watchdog() -> None:
        if not done.wait(timeout):
            signal.pthread_kill(threading.main_thread().ident, TIMEOUT_SIGNAL)

    previous = signal.signal(TIMEOUT_SIGNAL, on_signal)
    guard = threading.Thread(target=watchdog, name=f"deadline-{name}", daemon=True)
    guard.start()
    try:
        yield
    except _Overdue:
        pass
    finally:
        state["armed"] = False  # a signal from now on is late: the call has returned
        done.set()
        guard.join()
        signal.signal(TIMEOUT_SIGNAL, previous)
    if state["fired"]:  # also when the function caught _Overdue itself and returned
        raise DeadlineExceeded(name, timeout)


def run_on_thread(fn: Callable[[], Any], timeout: float | None, name: str) -> Any:
    """``fn()`` on a daemon thread, abandoned after ``timeout`` seconds (``DeadlineExceeded``); its exception, if
    any, is raised here."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = err

    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise DeadlineExceeded(name, timeout)
    if "error" in box:
        raise box["error"]
    return box["value"]


def call_with_deadline(fn: Callable[[], Any], timeout: float | None, name: str) -> Any:
    """``fn()``, stopped after ``timeout`` seconds (``None``: no limit) with ``DeadlineExceeded``: by a signal on
    the main thread, elsewhere by abandoning a daemon thread (``run_on_thread``)."""
    if timeout is None:
        return fn()
    if threading.current_thread() is not threading.main_thread():
        return run_on_thread(fn, timeout, name)
    box: dict[str, Any] = {}
    with _main_thread_deadline(name, timeout):
        box["value"] = fn()
    return box["value"]
