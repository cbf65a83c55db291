"""An exception that ends ``lightning-grpo fit`` -> one message: the cause, the checkpoint kept and the command
that resumes from it, where the full traceback is. ``LIGHTNING_GRPO_DEBUG=1`` prints the traceback instead.

``FaultCheckpoint`` (always on under the CLI) writes the checkpoint and ``error.log`` and names them on the
exception (``checkpoint_path``, ``error_log``); this module only words them.
"""

from __future__ import annotations

import os
import shlex
import sys
import traceback

DEBUG = "LIGHTNING_GRPO_DEBUG"

# What bounds a step's memory, largest lever first: the sequences a step holds, their length, what one forward holds.
MEMORY_SETTINGS = (
    "data.batch_size",
    "model.num_generations",
    "model.sampling.max_completion_length",
    "model.update.micro_batch_tokens (or micro_batch_size)",
    "model.policy.logprob_chunk_size",
)
# A thread that cannot get its stack under a memory limit (ulimit -v, a cgroup) fails before any MemoryError.
MEMORY_WORDS = ("can't start new thread", "out of memory", "cannot allocate memory")


def debugging() -> bool:
    return os.environ.get(DEBUG, "") not in ("", "0")


def print_refused_trace(exit: SystemExit) -> None:
    """Under ``LIGHTNING_GRPO_DEBUG=1``, the traceback of the error a one-line refusal words (``parser.error`` and
    ``raise SystemExit(...) from None`` inside an ``except``: the error is the exit's ``__context__``)."""
    error = exit.__context__
    if debugging() and isinstance(error, Exception):
        print(f"{DEBUG}=1: the traceback of the refused error:", file=sys.stderr)
        traceback.print_exception(error, file=sys.stderr)


def without_ckpt_path(argv: list[str]) -> list[str]:
    """``argv`` less any ``--ckpt_path X`` / ``--ckpt_path=X``.

    >>> without_ckpt_path(["fit", "--config", "a.yaml", "--ckpt_path", "x.ckpt", "--ckpt_path=y"])
    ['fit', '--config', 'a.yaml']
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            out.append(arg)
    return out


def cause(err: BaseException) -> str:
    """``Type: message`` and the exception's notes, the chained cause's when the message is empty."""
    text = str(err) or (str(err.__cause__) if err.__cause__ else "")
    notes = "".join(f"\n  {n}" for n in getattr(err, "__notes__", []))
    return f"{type(err).__name__}: {text}{notes}"


def chain(err: BaseException | None) -> list[BaseException]:
    """``err`` and every exception it was raised from or while handling, outermost first."""
    seen: list[BaseException] = []
    while err is not None and all(err is not s for s in seen):
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def out_of_memory(err: BaseException) -> BaseException | None:
    """The exception in ``err``'s chain that says the process ran out of memory (``MemoryError``, torch's
    ``OutOfMemoryError``, ``can't start new thread``, ``CUDA out of memory``), or None."""
    for e in chain(err):
        if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
            return e
        if isinstance(e, (RuntimeError, OSError)) and any(w in str(e).lower() for w in MEMORY_WORDS):
            return e
    return None


def memory_line(err: BaseException) -> str | None:
    """``out of memory (...): lower ...`` naming the settings that bound a step's memory, when ``err`` is one."""
    oom = out_of_memory(err)
    if oom is None:
        return None
    return (
        f"This is out of memory ({type(oom).__name__}: {str(oom).splitlines()[0] if str(oom) else 'no message'}). "
        f"A step's memory is bounded by {', '.join(MEMORY_SETTINGS)}: lower one (the first ones most), set "
        "model.policy.gradient_checkpointing: true, or give the process more memory"
    )


def failure_message(err: BaseException, argv: list[str]) -> str:
    """What the user reads when ``fit`` fails: the cause (out of memory said so, with the settings that bound it),
    then how to resume and where the trace is."""
    lines = [f"lightning-grpo: error: {cause(err)}"]
    memory = memory_line(err)
    if memory:
        lines.append(memory)
    checkpoint = getattr(err, "checkpoint_path", None)
    if checkpoint:
        command = shlex.join(["lightning-grpo", *without_ckpt_path(argv), "--ckpt_path", str(checkpoint)])
        lines.append(f"Training so far is saved in {checkpoint}; after fixing the cause, resume with:\n  {command}")
    log = getattr(err, "error_log", None)
    where = f"in {log}, or rerun" if log else "rerun"
    lines.append(f"Full traceback: {where} with {DEBUG}=1.")
    return "\n".join(lines)
