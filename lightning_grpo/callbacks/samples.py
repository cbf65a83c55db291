"""CompletionSampleLogger: what the model actually writes, with its rewards, every N steps.

Rows (step, prompt, completion, reward per function, total, advantage) go to ``samples.jsonl`` in the run
directory; a multi-turn episode's completion is the whole episode, one line per message (its tool calls and the
tool replies included), and as a table to the loggers that show one: TensorBoard (text), W&B (``log_table``) and CSV
(``samples.csv`` beside ``metrics.csv``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch import Tensor
from typing_extensions import override

from lightning_grpo.run import run_dir
from lightning_grpo.types import StepRecord, completion_text, step_record


def prompt_text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def episode_text(completion: Any) -> str:
    """The completion's text; an episode (several messages, or tool calls) as one line per message.

    >>> call = {"function": {"name": "mul", "arguments": {"a": 37, "b": 6}}}
    >>> reply = {"role": "tool", "name": "mul", "content": "222"}
    >>> print(episode_text([{"role": "assistant", "content": "", "tool_calls": [call]}, reply,
    ...                     {"role": "assistant", "content": "222"}]))
    assistant: mul({"a": 37, "b": 6})
    tool mul: 222
    assistant: 222
    """
    if not isinstance(completion, list) or (len(completion) == 1 and not completion[0].get("tool_calls")):
        return completion_text(completion)
    return "\n".join(_message_line(m) for m in completion)


def _call_text(call: dict[str, Any]) -> str:
    """``name({"arg": value})``; a call the parser could not read, as ``<unreadable call: why>``.

    >>> _call_text({"function": {"name": "unknown", "arguments": {}}, "error": "not valid JSON: {bad"})
    '<unreadable call: not valid JSON: {bad>'
    """
    if call.get("error"):
        return f"<unreadable call: {call['error']}>"
    f = call["function"]
    arguments = f["arguments"] if isinstance(f["arguments"], str) else json.dumps(f["arguments"])
    return f"{f['name']}({arguments})"


def _message_line(message: dict[str, Any]) -> str:
    calls = [_call_text(c) for c in message.get("tool_calls") or []]
    role = f"tool {message['name']}" if message.get("role") == "tool" and message.get("name") else message.get("role")
    return f"{role}: " + " ".join(filter(None, [completion_text([message]), *calls]))


class CompletionSampleLogger(L.Callback):
    """Writes sample completions with their rewards.

    Args:
        every_n_steps: log on steps that are multiples of this (and the first step).
        max_rows: completions written each time (the first groups of the batch, whole groups first).
    """

    def __init__(self, every_n_steps: int = 50, max_rows: int = 8) -> None:
        if every_n_steps < 1 or max_rows < 1:
            raise ValueError(f"every_n_steps and max_rows must be >= 1, got {every_n_steps} and {max_rows}")
        self.every_n_steps, self.max_rows = every_n_steps, max_rows

    def rows(self, step: int, record: StepRecord) -> list[dict[str, Any]]:
        rollout, scores, advantages = record.rollout, record.scores, record.advantages
        out = []
        for i in range(min(self.max_rows, len(rollout))):
            row = {
                "step": step,
                "prompt": prompt_text(rollout.prompts[i]),
                "completion": episode_text(rollout.completions[i]),
            }
            row |= {name: _num(scores.per_function[i, j].item()) for j, name in enumerate(scores.names)}
            row |= {"reward": _num(scores.total[i].item()), "advantage": round(_first_token(advantages[i]), 4)}
            out.append(row)
        return out

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, record = trainer.global_step, step_record(outputs)
        if record is None or not trainer.is_global_zero or (step % self.every_n_steps and step != 1):
            return
        rows = self.rows(step, record)
        directory = run_dir(trainer)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "samples.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        for logger in trainer.loggers:
            self._to_logger(logger, step, rows)

    @staticmethod
    def _to_logger(logger: Any, step: int, rows: list[dict[str, Any]]) -> None:
        if isinstance(logger, TensorBoardLogger):
            header = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n"
            body = "".join(
                "| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ") for v in r.values()) + " |\n"
                for r in rows
            )
            logger.experiment.add_text("samples", header + body, global_step=step)
        elif isinstance(logger, CSVLogger):
            path = Path(logger.log_dir) / "samples.csv"
            new = not path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                if new:
                    writer.writeheader()
                writer.writerows(rows)
        elif type(logger).__name__ == "WandbLogger":
            logger.log_table(key="samples", columns=list(rows[0]), data=[list(r.values()) for r in rows], step=step)


def _num(x: float) -> float | None:
    return None if x != x else round(x, 4)  # NaN (not applicable) -> null in JSON


def _first_token(advantage: Tensor) -> float:
    """A completion's advantage: its own, or its first token's for token-level estimators (REINFORCE++)."""
    return advantage.flatten()[0].item()
