"""The teacher beside the policy (model/teacher.py, Policy.teacher_logps): its forward takes options valid for its
own config, and it is compared with the student by tokenizer, not by embedding rows."""

from __future__ import annotations

import pytest
import torch
from helpers import fit, logged, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.logprobs import completion_logps
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.teacher import TeacherModel
from tests.targets.test_distill import rollout_of


def saved(path, model) -> str:
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def windowed_teacher_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 of the student's tokenizer whose second layer attends within a window of 2 tokens (Qwen2's
    ``use_sliding_window``), beside a student whose layers all attend fully."""
    model = build_tiny_qwen2(build_tokenizer(), seed=1, use_sliding_window=True, sliding_window=2, max_window_layers=1)
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    return saved(tmp_path_factory.mktemp("windowed-teacher"), model)


@pytest.mark.parametrize("padding_free", [False, True])
def test_a_sliding_window_teacher_beside_a_full_attention_student_scores_as_alone(
    tiny_model_dir, windowed_teacher_dir, padding_free
):
    # The student encodes a group's prompt once (its default); the teacher's window drops prompt keys from its
    # cache, so its forward must not: before, it raised (the cache check) or, packed, read past its window (0.17).
    torch.manual_seed(0)
    policy = Policy(tiny_model_dir, PolicyConfig(padding_free=padding_free), teacher=TeacherModel(windowed_teacher_dir))
    assert policy.shares_prompt_prefix and policy.teacher_layout == (False, padding_free)
    rollout = rollout_of(policy, n=4, width=6)
    ours = policy.teacher_logps(rollout, [slice(0, 2), slice(2, 4)])  # [4, T]
    alone = Policy(windowed_teacher_dir).model.eval()
    theirs = completion_logps(alone, rollout.input_ids, rollout.attention_mask, rollout.completion_ids.shape[1])
    torch.testing.assert_close(ours, theirs.logps)


def test_a_sliding_window_teacher_trains_a_student_from_the_first_step(
    tiny_model_dir, windowed_teacher_dir, arith_jsonl, tmp_path
):
    module = make_module(tiny_model_dir, distill={"teacher": windowed_teacher_dir})
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=1)
    assert len(logged(trainer)["train/distill/reverse_kl"]) == 1
