"""Bad settings fail in GRPOModule's constructor, before any model is loaded, naming setting, value and choices."""

import pytest
import torch

from lightning_grpo import GRPOModule, SamplingConfig
from lightning_grpo.engines import LeanDecode
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.rewards import exact_match_reward

NOT_A_MODEL = "/nonexistent/model/never/loaded"  # loading it would fail: the checks must come first


@pytest.mark.parametrize(
    "setting,value,message",
    [
        ("num_generations", 1, "num_generations must be >= 2, got 1"),
        ("sampling.max_completion_length", 0, "sampling.max_completion_length must be >= 1, got 0"),
        (
            "loss.loss_type",
            "ppo",
            "loss_type must be one of ['bnpo', 'cispo', 'dapo', 'dr_grpo', 'grpo', 'luspo', 'sapo', 'vespo'], "
            "got 'ppo'",
        ),
        ("advantages.scale_rewards", "std", "scale_rewards must be one of ['group', 'batch', 'none'], got 'std'"),
        ("advantages.adv_estimator", "ppo", "advantages.adv_estimator must be one of"),
        ("loss.importance_sampling_level", "seq", "importance_sampling_level must be one of"),
        ("sampling.temperature", 0.0, "sampling.temperature must be > 0, got 0.0"),
        ("sampling.top_p", 1.5, "sampling.top_p must be in (0, 1], got 1.5"),
        ("loss.delta", 1.1, "delta must be None or > 1 + epsilon_high"),
        ("update.micro_batch_size", 0, "update.micro_batch_size must be None or >= 1, got 0"),
        ("update.steps_per_generation", 0, "update.steps_per_generation must be >= 1, got 0"),
        ("optim.lr_scheduler_type", "step", "optim.lr_scheduler_type must be one of"),
        ("optim.learning_rate", 0.0, "optim.learning_rate must be > 0, got 0.0"),
        ("policy.dtype", "fp8", "policy.dtype must be one of"),
        ("reward_calls.timeout", 0, "reward_calls.timeout must be a positive number of seconds or None, got 0"),
        ("policy.sync_ref_model", True, "policy.sync_ref_model=True updates a reference copy: it needs loss.beta > 0"),
    ],
)
def test_bad_setting_is_named(setting, value, message):
    section, _, name = setting.rpartition(".")
    kwargs = {section: {name: value}} if section else {setting: value}
    with pytest.raises(ValueError) as err:
        GRPOModule(model=NOT_A_MODEL, reward_funcs=[exact_match_reward], **kwargs)
    assert message in str(err.value)


def test_a_section_checks_itself_when_built():
    with pytest.raises(ValueError) as err:
        SamplingConfig(temperature=0, top_k=-1)
    text = str(err.value)
    assert text.startswith("invalid sampling settings:") and "temperature" in text and "top_k" in text


def test_every_problem_is_listed_at_once():
    with pytest.raises(ValueError) as err:
        GRPOModule(
            model=NOT_A_MODEL, reward_funcs=[exact_match_reward], num_generations=1, loss={"loss_type": "x", "beta": -1}
        )
    text = str(err.value)
    assert "num_generations" in text and "loss_type" in text and "beta" in text  # every section's, at once


def test_reward_settings_are_checked():
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        GRPOModule(model=NOT_A_MODEL)
    with pytest.raises(ValueError, match="accuracy_reward must name one of the reward functions"):
        GRPOModule(model=NOT_A_MODEL, reward_funcs=[exact_match_reward], accuracy_reward="accuracy")


def test_tokenizer_without_eos_is_refused(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.eos_token = None
    tok.pad_token = None
    with pytest.raises(ValueError, match="has no eos_token"):
        GRPOModule(model=tiny_model_dir, policy=PolicyConfig(tokenizer=tok), reward_funcs=[exact_match_reward])


def test_missing_pad_falls_back_to_eos(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.pad_token = None
    module = GRPOModule(model=tiny_model_dir, policy=PolicyConfig(tokenizer=tok), reward_funcs=[exact_match_reward])
    assert module.policy.tokenizer.pad_token_id == module.policy.tokenizer.eos_token_id
    assert module.policy.tokenizer.padding_side == "left"


def test_reward_preset_adds_weighted_functions(tiny_model_dir):
    module = GRPOModule(model=tiny_model_dir, reward_funcs=[exact_match_reward], reward_preset="qa")
    names = [f.__name__ for f in module.rewards.funcs]
    assert names[0] == "exact_match_reward" and "normalized_match_reward" in names
    assert module.rewards.weights[:2] == [1.0, 1.0] and len(module.rewards.weights) == len(names)
    with pytest.raises(ValueError, match="preset must be one of"):
        GRPOModule(model=NOT_A_MODEL, reward_preset="poetry")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_qlora_is_refused_at_config_time_where_it_cannot_run():
    with pytest.raises(ValueError) as err:
        GRPOModule(model=NOT_A_MODEL, reward_funcs=[exact_match_reward], policy={"load_in_4bit": True})
    message = str(err.value)
    assert "load_in_4bit (QLoRA) cannot run" in message and "no CUDA GPU is visible" in message
    assert "4-bit weights cannot train: give a peft_config adapter" in message


def test_an_engine_names_the_sampling_settings_it_cannot_honour():
    with pytest.raises(ValueError) as err:
        GRPOModule(
            model=NOT_A_MODEL,
            reward_funcs=[exact_match_reward],
            rollout_engine=LeanDecode(),
            sampling={"generation_kwargs": {"no_repeat_ngram_size": 3}},
        )
    assert "sampling.generation_kwargs={'no_repeat_ngram_size': 3}: LeanDecode samples" in str(err.value)
    assert "rollout_engine: null (HFGenerate)" in str(err.value)
