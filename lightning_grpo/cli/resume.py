"""``--ckpt_path``: which checkpoint a run resumes from, and the run directory it continues. Knows the trainer's
loggers and checkpoint files; nothing about GRPO.

``--ckpt_path last`` is the newest readable checkpoint of the run, across its versions (``version_0``,
``version_1`` ... of the logger's name, and any ``ModelCheckpoint.dirpath``); each unreadable newer one is skipped
with a warning naming it and why. An explicit path that cannot be read is refused, naming the newest readable one.
Every form (``last``, a file, a distributed checkpoint's folder) is resolved by ``resume_path`` from the settings,
before the checkpoint's settings are merged, so each is merged, compared and refused the same way.
With the default logger (CSV or TensorBoard under ``default_root_dir``), the resumed run continues the
checkpoint's own ``version_N`` directory: one directory holds the run's metrics, alerts and summary.

Lightning's CLI replaces the ``model:`` settings with the checkpoint's. Here every setting whose value differs from
the checkpoint's is named, with the one that wins: a value the config file or the command line sets wins (at its
default value too), a setting left unset gives way to the checkpoint's. A change that makes the checkpoint's
state meaningless is refused:
``num_generations`` when the checkpoint holds groups waiting for an update (``filter_groups``) or rollouts sampled
ahead (``AsyncRollouts``), all of the old group size.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_grpo.checkpoints import last_readable, run_checkpoints, unreadable
from lightning_grpo.run import log_into, numbered_logger, version_number


def search_roots(trainer: dict[str, Any]) -> list[Path]:
    """Where ``--ckpt_path last`` looks, from the ``trainer:`` settings (no trainer exists yet): the run's root
    (``<save_dir>/<name>`` of each logger, above its versions; ``default_root_dir`` itself, where a run without a
    logger writes) and the ``dirpath`` of every ``ModelCheckpoint``."""
    root = Path(trainer.get("default_root_dir") or os.getcwd())
    roots = [root]
    logger = trainer.get("logger")
    for entry in logger if isinstance(logger, list) else [logger]:
        if entry in (None, True):  # Lightning's default logger: TensorBoard or CSV, name "lightning_logs"
            roots.append(root / "lightning_logs")
        elif isinstance(entry, dict):
            args = entry.get("init_args") or {}
            name = args.get("name", "lightning_logs")  # CSV's and TensorBoard's default name
            roots.append(Path(args.get("save_dir") or root) / (str(name) if name else ""))
    for callback in trainer.get("callbacks") or []:
        dirpath = (callback.get("init_args") or {}).get("dirpath") if isinstance(callback, dict) else None
        if dirpath:
            roots.append(Path(dirpath).parent)
    return list(dict.fromkeys(roots))


def candidates(roots: list[Path]) -> list[Path]:
    found = {p for root in roots if root.is_dir() for p in run_checkpoints(root)}
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def resume_path(ckpt_path: str | Path | None, trainer: dict[str, Any]) -> str | None:
    """The checkpoint to resume from for ``--ckpt_path`` (``None``: start afresh), from the ``trainer:`` settings,
    before the checkpoint's settings are merged in: ``last`` (the newest readable checkpoint of the run), a file
    (refused with ``ValueError`` when it cannot be read) or a folder (a distributed checkpoint, as it is)."""
    if ckpt_path is None or str(ckpt_path) in ("hpc", "best", "registry") or str(ckpt_path).startswith("registry:"):
        return None if ckpt_path is None else str(ckpt_path)  # Lightning's own meanings
    if str(ckpt_path) == "last":
        roots = search_roots(trainer)
        found, skipped = last_readable(candidates(roots))
        for line in skipped:
            rank_zero_warn(f"--ckpt_path last: skipping an unreadable checkpoint, {line}")
        if found is None:
            rank_zero_warn(
                f"--ckpt_path last: no readable checkpoint under {', '.join(map(str, roots))}; "
                "training starts at step 0"
            )
            return None
        rank_zero_info(f"--ckpt_path last: resuming from {found}")
        return str(found)
    refuse_unreadable(str(ckpt_path))
    return str(ckpt_path)


def checkpoint_settings(ckpt_path: str) -> dict[str, Any]:
    """The ``hyper_parameters`` a checkpoint holds."""
    return load_state(ckpt_path).get("hyper_parameters", {})


def load_state(ckpt_path: str) -> dict[str, Any]:
    """A checkpoint file's contents, or a distributed checkpoint folder's non-tensor state (its ``meta.pt``)."""
    import torch

    path = Path(ckpt_path)
    path = path / "meta.pt" if path.is_dir() else path
    return torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else {}


def merge_settings(parser: Any, config: Any, subcommand: str | None, settings: dict[str, Any]) -> Any:
    """``config`` with a checkpoint's ``model:`` settings merged in, as LightningCLI merges a checkpoint file's."""
    settings = {k: v for k, v in settings.items() if k != "_instantiator"}
    if not settings:
        return config
    if "_class_path" in settings:
        settings = {"class_path": settings.pop("_class_path"), "dict_kwargs": settings}
    return parser.parse_object({subcommand: {"model": settings}} if subcommand else {"model": settings}, config)


def continue_run_dir(trainer: L.Trainer, ckpt_path: str) -> bool:
    """With a default CSV/TensorBoard logger, log into the checkpoint's own ``version_N`` (``.../version_N/
    checkpoints/x.ckpt``) when it is a version of this logger's root, instead of starting ``version_N+1``; whether
    it does."""
    logger = numbered_logger(trainer)
    if logger is None:
        return False
    run = Path(ckpt_path).resolve().parent.parent
    if Path(ckpt_path).parent.name != "checkpoints" or run.parent != Path(logger.root_dir).resolve():
        return False
    # CSVLogger warns that the directory "exists and is not empty": the run appends to its own files
    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
    number = version_number(run.name)
    log_into(trainer, logger, run.name if number is None else number)
    rank_zero_info(f"Resuming run {run}: its metrics, alerts and summary continue there")
    return True


def refuse_unreadable(ckpt_path: str) -> None:
    """An explicit ``--ckpt_path`` file that cannot be read is refused before anything loads (Lightning's CLI reads
    its settings first), naming the newest readable checkpoint of the same run."""
    why = unreadable(ckpt_path)
    if why is None:
        return
    path = Path(ckpt_path).resolve()
    root = path.parent.parent.parent if path.parent.name == "checkpoints" else path.parent
    good, _ = last_readable([p for p in run_checkpoints(root) if p.resolve() != path])
    other = f"; the newest readable checkpoint of this run is {good}" if good else ""
    raise ValueError(f"--ckpt_path {ckpt_path!r} cannot be resumed from: {why}{other}")


def model_mismatch(ckpt_path: str, configured: object, default: object, resumed: object) -> str | None:
    """Why the checkpoint may not be resumed with this config: it trained another model than the one configured
    (Lightning's CLI would quietly take the checkpoint's). ``None`` when they agree or no model was configured."""
    if configured is None or str(configured) == str(default) or str(configured) == str(resumed):
        return None
    return (
        f"--ckpt_path {ckpt_path!r} holds a run of model {str(resumed)!r}, but the config trains model "
        f"{str(configured)!r}: resume with that run's model, or start a new run without --ckpt_path"
    )


@dataclass(frozen=True)
class Change:
    """A setting whose value in the config differs from the checkpoint's."""

    key: str  # dotted, under ``model.``
    configured: Any
    resumed: Any
    explicit: bool  # the config sets it (not its default): the config's value wins

    def line(self) -> str:
        given = "set to" if self.explicit else "left at its default"
        winner = f"the config's {self.configured!r}" if self.explicit else f"the checkpoint's {self.resumed!r}"
        return f"model.{self.key}: {given} {self.configured!r}, {self.resumed!r} in the checkpoint: {winner} is used"


def flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; a ``class_path`` object stays one value.

    >>> flat({"num_generations": 8, "loss": {"beta": 0.1}, "engine": {"class_path": "X", "init_args": {}}})
    {'num_generations': 8, 'loss.beta': 0.1, 'engine': {'class_path': 'X', 'init_args': {}}}
    """
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value and "class_path" not in value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def setting_changes(
    configured: dict[str, Any], resumed: dict[str, Any], defaults: dict[str, Any], given: set[str] | None = None
) -> list[Change]:
    """Every ``model:`` setting whose configured value differs from the checkpoint's (``resumed``: the config as
    Lightning merged the checkpoint's settings into it). A setting is explicit when it is in ``given`` (the dotted
    keys a config file or the command line set, at its default value or not); without ``given``, when it is not at
    its default.

    >>> setting_changes({"num_generations": 4, "seed": 0, "loss": {"beta": 0.0}},
    ...                 {"num_generations": 8, "seed": 1, "loss": {"beta": 0.1}},
    ...                 {"num_generations": 8, "seed": 0, "loss": {"beta": 0.0}},
    ...                 given={"num_generations", "loss.beta"})
    [Change(key='num_generations', configured=4, resumed=8, explicit=True), \
Change(key='seed', configured=0, resumed=1, explicit=False), \
Change(key='loss.beta', configured=0.0, resumed=0.1, explicit=True)]
    """
    configured, resumed, defaults = flat(configured), flat(resumed), flat(defaults)
    return [
        Change(key, value, resumed[key], explicit=key in given if given is not None else value != defaults.get(key))
        for key, value in configured.items()
        if key in resumed and str(resumed[key]) != str(value)
    ]


def refuse_meaningless(changes: list[Change], ckpt_path: str) -> None:
    """A ``num_generations`` change is refused when the checkpoint holds groups of the old size: its filter_groups
    buffer or an engine's rollouts sampled ahead would be trained as groups of the new size."""
    change = next((c for c in changes if c.key == "num_generations" and c.explicit), None)
    if change is None:
        return
    checkpoint = load_state(ckpt_path)
    waiting = [name for name, key in GROUPED_STATE.items() if _holds_groups(checkpoint.get(key, {}))]
    if waiting:
        raise ValueError(
            f"model.num_generations={change.configured}, but --ckpt_path {ckpt_path!r} was trained with "
            f"{change.resumed} and holds {' and '.join(waiting)} of {change.resumed} completions a prompt, which "
            f"cannot be trained as groups of {change.configured}: resume with model.num_generations="
            f"{change.resumed}, or start a new run without --ckpt_path"
        )


GROUPED_STATE = {
    "groups waiting for an update (filter_groups)": "group_buffer",
    "rollouts sampled ahead": "rollout_engine",
}


def _holds_groups(state: dict[str, Any]) -> bool:
    """Whether any rank's saved buffer or queue holds a rollout."""
    return any(_has_rollout(rank) for rank in state.get("ranks", []))


def _has_rollout(state: Any) -> bool:
    if isinstance(state, dict):
        return state.get("rollout") is not None or any(_has_rollout(v) for k, v in state.items() if k != "rollout")
    if isinstance(state, list | tuple):
        return any(_has_rollout(v) for v in state)
    return False
