"""Checkpoints on a separate small filesystem (a tmpfs): a full disk and a kill mid-write leave the last good
checkpoint readable, and training resumes from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import ROOT, make_module
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_grpo.checkpoints import AtomicCheckpointIO, last_readable, run_checkpoints, unreadable
from lightning_grpo.data import PromptDataModule


@pytest.fixture
def small_fs(tmp_path):
    """A mount point for a tmpfs of a given size in bytes (needs root: skipped where mounting is not permitted)."""
    mounted = []

    def mount(size: int) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def fit_steps(model_dir, data, logs, max_steps, ckpt_dir=None, ckpt_path=None, io=None):
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1, save_top_k=-1)] if ckpt_dir else []
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        default_root_dir=logs,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(ckpt_dir),
        limit_val_batches=0,
        callbacks=callbacks,
        plugins=[io or AtomicCheckpointIO()],
    )
    trainer.fit(make_module(model_dir), data, ckpt_path=ckpt_path)
    return trainer


def test_a_full_disk_keeps_the_last_good_checkpoint_and_resume_uses_it(tiny_model_dir, arith_jsonl, tmp_path, small_fs):
    data = lambda: PromptDataModule(arith_jsonl, batch_size=4, val_split=None)  # noqa: E731
    fit_steps(tiny_model_dir, data(), tmp_path / "probe", 1, ckpt_dir=tmp_path / "probe_ckpt")
    size = next((tmp_path / "probe_ckpt").glob("*.ckpt")).stat().st_size
    disk = small_fs(int(size * 1.6) // 4096 * 4096)  # room for one checkpoint, not two
    with pytest.raises(OSError, match="no space left on the device"):
        fit_steps(tiny_model_dir, data(), tmp_path / "run", 3, ckpt_dir=disk)
    assert [p.name for p in disk.iterdir()] == ["epoch=0-step=1.ckpt"]  # no partial file, no truncated step 2
    good, skipped = last_readable(sorted(disk.glob("*.ckpt")))
    assert good is not None and good.name == "epoch=0-step=1.ckpt" and not skipped
    resumed = fit_steps(tiny_model_dir, data(), tmp_path / "resumed", 3, ckpt_path=good)
    assert resumed.global_step == 3


def test_lightnings_own_writer_leaves_a_truncated_checkpoint_on_a_full_disk(tmp_path, small_fs):
    """The case AtomicCheckpointIO fixes: TorchCheckpointIO writes the final name in place."""
    disk = small_fs(1 << 20)
    with pytest.raises(OSError):
        TorchCheckpointIO().save_checkpoint({"w": torch.zeros(1 << 19)}, disk / "last.ckpt")  # 2 MiB on 1 MiB
    assert (disk / "last.ckpt").exists() and "truncated" in unreadable(disk / "last.ckpt")
    with pytest.raises(OSError):
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(1 << 19)}, disk / "atomic.ckpt")
    assert not (disk / "atomic.ckpt").exists() and not any(disk.glob(".atomic*"))


KILLED_RUN = """
import sys, time
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_grpo.checkpoints import AtomicCheckpointIO
from lightning_grpo.data import PromptDataModule
from tests.helpers import make_module

class Stall:  # pickled inside torch.save, with the checkpoint file open: the kill comes mid-write
    def __reduce__(self):
        print("writing", flush=True)
        time.sleep(600)

class StallSecond(L.Callback):
    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if trainer.global_step == 2:
            checkpoint["stall"] = Stall()

model_dir, data_file, ckpt_dir = sys.argv[1:]
trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False, limit_val_batches=0,
                    callbacks=[ModelCheckpoint(dirpath=ckpt_dir, filename="last", every_n_train_steps=1,
                               enable_version_counter=False), StallSecond()], plugins=[AtomicCheckpointIO()])
