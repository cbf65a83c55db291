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
from tests.distill.test_targets import rollout_of


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


@pytest.fixture(scope="module")
def padded_teacher_dir(tmp_path_factory) -> str:
    """A teacher of the student's tokenizer whose embedding matrix is padded 64 rows past the student's (as
    Qwen2.5-7B's 152,064 rows beside 1.5B's 151,936), the padding rows as random as the rest: they hold mass."""
    tokenizer = build_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=1, vocab_size=len(tokenizer) + 64)
    model.model.norm.weight.data *= 8
    return saved(tmp_path_factory.mktemp("padded-teacher"), model)


def shared_row_logps(teacher_dir: str, rollout, rows: int) -> torch.Tensor:
    """[N, T] the teacher's log-probs of the completion tokens under its softmax over its first ``rows`` rows."""
    teacher = Policy(teacher_dir).model.eval()
    width = rollout.completion_ids.shape[1]
    positions = (rollout.attention_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = teacher(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask, position_ids=positions)
    logps = logits.logits[:, -width - 1 : -1, :rows].float().log_softmax(-1)  # [N, T, rows]
    return logps.gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1) * rollout.completion_mask


def test_a_teacher_with_more_embedding_rows_is_scored_over_the_rows_both_have(tiny_model_dir, padded_teacher_dir):
    # before: refused as "another tokenizer" (its output vocabulary 64 rows larger); the tokenizers are the same
    torch.manual_seed(0)
    policy = Policy(tiny_model_dir, teacher=TeacherModel(padded_teacher_dir))
    rows = policy.model.get_output_embeddings().weight.shape[0]
    assert policy.teacher.get_output_embeddings().weight.shape[0] == rows == len(policy.tokenizer)
    rollout = rollout_of(policy, n=4, width=6)
    ours = policy.teacher_logps(rollout, [slice(None)])  # [4, T]
    torch.testing.assert_close(ours, shared_row_logps(padded_teacher_dir, rollout, rows))
    student, teacher = policy.distill_logits(rollout, slice(None))  # gkd compares the same rows
    assert student.shape == teacher.shape == (4, rollout.completion_ids.shape[1], rows)


def test_a_teacher_with_more_rows_built_on_the_meta_device_loads_the_rows_both_have(tiny_model_dir, padded_teacher_dir):
    with torch.device("meta"):  # as Lightning's init_module(empty_init=True) builds it under FSDP2
        policy = Policy(tiny_model_dir, teacher=TeacherModel(padded_teacher_dir))
    policy.materialize()
    whole = Policy(padded_teacher_dir).model
    rows = len(policy.tokenizer)
    torch.testing.assert_close(policy.teacher.get_output_embeddings().weight, whole.lm_head.weight[:rows])
    torch.testing.assert_close(policy.teacher.get_input_embeddings().weight, whole.model.embed_tokens.weight[:rows])


def test_a_teacher_with_fewer_embedding_rows_than_the_student_is_refused_by_name(tiny_model_dir, tmp_path):
    tokenizer = build_tokenizer()
    student = saved(tmp_path / "student", build_tiny_qwen2(tokenizer, vocab_size=len(tokenizer) + 64))
    rows = len(tokenizer)
    message = (
        f"distill.teacher '{tiny_model_dir}' has {rows} output rows and the student .model. {rows + 64}: the student "
        f"can sample ids {rows}..{rows + 63}, which the teacher has no score for"
    )
    with pytest.raises(ValueError, match=message):
        Policy(student, teacher=TeacherModel(tiny_model_dir))
