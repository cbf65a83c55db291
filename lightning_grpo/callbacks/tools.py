"""ToolUseAlert: warns when an engine with tools runs many steps and the tools are never called, or every call
fails. Reads the engine's ``tools/call_frequency`` and ``tools/failure_frequency`` from the step record; a run
without a tool engine has neither, and the alert stays silent.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from lightning_grpo.callbacks.alerts import Alert, Signal
from lightning_grpo.types import StepRecord

NEVER_CALLED = (
    "check that the model can call your tools at all: a tiny demo model whose tokenizer spells one tool's call "
    "(lightning-grpo/tiny-qwen2-calc: mul only) cannot call another; warm-start one for your tools with "
    "`python -m lightning_grpo.demo.anytool my_module.my_tool --out my-model`; check that the chat template shows "
    "the tools (samples.jsonl shows what the model writes); a higher sampling.temperature explores more"
)
ALL_FAIL = (
    "read the calls in samples.jsonl (each call and each reply, named): a name the tools do not have, arguments "
    "of the wrong names or types, or JSON the parser cannot read; tools/<name>/failure_frequency says which tool"
)


class ToolUseAlert(Alert):
    """Warns when the configured tools are never called, or every call fails, for ``patience`` steps in a row.

    Args:
        patience: steps in a row a signal lasts before firing (training steps).
        action: ``warn``, ``stop`` or ``raise`` (see ``Alert``).

    Example::

        trainer = L.Trainer(callbacks=[ToolUseAlert(patience=10)])
    """

    def __init__(self, patience: int = 10, action: str = "warn") -> None:
        super().__init__(patience, action)

    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        metrics: dict[str, Any] = record.rollout.metrics
        calls, failures = metrics.get("tools/call_frequency"), metrics.get("tools/failure_frequency")
        if calls is None:
            return []
        if calls == 0:
            why = "the model has not written one tool call"
            return [Signal("tools/call_frequency", 0.0, 0.0, "=", NEVER_CALLED, why)]
        if failures is not None and failures >= 1.0:
            failing = sorted(k.split("/")[1] for k, v in metrics.items() if k.endswith("/failure_frequency") and v >= 1)
            why = f"every tool call failed ({', '.join(n for n in failing if n != 'failure_frequency')})"
            return [Signal("tools/failure_frequency", failures, 1.0, "=", ALL_FAIL, why)]
        return []
