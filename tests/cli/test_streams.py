"""A terminal that goes away never costs the run (issue 59): real pseudo-terminals whose master side is closed
mid-run, as a killed tmux session or a dropped SSH connection closes it. The kernel then sends SIGHUP to the
terminal's session, and every later write to it fails with EIO."""

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch

from lightning_grpo.cli import streams

# The launcher a terminal's shell or nohup is: makes the pty its controlling terminal (the child leads a new
# session), ignores SIGHUP when asked (nohup: an ignored signal stays ignored across exec) and otherwise restores its
# default (a shell's job gets it even where the process that started the tests ignores SIGHUP), then execs the command.
LAUNCH = (
    "import fcntl, os, signal, sys, termios\n"
    "if sys.argv[1] != 'background':\n"
    "    fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "signal.signal(signal.SIGHUP, signal.SIG_IGN if sys.argv[1] == 'nohup' else signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)
FIT = ["-m", "lightning_grpo", "fit", "--config", "tiny_cpu", "--trainer.default_root_dir", "run"]


def fit(model_dir: str, max_steps: int) -> list[str]:
    """The tiny_cpu run on the random tiny model (its own warm-started one is built once per home: a minute)."""
    return [*FIT, "--model.model", model_dir, "--trainer.max_steps", str(max_steps)]


def in_a_terminal(args: list[str], cwd: Path, how: str = "terminal") -> tuple[subprocess.Popen, int]:
    """``python ARGS`` with a new pty as stdin, stdout and stderr: its controlling terminal (``how`` "terminal"
    or "nohup"), or only its output ("background": a job with no signal coming when the terminal goes)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a size: tqdm draws its bar
    command = [sys.executable, "-c", LAUNCH, how, *args]
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, start_new_session=True)
    os.close(slave)
    return proc, master


def read_until(master: int, pattern: bytes, proc: subprocess.Popen, seconds: float = 300) -> bytes:
    """What the terminal showed until ``pattern``; the master keeps being read, so the child never blocks."""
    seen, deadline = b"", time.monotonic() + seconds
    while not re.search(pattern, seen):
        tail = seen[-3000:].decode(errors="replace")
        assert proc.poll() is None and time.monotonic() < deadline, f"no {pattern!r}, exit {proc.poll()}: {tail}"
        if select.select([master], [], [], 1.0)[0]:
            seen += os.read(master, 1 << 16)
    return seen


CHILD = """
import logging, os, sys, time, warnings
import importlib.util
handler = logging.StreamHandler(sys.stderr)  # holds the unguarded stream, as Lightning's handler does
spec = importlib.util.spec_from_file_location("streams", sys.argv[2])  # the module alone: the package takes seconds
streams = importlib.util.module_from_spec(spec)
spec.loader.exec_module(streams)
streams.guard_standard_streams()
logging.getLogger("child").addHandler(handler)
print("ready", flush=True)
while not os.path.samefile("/proc/self/fd/1", os.devnull):  # until a write finds the terminal gone
    print("waiting", flush=True)
    time.sleep(0.01)
print("to stderr", file=sys.stderr)
logging.getLogger("child").error("logged")
warnings.warn("warned")
from tqdm import tqdm
for _ in tqdm(range(3)):
    pass
sys.__stdout__.write("the raw stream\\n")
sys.__stdout__.flush()
sys.stdout.write("still buffered at exit, when Python flushes it")
open(sys.argv[1], "w").write("done")
"""


def test_output_to_a_terminal_that_went_away_is_dropped_and_the_exit_status_kept(tmp_path):
    """print, logging, warnings, tqdm, the raw stream and Python's flush at exit (which turns a failure into
    status 120) all write nowhere once the terminal is gone; without the guard the first print raised EIO."""
    done = tmp_path / "done"
    proc, master = in_a_terminal(["-c", CHILD, str(done), streams.__file__], tmp_path, how="background")
    read_until(master, b"ready", proc, seconds=60)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    assert done.read_text() == "done"


def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run" / "lightning_logs" / "version_0"


@pytest.mark.slow  # ~15 s on 2 busy cores, most of it the CLI's start
def test_a_closed_terminal_s_sighup_stops_the_run_after_its_step_with_last_ckpt_and_129(tmp_path, tiny_model_dir):
    proc, master = in_a_terminal(fit(tiny_model_dir, 400), tmp_path)
    read_until(master, rb"step [3-9]/400", proc)
    os.close(master)  # the terminal goes away: SIGHUP to its session, EIO on every write to it
    assert proc.wait(timeout=300) == 128 + signal.SIGHUP
    run = run_dir(tmp_path)
    assert 3 <= torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] < 400
    assert not (run / "error.log").exists() and not (run / "hf_model").exists()


@pytest.mark.slow  # ~20 s each
@pytest.mark.parametrize("how", ["nohup", "background"])
def test_a_closed_terminal_without_a_signal_lets_the_run_finish_and_export(tmp_path, tiny_model_dir, how):
    """Issue 59: the run trained on unseen, then died printing its summary (OSError EIO), exit 1, no export."""
    proc, master = in_a_terminal(fit(tiny_model_dir, 12), tmp_path, how=how)
    read_until(master, rb"step [3-9]/12", proc)
    os.close(master)  # under nohup SIGHUP comes and is ignored; a background job gets none
    assert proc.wait(timeout=300) == 0
    run = run_dir(tmp_path)
    assert (run / "hf_model" / "config.json").exists() and not (run / "error.log").exists()
    assert '"steps": 12' in (run / "summary.json").read_text()