trainer.fit(make_module(model_dir), PromptDataModule(data_file, batch_size=4, val_split=None))
"""


def test_a_kill_during_a_checkpoint_write_keeps_the_last_good_one(tiny_model_dir, arith_jsonl, tmp_path, small_fs):
    disk = small_fs(64 << 20)
    script = tmp_path / "killed_run.py"
    script.write_text(textwrap.dedent(KILLED_RUN))
    root = ROOT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(script), tiny_model_dir, arith_jsonl, str(disk)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert "writing" in (line.strip() for line in proc.stdout)  # step 2's checkpoint is being written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert unreadable(disk / "last.ckpt") is None  # step 1's, whole
    assert torch.load(disk / "last.ckpt", weights_only=False)["global_step"] == 1
    data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None)
    resumed = fit_steps(tiny_model_dir, data, tmp_path / "resumed", 3, ckpt_path=disk / "last.ckpt")
    assert resumed.global_step == 3


def test_the_newest_readable_checkpoint_is_found_across_versions(tmp_path):
    for version in ("version_0", "version_1"):
        (tmp_path / version / "checkpoints").mkdir(parents=True)
    AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "version_0" / "checkpoints" / "last.ckpt")
    newest = tmp_path / "version_1" / "checkpoints" / "last.ckpt"
    newest.write_bytes(b"PK\x03\x04 truncated")
    os.utime(newest, (os.path.getmtime(newest) + 10,) * 2)
    good, skipped = last_readable(run_checkpoints(tmp_path))
    assert good == tmp_path / "version_0" / "checkpoints" / "last.ckpt"
    assert len(skipped) == 1 and "version_1" in skipped[0] and "truncated" in skipped[0]


def handmade_checkpoint(path: Path, model_dir: str, group_buffer: dict | None) -> str:
    """A checkpoint's settings and filter_groups buffer, as the module saves them; no weights (nothing loads them:
    the run is refused, or its settings named, before the model loads)."""
    hparams = {"model": model_dir, "num_generations": 8, "seed": 5, "advantages": {"filter_groups": True}}
    torch.save({"hyper_parameters": hparams, "group_buffer": {"ranks": [group_buffer]}}, path)
    return str(path)


def cli_resume(model_dir: str, data: str, ckpt: str, *flags: str) -> None:
    from lightning_grpo.cli.main import main

    args = ["fit", "--data.dataset", data, "--model.model", model_dir, "--model.advantages.filter_groups", "true"]
    main([*args, "--trainer.max_steps", "1", "--ckpt_path", ckpt, *flags])


def test_a_num_generations_change_against_a_filter_groups_buffer_is_refused(
    tiny_model_dir, arith_jsonl, tmp_path, capsys
):
    waiting = {"rollout": {"prompt_ids": torch.zeros(8, 2)}, "scores": None, "counters": [1, 2, 1]}
    ckpt = handmade_checkpoint(tmp_path / "last.ckpt", tiny_model_dir, waiting)
    with pytest.raises(SystemExit):
        cli_resume(tiny_model_dir, arith_jsonl, ckpt, "--model.num_generations", "4")
    assert (
        f"model.num_generations=4, but --ckpt_path '{ckpt}' was trained with 8 and holds groups waiting for an "
        "update (filter_groups) of 8 completions a prompt" in capsys.readouterr().err
    )


def test_every_setting_that_differs_from_the_checkpoint_is_named_with_the_one_that_wins(
    tiny_model_dir, arith_jsonl, tmp_path
):
    ckpt = handmade_checkpoint(tmp_path / "last.ckpt", tiny_model_dir, {"rollout": None, "scores": None})
    with pytest.warns(UserWarning, match="2 setting") as warned, pytest.raises(SystemExit):  # no weights to load
        cli_resume(tiny_model_dir, arith_jsonl, ckpt, "--model.num_generations", "4")
    message = next(str(w.message) for w in warned if "differ from the checkpoint" in str(w.message))
    assert "model.num_generations: set to 4, 8 in the checkpoint: the config's 4 is used" in message
    assert "model.seed: left at its default 0, 5 in the checkpoint: the checkpoint's 5 is used" in message


def test_ckpt_path_last_is_merged_compared_and_refused_like_a_file(tiny_model_dir, arith_jsonl, tmp_path, capsys):
    run = tmp_path / "lightning_logs" / "version_0" / "checkpoints"  # the default logger's run directory
    run.mkdir(parents=True)
    waiting = {"rollout": {"prompt_ids": torch.zeros(8, 2)}, "scores": None, "counters": [1, 2, 1]}
    ckpt = handmade_checkpoint(run / "last.ckpt", tiny_model_dir, waiting)
    root = ["--trainer.default_root_dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        cli_resume(tiny_model_dir, arith_jsonl, "last", "--model.num_generations", "4", *root)
    assert f"model.num_generations=4, but --ckpt_path '{ckpt}' was trained with 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_resume(str(tmp_path / "other"), arith_jsonl, "last", *root)  # another model than the checkpoint's
    assert f"--ckpt_path '{ckpt}' holds a run of model {tiny_model_dir!r}" in capsys.readouterr().err


def test_a_setting_given_at_its_default_value_wins_over_the_checkpoints(tiny_model_dir, arith_jsonl, tmp_path):
    ckpt = handmade_checkpoint(tmp_path / "last.ckpt", tiny_model_dir, {"rollout": None, "scores": None})
    with pytest.warns(UserWarning, match="differ from the checkpoint") as warned, pytest.raises(SystemExit):
        cli_resume(tiny_model_dir, arith_jsonl, ckpt, "--model.seed", "0")  # 0: the default, given explicitly
    message = next(str(w.message) for w in warned if "differ from the checkpoint" in str(w.message))
    assert "model.seed: set to 0, 5 in the checkpoint: the config's 0 is used" in message


def test_a_resume_with_nothing_changed_names_no_setting(tiny_model_dir, arith_jsonl, tmp_path, recwarn):
    from lightning_grpo import GRPOModule

    module = GRPOModule(model=tiny_model_dir, reward_funcs=[len], advantages={"filter_groups": True})
    assert module.settings.update.sampling_correction != "auto"  # resolved for the engine; saved as configured
    path = tmp_path / "last.ckpt"
    settings = {k: v for k, v in module.hparams.items() if k != "reward_funcs"}  # cli_resume gives none either
    torch.save({"hyper_parameters": settings, "group_buffer": {"ranks": [None]}}, path)
    with pytest.raises(SystemExit):  # no weights to load
        cli_resume(tiny_model_dir, arith_jsonl, str(path))
    assert not [str(w.message) for w in recwarn if "differ from the checkpoint" in str(w.message)]
