"""Where embedded demos and converted models are written (``LIGHTNING_GRPO_HOME``), and the one way anything is
written there: once, atomically, one process at a time (``write_once``). Knows folders; nothing about models."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


def cache_home() -> Path:
    """Where the embedded demos are written: ``LIGHTNING_GRPO_HOME``, by default ``~/.cache/lightning_grpo``."""
    return Path(os.environ.get("LIGHTNING_GRPO_HOME", Path.home() / ".cache" / "lightning_grpo"))


def unwritable_home(what: str, err: OSError) -> str:
    """Why ``what`` (``the embedded 'lightning-grpo/tiny-qwen2'``) cannot be written, naming the variable that chose
    the place and how to choose another."""
    chosen = "LIGHTNING_GRPO_HOME" if "LIGHTNING_GRPO_HOME" in os.environ else "the default (LIGHTNING_GRPO_HOME unset)"
    return (
        f"{what} cannot be written under {cache_home()}, chosen by {chosen} ({err.strerror}: "
        f"{err.filename}): set LIGHTNING_GRPO_HOME to a writable directory, e.g. "
        "`export LIGHTNING_GRPO_HOME=/tmp/lightning_grpo`"
    )


def write_once(target: Path, write: Callable[[Path], None], what: str) -> Path:
    """``target``, written by ``write(folder)`` if it does not exist yet: into a scratch folder beside it, then
    renamed into place, so that a crash never leaves a half-written ``target``; under a lock file, so that processes
    starting together (a run's ranks) wait for the first one's rather than each writing its own. ``what`` names it
    in the error of an unwritable home."""
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.parent / f".{target.name}.lock", "w")  # held across the write
    except OSError as err:
        raise OSError(unwritable_home(what, err)) from err
    with lock:
        _hold(lock)
        if not target.exists():
            scratch = Path(tempfile.mkdtemp(dir=target.parent))
            try:
                write(scratch / "out")
                (scratch / "out").rename(target)
            except OSError:
                if not target.exists():  # else another process finished first (no lock on this file system)
                    raise
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return target


def _hold(lock: TextIO) -> None:
    """An exclusive lock on the open file ``lock`` until it is closed; none where the platform has no ``flock``
    (then the rename alone keeps one writer's folder)."""
    try:
        import fcntl
    except ImportError:
        return
    fcntl.flock(lock, fcntl.LOCK_EX)
