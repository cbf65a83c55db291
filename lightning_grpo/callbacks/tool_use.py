"""ToolUseAlert: warns when an engine with tools runs many steps and the tools are never called, the calls made
cannot be read (malformed or cut off), the model's turns look like calls that its family's reader cannot read, or
every call fails. Reads the engine's ``tools/call_frequency``, ``tools/malformed_frequency``,
``tools/unparsed_frequency`` and ``tools/failure_frequency`` from the step record; a run without a tool engine has
none of them, and the alert stays silent.
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
MALFORMED = (
    "read the calls in samples.jsonl: a call the parser cannot read is JSON the model did not finish or spelled "
    "wrong (a model warm-started by `python -m lightning_grpo.demo.anytool` prints the share of calls it writes "
    "right: warm-start longer with --steps, and write the prompts' arguments as anytool.user_message does); a call "
    "cut off mid-turn needs a larger sampling.max_completion_length (see episodes/truncated_by_tokens)"
)
UNPARSED = (
    "read the turns in samples.jsonl: the model writes what looks like a tool call (in some family's format) that "
    "the reader of its chat template cannot read. A checkpoint of one family with another's chat template writes "
    "its own format (keep the checkpoint's template: references/tool_families.md); a fine-tuned call format needs "
    "parser: or tokenizer.response_template; a model that has not learned the format yet needs warm-starting"
)
ALL_FAIL = (
    "read the calls in samples.jsonl (each call and each reply, named): a name the tools do not have, arguments "
    "of the wrong names or types, or JSON the parser cannot read; tools/<name>/failure_frequency says which tool"
)


class ToolUseAlert(Alert):
    """Warns when the configured tools are never called, when at least ``max_malformed`` of the calls made cannot
    be read, when at least ``max_unparsed`` of the model's turns look like a call but read as none, or when every
    call fails, for ``patience`` steps in a row.

    Args:
        patience: steps in a row a signal lasts before firing (training steps).
        action: ``warn``, ``stop`` or ``raise`` (see ``Alert``).
        max_malformed: the share of calls that could not be read (``tools/malformed_frequency``: JSON the parser
            cannot read, or a call the token budget cut off) at or above which the alert counts a step; in (0, 1].
        max_unparsed: the share of model turns that look like a tool call in any family's format but yield none
            (``tools/unparsed_frequency``) at or above which the alert counts a step; in (0, 1].

    Example::

        trainer = L.Trainer(callbacks=[ToolUseAlert(patience=10, max_malformed=0.5, max_unparsed=0.1)])
    """

    def __init__(
        self, patience: int = 10, action: str = "warn", max_malformed: float = 0.5, max_unparsed: float = 0.1
    ) -> None:
        super().__init__(patience, action)
        if not 0 < max_malformed <= 1:
            raise ValueError(f"max_malformed must be a share of calls in (0, 1], got {max_malformed!r}")
        if not 0 < max_unparsed <= 1:
            raise ValueError(f"max_unparsed must be a share of model turns in (0, 1], got {max_unparsed!r}")
        self.max_malformed, self.max_unparsed = max_malformed, max_unparsed

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "max_malformed": self.max_malformed, "max_unparsed": self.max_unparsed}

    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        metrics: dict[str, Any] = record.rollout.metrics
        calls, failures = metrics.get("tools/call_frequency"), metrics.get("tools/failure_frequency")
        if calls is None:
            return []
        unparsed = self._unparsed(metrics)
        if calls == 0:
            why = "the model has not written one tool call"
            return [Signal("tools/call_frequency", 0.0, 0.0, "=", NEVER_CALLED, why), *unparsed]
        return self._malformed(metrics, calls) + unparsed + _all_fail(metrics, failures)

    def _unparsed(self, metrics: dict[str, Any]) -> list[Signal]:
        unparsed = metrics.get("tools/unparsed_frequency")
        if unparsed is None or unparsed < self.max_unparsed:
            return []
        why = f"{unparsed:.0%} of the model's turns look like a tool call but none could be read"
        return [Signal("tools/unparsed_frequency", unparsed, self.max_unparsed, ">=", UNPARSED, why)]

    def _malformed(self, metrics: dict[str, Any], calls: float) -> list[Signal]:
        malformed = metrics.get("tools/malformed_frequency")
        if malformed is None or malformed < self.max_malformed:
            return []
        why = f"{malformed:.0%} of the {calls:.2g} tool calls per episode could not be read (malformed or cut off)"
        return [Signal("tools/malformed_frequency", malformed, self.max_malformed, ">=", MALFORMED, why)]


def _all_fail(metrics: dict[str, Any], failures: float | None) -> list[Signal]:
    if failures is None or failures < 1.0:
        return []
    failing = sorted(k.split("/")[1] for k, v in metrics.items() if k.endswith("/failure_frequency") and v >= 1)
    why = f"every tool call failed ({', '.join(n for n in failing if n != 'failure_frequency')})"
    return [Signal("tools/failure_frequency", failures, 1.0, "=", ALL_FAIL, why)]
