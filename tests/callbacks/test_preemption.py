"""Exact resume: 2N steps in one go equal N steps, a signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1), and N more
steps from the checkpoint it saved. What a resume leaves on disk: no temporary file of a write a kill interrupted, and
metrics.jsonl with each step once."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import ROOT, fit, logged, make_module
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo.callbacks import PreemptionCheckpoint
from lightning_grpo.callbacks.metricsfile import MetricsFile
from lightning_grpo.checkpoints import AtomicCheckpointIO
from lightning_grpo.data import PromptDataModule
from tests.test_checkpoints import KILLED_RUN

N = 3


class SendSignal(L.Callback):
    """Sends ``signum`` to this process during step ``at`` (0-based), like a scheduler preempting the job."""

    def __init__(self, at: int, signum: int = signal.SIGTERM) -> None:
        self.at, self.signum = at, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.at + 1:
            os.kill(os.getpid(), self.signum)


class Prompts(L.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(batch.prompts[0])


def data(arith_jsonl):
    return PromptDataModule(arith_jsonl, batch_size=4, val_split=None)  # 16 rows: 4 steps per epoch


def module(model_dir, dropout: float):
    """The tiny policy, with attention dropout: the training pass itself draws random numbers."""
    grpo = make_module(model_dir, loss={"beta": 0.1})
    for layer in grpo.policy.model.model.layers:
        layer.self_attn.attention_dropout = dropout
    return grpo


@dataclass
class Uninterrupted:
    """The 2N-step run every interrupted one must equal: run once per dropout, shared by the signals' tests."""

    trainer: L.Trainer
    parameters: dict[str, torch.Tensor]
    prompts: list


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, arith_jsonl, tmp_path_factory):
    runs: dict[float, Uninterrupted] = {}

    def run(dropout: float) -> Uninterrupted:
        if dropout not in runs:
            full, prompts = module(tiny_model_dir, dropout), Prompts()
            trainer = fit(
                full, data(arith_jsonl), tmp_path_factory.mktemp("full"), max_steps=2 * N, callbacks=[prompts]
            )
            parameters = {name: p.detach().clone() for name, p in full.policy.model.named_parameters()}
            runs[dropout] = Uninterrupted(trainer, parameters, prompts.seen)
        return runs[dropout]

    return run


SLOW = pytest.mark.slow  # each signal costs one more run: SIGHUP (a closed terminal) stands for them by default


@pytest.mark.parametrize(
    "signum,dropout",
    [
        (signal.SIGTERM, 0.0),
        (signal.SIGINT, 0.0),
        (signal.SIGHUP, 0.0),
        pytest.param(signal.SIGQUIT, 0.0, marks=SLOW),
        pytest.param(signal.SIGUSR1, 0.0, marks=SLOW),
        (signal.SIGTERM, 0.3),
    ],
    ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGTERM-dropout"],
)
def test_signal_saves_a_checkpoint_and_resume_is_exact(
    tiny_model_dir, arith_jsonl, tmp_path, uninterrupted, signum, dropout
):
    # 2N = 6 steps crosses an epoch boundary (4 steps per epoch) and the stop falls mid-epoch.
    reference = uninterrupted(dropout)
    first, first_prompts = module(tiny_model_dir, dropout), Prompts()
    handler = signal.getsignal(signum)  # Python's default_int_handler for SIGINT, or SIG_IGN in a background job
    if signum == signal.SIGHUP and handler == signal.SIG_IGN:
        pytest.skip("the tests run under nohup: a run keeps SIGHUP ignored (test_a_run_started_under_nohup_...)")
    with pytest.raises(SystemExit) as stop:
        fit(
            first,
            data(arith_jsonl),
            tmp_path / "first",
            max_steps=2 * N,
            callbacks=[SendSignal(at=N - 1, signum=signum), PreemptionCheckpoint(), first_prompts],
        )
    assert stop.value.code == 128 + signum
    assert signal.getsignal(signum) is handler  # handlers restored
    ckpt = tmp_path / "first" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == N

    resumed, resumed_prompts = module(tiny_model_dir, dropout), Prompts()
    second = fit(
        resumed, data(arith_jsonl), tmp_path / "second", max_steps=2 * N, ckpt_path=ckpt, callbacks=[resumed_prompts]
    )

    assert first_prompts.seen + resumed_prompts.seen == reference.prompts  # data order continues mid-epoch
    for name, b in resumed.policy.model.named_parameters():
        torch.testing.assert_close(reference.parameters[name], b, rtol=0, atol=1e-6, msg=name)
    expected, got = logged(reference.trainer), logged(second)
    for key in ("train/reward", "train/kl", "train/lr", "train/num_tokens"):
        assert expected[key][N:] == pytest.approx(got[key], abs=1e-6), key


