"""A vLLM server of the teacher -> its log-probs of the student's sampled tokens (``distill.teacher_server``).

The teacher of on-policy distillation need not sit beside the policy: a ``vllm serve TEACHER`` scores each row's
prompt and completion in one prefill (``/v1/completions`` with ``prompt_logprobs: 0``, the log-prob of every given
token; one token generated, discarded). vLLM's prompt log-probs are the model's own ``log_softmax(logits)``: at
temperature 1 and before any sampling filter (its ``logprobs_mode`` does not touch them), so a served teacher
scores at temperature 1 only, and the reverse-KL objective only (GKD needs the whole vocabulary at each position).
Every rank sends its own rows. Before any step the server is asked which model it serves (``/v1/models``) and how it
tokenizes (``/tokenize``): another model's log-probs would train the student towards it. Knows HTTP and vLLM's
completion format; nothing about the objective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_grpo.types import Rollout, parting


class TeacherServerError(RuntimeError):
    """The teacher's server could not be reached or answered something other than the log-probs asked for."""


@dataclass
class ServedTeacher:
    """The client of one ``vllm serve`` of the teacher."""

    url: str
    """The server's base URL (``http://host:8000``), without ``/v1``."""
    timeout: float = 300.0
    """Seconds one scoring request may take."""
    rows_per_request: int = 64
    """Rows sent in one request: bounds a request's size and time."""
    model: str = ""
    """The name the teacher is served under, read from ``/v1/models`` by ``connect``."""

    def connect(self, teacher: str, tokenizer: PreTrainedTokenizerBase) -> ServedTeacher:
        """Asks the server which model it serves and how it tokenizes, before any step: refuses, naming both
        models, a server of another model than ``teacher`` (``distill.teacher``, whose tokenizer was checked
        against the student's) or one whose tokenizer splits a probe text otherwise than ``tokenizer``; raises
        naming the URL when the server does not answer."""
        cards = self._get("/v1/models").get("data") or []
        card = next((c for c in cards if same_model(teacher, c)), None)
        if card is None:
            served = [c.get("root") or c["id"] for c in cards]
            raise TeacherServerError(
                f"distill.teacher_server {self.url!r} serves {served}, not distill.teacher {teacher!r}: its log-probs "
                "would train the student towards another model. Serve distill.teacher there (`vllm serve "
                f"{teacher}`), or set distill.teacher to the served model"
            )
        self.model = card["id"]  # the name requests are served under (``--served-model-name``, else the path)
        probe = PROBE + "".join(tokenizer.all_special_tokens)
        body = {"model": self.model, "prompt": probe, "add_special_tokens": False}
        theirs, ours = self._post("/tokenize", body)["tokens"], tokenizer(probe, add_special_tokens=False).input_ids
        if theirs != ours:
            first = parting(theirs, ours)
            raise TeacherServerError(
                f"distill.teacher_server {self.url!r} serves {card.get('root') or self.model!r} with another tokenizer "
                f"than distill.teacher {teacher!r}: a probe text is {len(theirs)} tokens there and {len(ours)} here, "
                f"from token {first} on {theirs[first : first + 3]} vs {ours[first : first + 3]}. Its log-probs would "
                "score other tokens: serve the teacher with its own tokenizer (`vllm serve "
                f"{teacher}`, no --tokenizer)"
            )
        return self

    def _get(self, path: str) -> dict:
        return self._ask("get", path, None)

    def _post(self, path: str, body: dict) -> dict:
        return self._ask("post", path, body)

    def _ask(self, method: str, path: str, body: dict | None) -> dict:
        import requests  # here: importing it sets warning filters, which importing the package must not

        try:
            answer = requests.request(method, f"{self.url.rstrip('/')}{path}", json=body, timeout=30)
            answer.raise_for_status()
            return answer.json()
        except (requests.RequestException, ValueError) as err:
            raise TeacherServerError(
                f"distill.teacher_server {self.url!r} does not answer {path} as a vLLM server does ({err}): start "
                "it with `vllm serve TEACHER` (references/distillation.md) or leave teacher_server unset to load the "
                "teacher here"
            ) from err

    def logps(self, rollout: Rollout) -> Tensor:
        """[N, T] the teacher's log-probs of each row's completion tokens (0 past a row's last token)."""
        rows = list(zip(rollout.host.prompt_ids, rollout.host.completion_ids))  # (prompt, completion) tokens
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
        for start in range(0, len(rows), self.rows_per_request):
            chunk = rows[start : start + self.rows_per_request]
            for offset, values in enumerate(self._score([p + c for p, c in chunk], [len(c) for _, c in chunk])):
                out[start + offset, : len(values)] = torch.tensor(values)
        return out.to(rollout.completion_ids.device)

    def _score(self, sequences: list[list[int]], completion_lengths: list[int]) -> list[list[float]]:
        import requests

        body = {"model": self.model, "prompt": sequences, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
        try:
            answer = requests.post(f"{self.url.rstrip('/')}/v1/completions", json=body, timeout=self.timeout)
        except requests.RequestException as err:
            raise TeacherServerError(f"distill.teacher_server {self.url!r}: a scoring request failed ({err})") from err
        if answer.status_code != 200:
            raise TeacherServerError(
                f"distill.teacher_server {self.url!r} answered {answer.status_code} to a scoring request: "
                f"{answer.text[:300]}"
            )
        choices = sorted(answer.json()["choices"], key=lambda c: c["index"])
        return [
            _completion_logps(choice["prompt_logprobs"], tokens, n)
            for choice, tokens, n in zip(choices, sequences, completion_lengths, strict=True)
        ]


PROBE = "On-policy distillation: 12 + 34 = 46, ¿qué? 日本語 ✓ \n\t  def f(x):\n    return x ** 2  # "
"""Text the server's tokenizer must split as the student's: words, digits, whitespace runs, code, non-Latin
scripts; the tokenizer's special tokens are appended to it."""


def same_model(teacher: str, card: dict) -> bool:
    """Whether a ``/v1/models`` entry (``id``: the served name; ``root``: the model vLLM loaded) is ``teacher``: the
    same name or path (a local path compared resolved), or the same last path component, as a local copy of the
    served model is (``/models/Qwen2.5-7B-Instruct`` for ``Qwen/Qwen2.5-7B-Instruct``).

    >>> same_model("Qwen/Qwen2.5-7B-Instruct", {"id": "teacher", "root": "Qwen/Qwen2.5-7B-Instruct"})
    True
    >>> same_model("/models/Qwen2.5-7B-Instruct/", {"id": "Qwen/Qwen2.5-7B-Instruct"})
    True
    >>> same_model("Qwen/Qwen2.5-7B-Instruct", {"id": "Qwen/Qwen2.5-1.5B-Instruct"})
    False
    """
    names = {n for n in (card.get("id"), card.get("root")) if n}
    ours = teacher.rstrip("/")
    if ours in {n.rstrip("/") for n in names} or os.path.realpath(teacher) in {os.path.realpath(n) for n in names}:
        return True
    return PurePosixPath(ours).name in {PurePosixPath(n.rstrip("/")).name for n in names}


def _completion_logps(prompt_logprobs: list[dict | None], tokens: list[int], n: int) -> list[float]:
    """The log-probs of the last ``n`` of ``tokens`` from vLLM's ``prompt_logprobs`` (one entry per token, the first
    ``None``; each a {token id: {"logprob": ...}} holding at least the given token)."""
    if n == 0:
        return []
    values = []
    for position in range(len(tokens) - n, len(tokens)):
        entry = prompt_logprobs[position] or {}
        scored = entry.get(str(tokens[position]))
        if scored is None:
            raise TeacherServerError(
                f"the teacher's server returned no log-prob for token {tokens[position]} at position {position}: "
                "is it serving a model with the student's tokenizer?"
            )
        values.append(float(scored["logprob"]))
    return values
