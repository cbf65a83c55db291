"""`lightning-grpo fit` on the ways out the issue tried: a reward that raises mid-run, resume with `--ckpt_path last`
past an unreadable newest checkpoint, a checkpoint of another model; each ends with one message, no traceback."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT

from lightning_grpo.cli import main
from lightning_grpo.cli.failure import DEBUG

TEMPLATE = str(ROOT / "lightning_grpo" / "templates" / "tiny_cpu.yaml")  # on tiny files

FLAKY = """
import os
CALLS = {"n": 0}
def flaky(completions, **kwargs):
    CALLS["n"] += 1
    if CALLS["n"] == int(os.environ.get("FLAKY_FAILS_AT", "0")):
        raise ZeroDivisionError("the grader is down")
    return [float(len(c) % 2) for c in completions]
"""


def fit_args(tmp_path: Path, steps: int, *extra: str) -> list[str]:
    """The tiny template on the session's tiny model and arithmetic rows (``tiny_files``)."""
    model, data = (tmp_path.parent / "tiny_files.txt").read_text().split()
    return [
        "fit",
        "--config",
        TEMPLATE,
        "--trainer.max_steps",
        str(steps),
        "--trainer.limit_val_batches",
        "0",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path / "runs"),
        "--model.reward_funcs",
        "[flaky_reward.flaky]",
        "--model.accuracy_reward",
        "null",
        "--data.batch_size",
        "4",
        "--model.model",
        model,
        "--data.dataset",
        data,
        "--data.val_split",
        "null",
        *extra,
    ]


@pytest.fixture
def flaky(tmp_path, monkeypatch, tiny_model_dir, arith_jsonl):
    (tmp_path.parent / "tiny_files.txt").write_text(f"{tiny_model_dir} {arith_jsonl}")
    (tmp_path / "flaky_reward.py").write_text(FLAKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("flaky_reward", None)
    monkeypatch.delenv(DEBUG, raising=False)
    yield lambda n: monkeypatch.setenv("FLAKY_FAILS_AT", str(n))
    sys.modules.pop("flaky_reward", None)


def test_a_reward_that_raises_keeps_a_checkpoint_and_resume_continues_the_run(tmp_path, flaky, capsys):
    flaky(3)  # the third step's scoring raises: two steps are trained
    with pytest.raises(SystemExit) as done:
        main(fit_args(tmp_path, 4))
    err = capsys.readouterr().err
    run = tmp_path / "runs" / "lightning_logs" / "version_0"
    ckpt = run / "checkpoints" / "last.ckpt"
    assert done.value.code == 1 and "Traceback" not in err
    assert "reward function 'flaky' raised ZeroDivisionError" in err and f"--ckpt_path {ckpt}" in err
    assert torch.load(ckpt, weights_only=False)["global_step"] == 2
    assert "ZeroDivisionError" in (run / "error.log").read_text()  # the full trace, kept

    newest = run / "checkpoints" / "zz-truncated.ckpt"  # a kill mid-write under Lightning's own writer
    newest.write_bytes(ckpt.read_bytes()[:5000])
    flaky(0)
    with pytest.warns(UserWarning, match="skipping an unreadable checkpoint.*zz-truncated"):
        main(fit_args(tmp_path, 4, "--ckpt_path", "last"))
    assert sorted(p.name for p in (tmp_path / "runs" / "lightning_logs").iterdir()) == ["version_0"]  # one run dir
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and (run / "hf_model" / "config.json").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # the whole run's metrics in one file
    assert all("train/reward_window/mean" in r for r in rows)  # the monitor's too, first step of a resume included


def test_a_checkpoint_of_another_model_is_refused(tmp_path, flaky, capsys, tiny_model_dir):
    flaky(2)
    with pytest.raises(SystemExit):
        main(fit_args(tmp_path, 2))  # fails at step 2: a checkpoint of step 1
    ckpt = next((tmp_path / "runs").rglob("*.ckpt"))
    other = shutil.copytree(tiny_model_dir, tmp_path / "other-model")
    with pytest.raises(SystemExit) as done:
        main([*fit_args(tmp_path, 2), "--model.model", str(other), "--ckpt_path", str(ckpt)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err
    assert f"holds a run of model {tiny_model_dir!r}, but the config trains model {str(other)!r}" in err


def test_an_unreadable_ckpt_path_is_refused_naming_it(tmp_path, flaky, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as done:
        main(fit_args(tmp_path, 2, "--ckpt_path", str(bad)))
    err = capsys.readouterr().err
    assert done.value.code == 2 and f"--ckpt_path {str(bad)!r} cannot be resumed from" in err


def test_the_debug_flag_shows_the_traceback(tmp_path, flaky, monkeypatch):
    flaky(1)
    monkeypatch.setenv(DEBUG, "1")
    with pytest.raises(RuntimeError, match="reward function 'flaky' raised"):
        main(fit_args(tmp_path, 2))


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--data.dataset", "/no/such/data.jsonl"], "dataset file '/no/such/data.jsonl' does not exist"),
        (["--data.batch_size", "3", "--model.update.steps_per_generation", "2"], "must divide data.batch_size=3"),
        (["--data.system_prompt", "Be brief.", "--model.policy.tokenizer", "NOTEMPLATE"], "has no chat_template"),
    ],
)
def test_data_and_setting_errors_are_one_message_before_compute(tmp_path, flaky, capsys, extra, message):
    flaky(0)
    if "NOTEMPLATE" in extra:
        extra[extra.index("NOTEMPLATE")] = notemplate_tokenizer(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(fit_args(tmp_path, 2, *extra))
    err = capsys.readouterr().err
    assert done.value.code == 2 and message in err and "Traceback" not in err
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


def notemplate_tokenizer(tmp_path: Path) -> str:
    from transformers import AutoTokenizer

    model, _ = (tmp_path.parent / "tiny_files.txt").read_text().split()
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = None
    path = tmp_path / "notemplate"
    tokenizer.save_pretrained(path)
    for leftover in path.glob("chat_template.*"):
        os.remove(leftover)
    return str(path)