def test_no_signal_no_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    fit(make_module(tiny_model_dir), data(arith_jsonl), tmp_path, max_steps=1, callbacks=[PreemptionCheckpoint()])
    assert not list(tmp_path.rglob("last.ckpt"))
    assert signal.getsignal(signal.SIGTERM) is not None


def test_a_run_started_under_nohup_keeps_ignoring_sighup():
    """Issue 59: the callback replaced nohup's SIG_IGN with its own handler, so a run started to outlive its
    terminal stopped when the terminal closed."""
    callback, before = PreemptionCheckpoint(), signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        callback.on_train_start(None, None)  # the handlers need no trainer
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == callback._request  # every other signal still stops the run
    finally:
        callback.on_train_end(None, None)
        signal.signal(signal.SIGHUP, before)
    assert signal.getsignal(signal.SIGTERM) != callback._request


def test_unknown_signal_is_refused():
    with pytest.raises(
        ValueError,
        match=r"signals must be a subset of \['SIGHUP', 'SIGINT', 'SIGQUIT', 'SIGTERM', 'SIGUSR1'\], got \['SIGKILL'\]",
    ):
        PreemptionCheckpoint(signals=["SIGKILL"])


def test_a_kill_mid_write_leaves_no_temporary_file_once_the_resumed_run_saves(tiny_model_dir, arith_jsonl, tmp_path):
    script = tmp_path / "killed_run.py"
    script.write_text(textwrap.dedent(KILLED_RUN))  # SIGKILL while step 2's checkpoint is being written
    checkpoints = tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(script), tiny_model_dir, arith_jsonl, str(checkpoints)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert "writing" in (line.strip() for line in proc.stdout)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
    assert len(list(checkpoints.glob(".last.ckpt.tmp-*"))) == 1  # what the kill left beside step 1's checkpoint
    last = ModelCheckpoint(dirpath=checkpoints, filename="last", every_n_train_steps=1, enable_version_counter=False)
    resumed = fit(
        make_module(tiny_model_dir),
        data(arith_jsonl),
        tmp_path / "resumed",
        max_steps=3,
        ckpt_path=checkpoints / "last.ckpt",
        enable_checkpointing=True,
        callbacks=[last],
        plugins=[AtomicCheckpointIO()],
    )
    assert resumed.global_step == 3 and sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt"]


def test_a_resumed_run_writes_each_step_once_in_metrics_jsonl(tiny_model_dir, arith_jsonl, tmp_path):
    def run(max_steps: int, ckpt_path: Path | None = None) -> list[dict]:
        every_step = ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=1, save_top_k=-1)
        trainer = L.Trainer(
            max_steps=max_steps,
            accelerator="cpu",
            logger=CSVLogger(tmp_path, version=0),  # the resumed run continues the interrupted run's directory
            log_every_n_steps=1,
            val_check_interval=2,
            limit_val_batches=1,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[every_step, MetricsFile()],
        )
        trainer.fit(make_module(tiny_model_dir), PromptDataModule(arith_jsonl, batch_size=4), ckpt_path=ckpt_path)
        return [json.loads(line) for line in (Path(trainer.logger.log_dir) / "metrics.jsonl").open()]

    def steps(rows: list[dict]) -> dict[str, list[int]]:
        return {kind: [r["step"] for r in rows if any(k.startswith(kind) for k in r)] for kind in ("train/", "val/")}

    interrupted = run(max_steps=4)  # got to step 4; the resume below starts from step 2's checkpoint
    assert steps(interrupted)["train/"] == [1, 2, 3, 4] and steps(interrupted)["val/"][:2] == [0, 2]  # 0: sanity
    checkpoint = next((tmp_path / "checkpoints").glob("*step=2.ckpt"))
    resumed = run(max_steps=4, ckpt_path=checkpoint)
    assert steps(resumed) == steps(interrupted)  # each step once: steps 3 and 4 written again, not twice
    before = [r for r in interrupted if r["step"] <= 2]
    assert resumed[: len(before)] == before  # the rows up to the checkpoint's step, as they were
