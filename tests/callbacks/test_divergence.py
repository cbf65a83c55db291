"""KLAlert on real runs of the tiny model: the advice it gives keeps a run under it."""

from __future__ import annotations

import pytest
import torch
from helpers import fit, logged, make_module

from lightning_grpo.callbacks import (
    KLAlert,
)
from lightning_grpo.engines import HFGenerate
from tests.callbacks.test_alerts import data


@pytest.fixture
def one_thread():
    """The KL trajectories below were measured with one thread (the thread count changes the sums' rounding)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def kl_alert_of_a_run(model_dir, path, tmp_path, learning_rate, beta=0.04):
    alert = KLAlert()  # the defaults: kl > 0.5 for 3 steps in a row
    module = make_module(
        model_dir, loss={"beta": beta}, optim={"learning_rate": learning_rate}, rollout_engine=HFGenerate()
    )  # the trajectories below were measured with HFGenerate's samples
    trainer = fit(module, data(path), tmp_path, max_steps=30, callbacks=[alert])
    return alert, max(logged(trainer)["train/kl"])


def test_kl_alert_advice_halving_the_learning_rate_keeps_the_run_under_it(
    tiny_model_dir, arith_jsonl, tmp_path, one_thread
):
    # learning rate 1e-2 at beta 0.04: KL passes 0.5 from step 17 and the alert fires at 19 (0.64)
    fired, _ = kl_alert_of_a_run(tiny_model_dir, arith_jsonl, tmp_path, learning_rate=1e-2)
    assert fired.firings and fired.firings[0].signal == "kl"
    assert "Try: halve model.optim.learning_rate" in fired.firings[0].message
    halved, kl = kl_alert_of_a_run(tiny_model_dir, arith_jsonl, tmp_path, learning_rate=1e-2 / 2)
    assert not halved.firings and kl < 0.45  # 0.38 at most
    # the advice's second step alone is not enough here: the KL term pulls back slower than the step pushes out
    doubled_beta, _ = kl_alert_of_a_run(tiny_model_dir, arith_jsonl, tmp_path, learning_rate=1e-2, beta=0.08)
    assert doubled_beta.firings
