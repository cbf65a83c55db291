"""A teacher on a server (model/served_teacher.py): asked which model it serves and how it tokenizes before any
step, against a real aiohttp server of vLLM's endpoints (``teacher_server.py``); real vLLM in
tests/engines/vllm/test_real_distill.py."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.served_teacher import TeacherServerError
from lightning_grpo.model.teacher import TeacherModel
from tests.distill.test_targets import rollout_of, teacher_dir  # noqa: F401  (the fixture)
from tests.model.teacher_server import serving


@pytest.fixture(scope="module")
def other_tokenizer_dir(tmp_path_factory) -> str:
    """Another model with another tokenizer, which splits text otherwise: "distillation" is one token there."""
    path = tmp_path_factory.mktemp("other-tokenizer")
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(["distillation"])
    build_tiny_qwen2(tokenizer, seed=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_a_server_of_another_model_is_refused_at_setup_naming_both(
    tiny_model_dir,
    teacher_dir,  # noqa: F811
    other_tokenizer_dir,
):
    # before: accepted (the server was never asked which model it serves), its log-probs trained the student
    with serving(other_tokenizer_dir) as url:
        message = (
            rf"distill.teacher_server '{url}' serves \['{other_tokenizer_dir}'\], not distill.teacher "
            rf"'{teacher_dir}': .* Serve distill.teacher there"
        )
        with pytest.raises(TeacherServerError, match=message):
            Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir, server=url))
    torch.manual_seed(0)
    with serving(teacher_dir, served_name="teacher") as url:  # vllm serve DIR --served-model-name teacher
        served = Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir, server=url))
        assert served.served_teacher.model == "teacher"  # the name its requests are answered under
        here = Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir))
        rollout = rollout_of(here)
        theirs = served.teacher_logps(rollout, [slice(None)])
    torch.testing.assert_close(theirs, here.teacher_logps(rollout, [slice(None)]) * rollout.completion_mask)


def test_a_server_of_the_teacher_s_name_with_another_tokenizer_is_refused_at_setup(
    tiny_model_dir,
    teacher_dir,  # noqa: F811
    other_tokenizer_dir,
):
    # `vllm serve TEACHER --tokenizer OTHER`: the name is the teacher's, the tokens are not
    with serving(teacher_dir, tokenizer_dir=other_tokenizer_dir) as url:
        message = (
            rf"distill.teacher_server '{url}' serves '{teacher_dir}' with another tokenizer than distill.teacher "
            rf"'{teacher_dir}': a probe text is \d+ tokens there and \d+ here"
        )
        with pytest.raises(TeacherServerError, match=message):
            Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir, server=url))
