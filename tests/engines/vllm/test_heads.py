"""engines/vllm/heads.py: the head-size rule vLLM-CPU's attention imposes, read from a model's config before any
weight loads. No vLLM needed; where the rule is called (``VLLMColocate``, ``GRPOModule``, the server launcher) is
tested against the real vLLM-CPU in tests/test_vllm_real.py."""

from __future__ import annotations

import pytest

from lightning_grpo.demo.registry import EMBEDDED, embedded_model_sizes, materialize
from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
from lightning_grpo.engines.vllm.heads import CPU_HEAD_SIZES, SERVED_DEMO, cpu_head_problems, head_size, model_config


def test_the_embedded_tiny_model_is_refused_naming_its_head_size_and_the_model_to_use(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_HOME", str(tmp_path))  # nothing may be written to find the head size
    (problem,) = cpu_head_problems(
        "VLLMColocate", "lightning-grpo/tiny-qwen2", model_config("lightning-grpo/tiny-qwen2")
    )
    assert "'lightning-grpo/tiny-qwen2' has attention heads of 16 dimensions" in problem
    assert "hidden_size 64 / num_attention_heads 4" in problem and "VLLMColocate" in problem
    assert "serves head sizes 32, 64, 80" in problem and f"Use model.model {SERVED_DEMO}" in problem
    assert list(tmp_path.iterdir()) == []


def test_the_served_demo_and_the_test_model_pass_without_being_written(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_HOME", str(tmp_path))
    for name in (SERVED_DEMO, "lightning-grpo/tiny-qwen2-hd64"):
        assert head_size(model_config(name))[0] == 64
        assert cpu_head_problems("VLLMColocate", name, model_config(name)) == []
    assert list(tmp_path.iterdir()) == []


def test_every_embedded_model_has_its_sizes_known_before_it_is_written():
    models = [n for n in EMBEDDED if n.startswith("lightning-grpo/tiny-qwen2")]
    assert models and all(embedded_model_sizes(n) is not None for n in models)
    assert embedded_model_sizes("lightning-grpo/tiny-max") is None  # a data set


def test_the_sizes_read_before_writing_are_the_written_model_s(tmp_path, monkeypatch):
    """The written config (the random hd64 model: quick to write) has the head size read from the sizes table."""
    monkeypatch.setenv("LIGHTNING_GRPO_HOME", str(tmp_path))
    written = materialize("lightning-grpo/tiny-qwen2-hd64")
    assert head_size(model_config(str(written))) == head_size(embedded_model_sizes("lightning-grpo/tiny-qwen2-hd64"))


def test_a_built_model_and_a_directory_are_read_from_their_config(tmp_path):
    model = build_tiny_qwen2(build_tokenizer(), hidden_size=96, num_attention_heads=2, num_key_value_heads=2)
    model.save_pretrained(tmp_path / "m")
    assert (
        head_size(model_config(model))
        == head_size(model_config(str(tmp_path / "m")))
        == (48, "hidden_size 96 / num_attention_heads 2")
    )
    (problem,) = cpu_head_problems("VLLMColocate", model, model_config(model))
    assert problem.startswith("model.model Qwen2ForCausalLM has attention heads of 48 dimensions")


@pytest.mark.parametrize("size", CPU_HEAD_SIZES)
def test_an_explicit_head_dim_wins_over_the_division(size):
    config = {"head_dim": size, "hidden_size": 64, "num_attention_heads": 4}  # 64 / 4 = 16 would be refused
    assert cpu_head_problems("VLLMColocate", "m", config) == []
    assert cpu_head_problems("VLLMColocate", "m", {**config, "head_dim": 16}) != []


def test_an_unreadable_config_is_left_to_vllm(tmp_path):
    """A directory with no config.json: the check says nothing (vLLM's own load then reports what it finds)."""
    assert model_config(str(tmp_path)) is None
    assert cpu_head_problems("VLLMColocate", str(tmp_path), None) == []
