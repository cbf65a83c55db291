"""DistillAlert, on real runs: a teacher equal to the student gives no signal to learn from, so the reverse KL stays
at ~0 and the alert fires; a run without a teacher leaves it silent; its state survives a checkpoint."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers import fit, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import DistillAlert, GRPOAlertError
from lightning_grpo.run import run_dir


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def test_a_student_that_stops_getting_closer_stops_the_run(tiny_model_dir, arith_jsonl, tmp_path):
    alert = DistillAlert(window=2, min_delta=0.05, action="stop")
    module = make_module(tiny_model_dir, distill={"teacher": tiny_model_dir, "reward_weight": 0.0})
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=10, callbacks=[alert])
    assert trainer.global_step == 4  # two windows of 2 steps, no fall of more than 0.05 nats
    assert [f.signal for f in alert.firings] == ["distill_reverse_kl"]
    assert "DistillAlert at step 4: distill_reverse_kl" in alert.firings[0].message
    assert "the student's reverse KL to its teacher averaged" in alert.firings[0].message
    written = [json.loads(line) for line in (run_dir(trainer) / "alerts.jsonl").read_text().splitlines()]
    assert written[0]["alert"] == "DistillAlert" and "mix the rewards in" in written[0]["message"]
    last = torch.load(run_dir(trainer) / "checkpoints/last.ckpt", weights_only=False)
    restored = DistillAlert(window=2, min_delta=0.05, action="stop")
    restored.load_state_dict(next(v for k, v in last["callbacks"].items() if k.startswith("DistillAlert")))
    assert restored.history == alert.history and len(restored.history["distill_reverse_kl"]) == 4


def test_a_run_without_a_teacher_leaves_it_silent(tiny_model_dir, arith_jsonl, tmp_path):
    alert = DistillAlert(window=1, min_delta=10.0, action="raise")
    fit(make_module(tiny_model_dir), data(arith_jsonl), tmp_path, max_steps=3, callbacks=[alert])
    assert alert.firings == [] and alert.history == {}


def test_raise_names_the_plateau(tiny_model_dir, arith_jsonl, tmp_path):
    alert = DistillAlert(window=1, min_delta=10.0, action="raise")
    module = make_module(tiny_model_dir, distill={"teacher": tiny_model_dir})
    with pytest.raises(GRPOAlertError, match="distill_reverse_kl = .* >= .* for 1 consecutive steps"):
        fit(module, data(arith_jsonl), tmp_path, max_steps=5, callbacks=[alert])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"window": 0}, "window must be >= 1, got 0"), ({"min_delta": -1.0}, r"min_delta must be >= 0 \(nats\)")],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistillAlert(**kwargs)


def test_the_docstring_example_runs():
    example = re.search(r"Example::\n\n(.*)", DistillAlert.__doc__, re.DOTALL).group(1)
    scope: dict = {}
    exec(compile("\n".join(line[8:] for line in example.splitlines()), "Example", "exec"), scope)
    assert any(isinstance(c, DistillAlert) and c.window == 20 for c in scope["trainer"].callbacks)
