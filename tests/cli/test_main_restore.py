"""Checkpoints that restore: ``GRPOModule.load_from_checkpoint(path)`` imports the run's reward functions again."""

from __future__ import annotations

import pytest
import torch
from helpers import fit, length_reward, make_module

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.cli import main
from lightning_grpo.rewards import exact_match_reward


def trained(module, arith_jsonl, tmp_path):
    data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None)
    return fit(module, data, tmp_path, enable_checkpointing=True).checkpoint_callback.best_model_path


def test_load_from_checkpoint_imports_the_reward_functions(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, reward_weights=[1.0, 0.5])
    restored = GRPOModule.load_from_checkpoint(trained(module, arith_jsonl, tmp_path))
    assert restored.rewards.funcs == [exact_match_reward, length_reward] and restored.rewards.weights == [1.0, 0.5]
    for (name, saved), loaded in zip(module.policy.named_parameters(), restored.policy.parameters()):
        torch.testing.assert_close(loaded, saved, msg=name)


def test_reward_functions_without_an_import_path_are_given_again(tiny_model_dir, arith_jsonl, tmp_path):
    def local_reward(completions, **kwargs):
        return [len(c) / 8 for c in completions]

    path = trained(
        make_module(tiny_model_dir, reward_funcs=[local_reward], accuracy_reward=None), arith_jsonl, tmp_path
    )
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        GRPOModule.load_from_checkpoint(path)
    assert GRPOModule.load_from_checkpoint(path, reward_funcs=[local_reward]).rewards.funcs == [local_reward]


@pytest.mark.slow  # a CLI run of the tiny template: ~20 s alone, minutes on a loaded machine
def test_a_cli_runs_checkpoint_loads_with_its_yaml_reward_functions(tmp_path):
    main(["fit", "--config", "tiny_cpu", "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
          "--data.max_val_prompts", "4", "--trainer.num_sanity_val_steps", "0"])  # fmt: skip
    checkpoint = next(tmp_path.glob("lightning_logs/version_0/checkpoints/*.ckpt"))
    restored = GRPOModule.load_from_checkpoint(checkpoint)
    assert restored.rewards.funcs == [exact_match_reward] and restored.settings.loss.beta == 0.1  # sections restored


def test_logged_hyperparameters_are_plain_values(tiny_model_dir, tmp_path):
    """The sections a module is built with by default (frozen dataclasses) reach the loggers as dicts: CSV and
    TensorBoard write them with ``save_hparams_to_yaml``, which fails on a frozen dataclass when omegaconf is
    installed (hydra users; skyrl-gym brings it in)."""
    import dataclasses

    from lightning.pytorch.core.saving import load_hparams_from_yaml, save_hparams_to_yaml

    module = make_module(tiny_model_dir)
    assert not [k for k, v in module.hparams_initial.items() if dataclasses.is_dataclass(v)]
    save_hparams_to_yaml(tmp_path / "hparams.yaml", module.hparams_initial)
    assert load_hparams_from_yaml(tmp_path / "hparams.yaml")["loss"]["loss_type"] == module.settings.loss.loss_type
