"""Checkpoint files on disk: written atomically, checked before a resume, found across a run's versions; the ones a
run writes itself in its directory (``last.ckpt``, ``numerical-abort.ckpt``); and what a checkpoint keeps of a run
beyond its weights (``save_run_state``). Knows Lightning's ``CheckpointIO`` plugin API, files and the ranks; nothing
of the GRPO math.

A checkpoint is written next to its final name (``.last.ckpt.tmp-<pid>`` in the same directory, hence the same
filesystem), flushed to the disk (``fsync``), then renamed over the final name, and the directory entry is flushed
too. A process killed mid-write, or a disk that fills up, leaves the previous checkpoint intact and at worst a
temporary file, never a truncated ``.ckpt`` under a final name; the next write into that directory (the resumed
run's first checkpoint) removes the temporary files of writers that are no longer running. (Lightning's own
``TorchCheckpointIO`` writes the final file in place: a kill leaves it truncated, and resume fails with
``PytorchStreamReader failed reading zip archive``.)

A resume checks the checkpoint first: ``torch.save`` writes a zip archive whose every member has a CRC, so a
truncated or corrupt file is found without unpickling it (``readable``). ``--ckpt_path last`` looks at every
version of the run (``<save_dir>/<name>/version_*/checkpoints``) and the newest readable checkpoint wins; each
unreadable one it passes is reported.
"""

from __future__ import annotations

import contextlib
import errno
import os
import zipfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from lightning_grpo.ranks import every_rank, own_state
from lightning_grpo.run import run_dir


def _fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename) to the disk; some filesystems cannot open a directory: skipped there."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _is_local(path: str | Path) -> bool:
    return type(get_filesystem(str(path))).__name__ == "LocalFileSystem"


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that writes into a temporary file beside the target, fsyncs and renames it, so a
    checkpoint under its final name is always complete. Remote paths (``s3://`` ...) are written as Lightning
    writes them (object stores replace an object whole)."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_partials(target.parent)
        partial = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, target)
        except BaseException as err:
            partial.unlink(missing_ok=True)  # a full disk leaves no partial file behind either
            if not isinstance(err, Exception):
                raise
            raise OSError(_failed_write(target, err)) from err
        _fsync_dir(target.parent)


def remove_dead_partials(directory: Path) -> list[Path]:
    """Remove the temporary files (``.<name>.tmp-<pid>``) that writers killed mid-write left in ``directory``: those
    of a process that no longer runs. One process writes a run's checkpoints (global rank 0), so another pid still
    running is another run's writer and its file is kept. Returns the files removed."""
    removed = []
    for partial in directory.glob(".*.tmp-*"):
        pid = partial.name.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            partial.unlink(missing_ok=True)
            removed.append(partial)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: no signal sent, only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def _failed_write(target: Path, err: Exception) -> str:
    """Why a checkpoint could not be written, in words (torch reports a full disk as ``unexpected pos``, with the
    ``ENOSPC`` error as its context)."""
    chain = [err, err.__context__, err.__cause__]
    full = "no space left on the device; " if any(getattr(e, "errno", None) == errno.ENOSPC for e in chain) else ""
    return f"checkpoint {target} could not be written: {full}{type(err).__name__}: {err}. Earlier ones are intact"


def unreadable(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be resumed from (``None``: it can). A directory (a distributed
    checkpoint) and a remote path are taken as they are."""
    path = Path(path)
    if not _is_local(path) or path.is_dir():
        return None
    if not path.exists():
        return "it does not exist"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every member and checks its CRC
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"it is truncated or not a checkpoint ({err})"
    return None if bad is None else f"its member {bad!r} is corrupt"


def run_checkpoints(run_root: Path) -> list[Path]:
    """Every ``.ckpt`` of a run, newest first: in ``run_root/checkpoints`` and every ``run_root/*/checkpoints``
    (``version_0``, ``version_1`` ... of one logger name), so a resumed run finds what an earlier version wrote."""
    found = [*run_root.glob("checkpoints/*.ckpt"), *run_root.glob("*/checkpoints/*.ckpt")]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def last_readable(candidates: list[Path]) -> tuple[Path | None, list[str]]:
    """The first readable checkpoint of ``candidates`` and a line for each unreadable one passed on the way."""
    skipped = []
    for path in candidates:
        why = unreadable(path)
        if why is None:
            return path, skipped
        skipped.append(f"{path}: {why}")
    return None, skipped


def save_last_checkpoint(trainer: L.Trainer, dirpath: str | None = None) -> Path:
    """``checkpoints/last.ckpt`` in the run directory (or ``dirpath``); every rank must call it."""
    path = (Path(dirpath) if dirpath else run_dir(trainer) / "checkpoints") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


def numerical_abort(trainer: L.Trainer, message: str) -> FloatingPointError:
    """Save ``checkpoints/numerical-abort.ckpt`` in the run directory (every rank calls it) and return the error
    that stops training, naming the checkpoint."""
    path = run_dir(trainer) / "checkpoints" / "numerical-abort.ckpt"
    trainer.save_checkpoint(path)
    error = FloatingPointError(
        f"{message}; training stopped at global step {trainer.global_step} with a checkpoint at {path}. Try a lower "
        "learning_rate, max_grad_norm, or reward functions that return finite numbers"
    )
    error.checkpoint_path = str(path)  # FaultCheckpoint writes no second one; the CLI names it
    return error


def save_run_state(checkpoint: dict[str, Any], counters: Any, entropy: Any, engine: Any, groups: Any) -> None:
    """What a checkpoint keeps of a run beyond its weights and optimiser: the step counters, the adaptive entropy
    coefficient, and each rank's own rollouts sampled ahead (``engine``) and ``filter_groups``' groups waiting for
    an update (``groups``), gathered in one collective."""
    checkpoint["grpo_counters"] = counters.state_dict()
    checkpoint["entropy_controller"] = entropy.state_dict()
    engines, buffers = zip(*every_rank((engine.state_dict(), groups.state_dict())))  # one gather
    checkpoint["rollout_engine"] = {"ranks": list(engines)}  # rollouts sampled ahead
    checkpoint["group_buffer"] = {"ranks": list(buffers)}  # filter_groups' groups waiting for an update


def load_run_state(checkpoint: dict[str, Any], counters: Any, entropy: Any, engine: Any, groups: Any) -> None:
    """``save_run_state``'s parts back, this rank's own where each rank saved its own."""
    counters.load_state_dict(checkpoint.get("grpo_counters", {}))
    if state := own_state(checkpoint.get("rollout_engine", {}), "rollout engine's queue"):
        engine.load_state_dict(state)
    if state := own_state(checkpoint.get("group_buffer", {}), "filter_groups buffer"):
        groups.load_state_dict(state)
    if "entropy_controller" in checkpoint:
        entropy.load_state_dict(checkpoint["entropy_controller"])
