"""The alerts' common ground, driven by real runs on the tiny model: their state survives a checkpoint (one written
before the base kept the alerts' series too), bad settings are named."""

from __future__ import annotations

import pytest
import torch
from helpers import fit, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import (
    DistillAlert,
    KLAlert,
    MismatchAlert,
    ModeCollapseAlert,
)


def constant_reward(completions, **kwargs):
    """A reward that cannot tell completions apart: every group has zero std, GRPO learns nothing."""
    return [0.5] * len(completions)


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def test_alert_state_round_trips_through_a_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=50, callbacks=[alert], enable_checkpointing=True)
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    restored = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    restored.load_state_dict(next(v for k, v in ckpt["callbacks"].items() if k.startswith("ModeCollapseAlert")))
    assert restored.counts == alert.counts and restored.early == alert.early
    assert [f.message for f in restored.firings] == [f.message for f in alert.firings]


def test_bad_alert_settings_are_named():
    with pytest.raises(ValueError, match=r"action must be one of \['warn', 'stop', 'raise'\], got 'panic'"):
        ModeCollapseAlert(action="panic")
    with pytest.raises(ValueError, match="patience must be >= 1, got 0"):
        KLAlert(patience=0)


def kl_module(model_dir):
    return make_module(model_dir, loss={"beta": 0.04})  # KL is measured with beta > 0


def test_a_kl_alert_checkpoint_written_before_the_base_kept_its_series_resumes(tiny_model_dir, arith_jsonl, tmp_path):
    """Before issue 56 KLAlert saved its KL series as a bare list under the same state key: a resumed run goes on
    from it, window + 1 values long."""
    first = KLAlert(window=2)
    trainer = fit(kl_module(tiny_model_dir), data(arith_jsonl), tmp_path / "a", max_steps=2, callbacks=[first],
                  enable_checkpointing=True)  # fmt: skip
    path = trainer.checkpoint_callback.best_model_path
    ckpt = torch.load(path, weights_only=False)
    key = "KLAlert{'patience': 3, 'action': 'warn', 'limits': (0.5, 4.0, 0.05, 0.2, 2)}"  # the old code's key
    assert ckpt["callbacks"][key]["history"] == {"kl": first.history["kl"]}
    old = [0.125, *first.history["kl"]]  # as the old code wrote it: the list of the last window + 1 KLs
    ckpt["callbacks"][key] = {"counts": {}, "firings": [], "history": old}
    torch.save(ckpt, path)
    resumed = KLAlert(window=2)
    fit(kl_module(tiny_model_dir), data(arith_jsonl), tmp_path / "b", max_steps=3, ckpt_path=path, callbacks=[resumed])
    assert resumed.history["kl"][:2] == old[1:] and len(resumed.history["kl"]) == 3  # the oldest KL fell out


@pytest.mark.parametrize(
    ("alert", "old", "restored"),
    [  # each alert's state as the code before issue 56 saved it, and the series it is now
        (KLAlert(window=2), [0.1, 0.2, 0.3, 0.4], {"kl": [0.2, 0.3, 0.4]}),
        (DistillAlert(window=1), [0.5, 0.4], {"distill_reverse_kl": [0.5, 0.4]}),
        (DistillAlert(window=1), [], {}),  # a run without a teacher
        (
            MismatchAlert(window=2),
            {"token_mult_prob_error": [1.2, 1.3], "sampler_kl": [0.02, 0.03], "sampler_ess": []},
            {"token_mult_prob_error": [1.2, 1.3], "sampler_kl": [0.02, 0.03]},
        ),
    ],
)
def test_an_old_checkpoint_s_history_loads_into_the_base_s_series(alert, old, restored):
    alert.load_state_dict({"counts": {"kl": 1}, "firings": [], "history": old})
    assert alert.history == restored and alert.counts == {"kl": 1}
    assert alert.state_dict()["history"] == restored


def test_the_state_keys_are_those_of_the_old_checkpoints():
    """Lightning finds a callback's state in a checkpoint by its key: the alerts' settings, unchanged by the move."""
    assert KLAlert().state_key == "KLAlert{'patience': 3, 'action': 'warn', 'limits': (0.5, 4.0, 0.05, 0.2, 10)}"
    limits = "'limits': (1.1, 0.01, 0.5, 5)"
    assert MismatchAlert().state_key == f"MismatchAlert{{'patience': 3, 'action': 'warn', {limits}}}"
    assert DistillAlert().state_key == "DistillAlert{'patience': 1, 'action': 'warn', 'window': 20, 'min_delta': 0.0}"


@pytest.mark.parametrize("alert", [KLAlert, MismatchAlert, DistillAlert])
def test_a_window_under_one_is_named(alert):
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        alert(window=0)
