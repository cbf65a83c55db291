"""A vLLM server of the teacher -> its log-probs of the student's sampled tokens (``distill.teacher_server``).

The teacher of on-policy distillation need not sit beside the policy: a ``vllm serve TEACHER`` scores each row's
prompt and completion in one prefill (``/v1/completions`` with ``prompt_logprobs: 0``, the log-prob of every given
token; one token generated, discarded). vLLM's prompt log-probs are the model's own ``log_softmax(logits)``: at
temperature 1 and before any sampling filter (its ``logprobs_mode`` does not touch them), so a served teacher
scores at temperature 1 only, and the reverse-KL objective only (GKD needs the whole vocabulary at each position).
Every rank sends its own rows. Knows HTTP and vLLM's completion format; nothing about the objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_grpo.types import Rollout


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
    """The served model's name, read from ``/v1/models`` by ``connect``."""

    def connect(self) -> ServedTeacher:
        """Reads the served model's name; raises naming the URL when the server does not answer."""
        import requests  # here: importing it sets warning filters, which importing the package must not

        try:
            answer = requests.get(f"{self.url.rstrip('/')}/v1/models", timeout=30)
            answer.raise_for_status()
            self.model = answer.json()["data"][0]["id"]
        except (requests.RequestException, KeyError, IndexError, ValueError) as err:
            raise TeacherServerError(
                f"distill.teacher_server {self.url!r} does not answer /v1/models as a vLLM server does ({err}): "
                "start it with `vllm serve TEACHER` (references/distillation.md) or leave teacher_server unset to "
                "load the teacher here"
            ) from err
        return self

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
