"""A teacher model name or object -> a frozen LM beside the policy, checked to share the policy's vocabulary.

Knows loading and tokenizers; nothing about the distillation objective. The Policy holds the teacher as it holds the
frozen reference: a submodule moved with the policy, sharded with it under FSDP2, out of the optimiser and out of
checkpoints. A teacher whose tokenizer differs from the student's is refused here: its log-probs would score other
tokens (GOLD and NeMo-RL re-tokenise and align; we do not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.model.loading import DTYPES, empty_init_files, load_policy, load_tokenizer, resolve_pretrained
from lightning_grpo.model.padding import position_ids_from_mask
from lightning_grpo.model.served_teacher import ServedTeacher


@dataclass(frozen=True)
class TeacherModel:
    """Where the teacher comes from and how it is loaded (``distill.teacher``, ``teacher_dtype`` ...)."""

    model: str | nn.Module  # Hugging Face name or local path, or a built model
    dtype: str = "float32"
    init_kwargs: dict[str, Any] | None = None
    server: str | None = None  # a vLLM server of it that scores the tokens: its weights are not loaded here


def vocabulary_problem(teacher: PreTrainedTokenizerBase, student: PreTrainedTokenizerBase, name: str) -> str | None:
    """Why the teacher's tokenizer cannot score the student's tokens, or ``None`` when the two map every token
    alike."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if ours == theirs:
        return None
    differ = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
    return (
        f"distill.teacher {name!r} has another tokenizer than the student ({len(theirs)} vs {len(ours)} tokens; "
        f"e.g. {differ}): its log-probs would score other tokens. Cross-tokenizer distillation (GOLD, NeMo-RL's "
        "re-tokenised alignment) is not supported: pick a teacher of the student's family (same tokenizer)"
    )


def load_teacher(
    spec: TeacherModel, tokenizer: PreTrainedTokenizerBase, student: nn.Module
) -> tuple[nn.Module | ServedTeacher, list]:
    """(the frozen teacher, its checkpoint files when it is built on the meta device to be loaded after sharding,
    else ``[]``); with ``spec.server``, the client of its server (connected) in place of the model. Refuses a teacher
    whose vocabulary differs from the student's, saying so."""
    name = spec.model if isinstance(spec.model, str) else type(spec.model).__name__
    if isinstance(spec.model, str):
        problem = vocabulary_problem(load_tokenizer(spec.model), tokenizer, name)
        if problem:
            raise ValueError(problem)
    if spec.server is not None:
        return ServedTeacher(spec.server).connect(name, tokenizer), []
    files = empty_init_files(spec.model, False)
    if files:
        from lightning_grpo.model.materialize import empty_causal_lm

        model = empty_causal_lm(resolve_pretrained(spec.model), DTYPES[spec.dtype], spec.init_kwargs)
    else:
        model = load_policy(spec.model, spec.dtype, False, spec.init_kwargs)
    shared_rows(model, _vocab_rows(student), name)
    model.requires_grad_(False)  # forwards run in eval mode (Policy); Lightning's fit puts modules in train mode
    return model, files


def shared_rows(teacher: nn.Module, student_rows: int, name: str) -> None:
    """Cut the teacher's embedding and output rows to the student's ``student_rows``: the rows both have, which its
    scores are then over (TRL's ``IWOPDTrainer`` resizes a same-tokenizer teacher so). A family pads its embedding
    matrix to its own multiple, past the tokenizer's ids (Qwen2.5-7B: 152,064 rows, 1.5B: 151,936, both for 151,665
    tokens): the tokenizers, compared by ``vocabulary_problem``, say whether the ids mean the same, not the row
    counts. Refuses a teacher with fewer rows: the student could sample an id the teacher has no score for."""
    rows = _vocab_rows(teacher)
    if rows < student_rows:
        raise ValueError(
            f"distill.teacher {name!r} has {rows} output rows and the student (model) {student_rows}: the student "
            f"can sample ids {rows}..{student_rows - 1}, which the teacher has no score for. Pick a teacher with at "
            f"least the student's rows, or save this one with its embeddings padded to them "
            f"(model.resize_token_embeddings({student_rows}))"
        )
    if rows > student_rows:  # on the meta device too: the weights loaded later are read row by row
        teacher.resize_token_embeddings(student_rows, mean_resizing=False)


def _vocab_rows(model: nn.Module) -> int:
    return model.get_output_embeddings().weight.shape[0]


def completion_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, completion_length: int) -> Tensor:
    """[n, T, V] the logits that predict each of the last ``completion_length`` tokens (fp32; with gradient when
    enabled). The whole vocabulary at every completion position: for GKD, whose divergence needs it."""
    positions = position_ids_from_mask(attention_mask)  # [n, P+T]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    return out.logits[:, -completion_length - 1 : -1].float()  # [n, T, V]


@torch.no_grad()
def frozen_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, completion_length: int) -> Tensor:
    """``completion_logits`` of a frozen model, in eval mode (no dropout), without gradient."""
    was_training = model.training
    model.eval()
    try:
        return completion_logits(model, input_ids, attention_mask, completion_length)
    finally:
        model.train(was_training)
