"""NoSignalAlert: no group's rewards differ, so no completion gets a gradient and the run cannot learn. Said loudly
(the cause, a completion beside its expected answer, what to change), and the run stopped after ``patience`` steps.

A completion's advantage is its reward against its group's: a group whose completions all score alike carries no
signal (``types.without_signal``, the rule of ``frac_reward_zero_std`` and of ``filter_groups``), and a step whose
every group is one changes nothing. The causes: a reward that never fires (an exact-match reward on a model that
answers in sentences: every completion 0), one that always fires (every completion at full marks: solved, or a reward
that checks nothing the completions differ in), or one that scores the prompt, not the completion.

Read from the step record (``frac_reward_zero_std`` of the global batch: every rank's groups) or, under
``advantages.filter_groups``, from each generation batch drawn without an update (``DrawnBatch``: the groups with
signal of every rank), so a run whose filter never finds a group stops too, counted in generation batches. Silent
with a teacher (``model.distill``): the teacher trains the student whatever the rewards say.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from lightning_grpo.callbacks.alerts import Alert, Signal
from lightning_grpo.callbacks.samples import prompt_text
from lightning_grpo.types import (
    PromptBatch,
    RewardScores,
    Rollout,
    completion_text,
    drawn_batch,
    step_record,
    without_signal,
)

ANSWER_COLUMNS = ("answer", "solution")  # where a dataset keeps a row's expected answer (ours; TRL's accuracy_reward)
FEWER_ALIKE = "more completions per prompt (double model.num_generations) or a higher model.sampling.temperature (1.0)"
CAUSES = {  # cause -> (what the rewards show, what to change)
    "never": (
        "the reward never fires: every completion scored {value:.4g}",
        "a reward that reads the answer out of free text (model.reward_funcs: "
        "lightning_grpo.rewards.math_verify_reward or lightning_grpo.rewards.numeric_match_reward in place of an exact "
        "match), a format reward that pays partial credit (lightning_grpo.rewards.partial_format_reward), "
        f"{FEWER_ALIKE} so that some completion earns it, or easier prompts",
    ),
    "always": (
        "the reward always fires: every completion scored {value:.4g}",
        "if that is full marks, the task is solved for this data: stop, or train on harder prompts; if not, the reward "
        "pays for what every completion has: call it on a wrong completion, and add one that tells right from wrong",
    ),
    "prompt": (
        "each group's completions scored alike, the groups from {low:.4g} to {high:.4g}: the reward scores the prompt, "
        "not the completion",
        f"check that the reward reads the completion and which dataset columns it reads; then {FEWER_ALIKE}",
    ),
    "unscored": (
        "no reward function scored any completion (each returned None)",
        "check the dataset columns the functions read and the answer format they parse (alerts.unscored names them)",
    ),
}


def cause(scores: RewardScores) -> tuple[str, dict[str, float]]:
    """Why no group has signal: a ``CAUSES`` key and the numbers its text names."""
    total = scores.total  # [N], NaN where no function applied
    scored = total[~total.isnan()]
    if not len(scored):
        return "unscored", {}
    low, high = scored.min().item(), scored.max().item()
    if not without_signal(scored.view(1, -1)).item():  # the batch as one group: its rewards differ across prompts
        return "prompt", {"low": low, "high": high}
    return ("never" if high <= 0 else "always"), {"value": high}


def function_values(scores: RewardScores) -> str:
    """What each function gave the batch: ``exact_match_reward 0 for every completion, length_reward 0.25 to 1``."""
    parts = []
    for name, column in zip(scores.names, scores.per_function.T):
        scored = column[~column.isnan()]
        if not len(scored):
            parts.append(f"{name} None for every completion")
        elif without_signal(scored.view(1, -1)).item():
            parts.append(f"{name} {scored[0].item():.4g} for every completion")
        else:
            parts.append(f"{name} {scored.min().item():.4g} to {scored.max().item():.4g}")
    return ", ".join(parts)


def row_columns(rollout: Rollout, batch: Any, row: int) -> dict[str, Any]:
    """The row's dataset columns: the rollout's own (an engine's) and those of the step's batch row of the same prompt
    (none when an engine that samples ahead trains on an earlier batch's rows)."""
    own = {name: values[row] for name, values in rollout.columns.items()}
    if not isinstance(batch, PromptBatch) or rollout.prompts[row] not in batch.prompts:
        return own
    at = batch.prompts.index(rollout.prompts[row])
    return {name: values[at] for name, values in batch.columns.items()} | own


def expected_answer(columns: dict[str, Any]) -> str:
    """The row's expected answer from its ``answer`` or ``solution`` column, or the columns it has."""
    name = next((n for n in ANSWER_COLUMNS if n in columns), None)
    if name is None:
        held = ", ".join(sorted(columns)) or "none"
        return f"no {' or '.join(ANSWER_COLUMNS)} column to compare it with (the row's columns: {held})"
    return f"expected ({name} column): {short(columns[name])!r}"


def sample(rollout: Rollout, batch: Any) -> str:
    """One completion of the batch beside its prompt and its expected answer."""
    prompt, completion = prompt_text(rollout.prompts[0]), completion_text(rollout.completions[0])
    answer = expected_answer(row_columns(rollout, batch, 0))
    return f"prompt {short(prompt)!r} -> completion {short(completion)!r}, {answer}"


def short(value: Any, limit: int = 160) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class NoSignalAlert(Alert):
    """Stops (by default), warns or raises when no group of a batch has rewards that differ, ``patience`` steps in a
    row: GRPO has nothing to learn from. The message names the cause (the reward never fires, always fires, or scores
    the prompt), shows a completion beside its expected answer and says what to change; ``stop`` saves
    ``checkpoints/last.ckpt`` first. Under ``advantages.filter_groups`` it counts generation batches drawn without
    an update.

    Args:
        patience: steps in a row without a group with signal before firing (generation batches under
            ``filter_groups``).
        action: ``stop`` (``trainer.should_stop`` after saving ``checkpoints/last.ckpt``), ``warn`` or ``raise``.

    Example::

        import lightning as L
        from lightning_grpo.callbacks import NoSignalAlert

        trainer = L.Trainer(callbacks=[NoSignalAlert(patience=10)], max_steps=0, logger=False)
    """

    def __init__(self, patience: int = 20, action: str = "stop") -> None:
        super().__init__(patience=patience, action=action)

    @override
    def observe(self, trainer: L.Trainer, outputs: Any, batch: Any) -> list[Signal] | None:
        record, drawn = step_record(outputs), drawn_batch(outputs)
        if record is not None:
            if record.stats.distill is not None or record.stats.rewards.frac_zero_std < 1.0:
                return []  # a teacher trains the student, or some group of some rank has signal
            return [self.no_signal(record.rollout, record.scores, batch, filtered=False)]
        if drawn is not None:
            return [] if drawn.groups_with_signal else [self.no_signal(drawn.rollout, drawn.scores, batch, True)]
        return None

    def no_signal(self, rollout: Rollout, scores: RewardScores, batch: Any, filtered: bool) -> Signal:
        """The signal, with this rank's rows to diagnose it: the cause, the functions' values, a sample."""
        key, numbers = cause(scores)
        shows, advice = CAUSES[key]
        where = "filter_groups dropped every group of these generation batches, no update made; " if filtered else ""
        diagnosis = (
            "NO LEARNING SIGNAL: no group's completions scored differently, so every advantage is 0 and GRPO learns "
            f"nothing ({where}frac_reward_zero_std 1.0). Cause: {shows.format(**numbers)} ({function_values(scores)}). "
            f"Sample: {sample(rollout, batch)}"
        )
        return Signal("no_learning_signal", 1.0, 1.0, ">=", advice, diagnosis)
