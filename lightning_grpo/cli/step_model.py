"""Stage times measured at two sizes -> the predicted time of a GRPO step at N trainer ranks and M inference servers,
and where it goes (generation, its long-tail floor, log-probs, update, weight sync, the trainer's idle share). A
model for planning a run and for judging whether a slow step is normal; not a simulator. Knows no code of ours.

Each stage is Amdahl's: a part that splits over its workers and a part that does not (``Stage``), fitted from the
stage's time at two sizes (``Stage.fit``). Generation has a floor besides: the longest completion decodes one token
after another at the rate of a single sequence, however many servers there are (the long tail: verl's generation
stays at 150-180 s from 64 GPUs on, ``VERL_7B``). Synchronous, the stages add up and the trainer idles while the
servers generate. Overlapped (k steps off: ``AsyncRollouts``, verl's fully async with partial rollouts, whose
unfinished completions carry over, so the tail is hidden) the step is the longer of generation and training, plus
the sync.

    python -m lightning_grpo.cli.step_model            # verl's published 7B table beside the model's predictions
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """Seconds of one stage of a step on ``workers`` workers: ``parallel / workers + serial``."""

    parallel: float  # seconds on one worker of the work that splits over workers
    serial: float = 0.0  # seconds no number of workers removes (fixed costs, the slowest shard)

    def at(self, workers: int) -> float:
        return self.parallel / workers + self.serial

    @classmethod
    def fit(cls, first: tuple[int, float], second: tuple[int, float]) -> Stage:
        """The stage through two measurements ``(workers, seconds)``.

        >>> Stage.fit((64, 133.41), (128, 113.81))  # verl's update_actor, Qwen2.5-Math-7B on H20
        Stage(parallel=2508.8, serial=94.21)
        """
        (n1, t1), (n2, t2) = first, second
        parallel = (t1 - t2) / (1 / n1 - 1 / n2)
        return cls(round(parallel, 6), round(t1 - parallel / n1, 6))


@dataclass(frozen=True)
class Split:
    """A predicted step: seconds of each stage and of the whole step, and the share the trainer waits."""

    generation: float
    logprobs: float
    update: float
    sync: float
    step: float
    trainer_idle: float  # share of the step the trainer ranks wait for generation

    def row(self) -> str:
        return (
            f"{self.step:7.1f} s: generation {self.generation:6.1f}, log-probs {self.logprobs:6.1f}, "
            f"update {self.update:6.1f}, sync {self.sync:5.1f}, trainer idle {self.trainer_idle:4.0%}"
        )


@dataclass(frozen=True)
class StepModel:
    """A step's stages, fitted from measured runs; ``synchronous`` and ``overlapped`` predict a step."""

    generation: Stage  # decoding every completion of the step over the servers (the bulk)
    tail: float  # seconds the longest completion takes decoded alone: generation's floor when synchronous
    logprobs: Stage  # the old / reference log-prob forwards over the trainer ranks (0 when the sampler gives them)
    update: Stage  # forward, backward and optimiser steps over the trainer ranks
    sync: float = 0.0  # seconds to publish the weights to the servers, per update

    def synchronous(self, ranks: int, servers: int) -> Split:
        generation = max(self.generation.at(servers), self.tail)
        logprobs, update = self.logprobs.at(ranks), self.update.at(ranks)
        step = generation + logprobs + update + self.sync
        return Split(generation, logprobs, update, self.sync, step, generation / step)

    def overlapped(self, ranks: int, servers: int) -> Split:
        """k >= 1 steps off: the servers sample the next batches while the ranks train; unfinished completions
        carry over (partial rollouts), so the tail does not hold a step."""
        generation, logprobs, update = self.generation.at(servers), self.logprobs.at(ranks), self.update.at(ranks)
        training = logprobs + update
        step = max(generation, training) + self.sync
        return Split(generation, logprobs, update, self.sync, step, max(generation - training, 0.0) / step)


# verl, docs/advance/fully_async.md: Qwen2.5-Math-7B on H20, DAPO, 28K-token responses, 512 prompts x 16 a step.
# Colocated synchronous (every GPU trains and generates): GPUs -> (step, gen, old_log_prob, update_actor) seconds.
VERL_7B_SYNC = {
    32: (790.10, 357.41, 107.71, 313.81),
    64: (365.28, 150.72, 70.26, 133.41),
    128: (356.30, 177.85, 53.92, 113.81),
}
# Fully async (partial rollouts, staleness 0.5), trainer:rollout GPUs -> step seconds (log-probs from the rollout).
VERL_7B_ASYNC = {(16, 16): 294.77, (32, 32): 189.26, (64, 64): 150.63}


def verl_7b() -> StepModel:
    """The model fitted to verl's colocated runs at 64 and 128 GPUs (the scale it is for): the log-prob and update
    stages through both, generation's bulk from the 32-GPU run (the only one not at its floor), its floor the mean
    generation at 64 and 128, the sync the mean of what the stages leave of a step."""
    (s64, g64, l64, u64), (s128, g128, l128, u128) = VERL_7B_SYNC[64], VERL_7B_SYNC[128]
    return StepModel(
        generation=Stage(VERL_7B_SYNC[32][1] * 32),
        tail=(g64 + g128) / 2,
        logprobs=Stage.fit((64, l64), (128, l128)),
        update=Stage.fit((64, u64), (128, u128)),
        sync=((s64 - g64 - l64 - u64) + (s128 - g128 - l128 - u128)) / 2,
    )


def verl_rows(model: StepModel) -> list[tuple[str, float, float]]:
    """(run, predicted step, measured step) for every row of verl's table. The fully async runs take their
    log-probs from the rollout (no log-prob stage), and their rollout GPUs' throughput is not published: the
    prediction is the trainer's side (update + sync), which hides the generation only when the servers keep up."""
    rows = [(f"sync, {n} GPUs", model.synchronous(n, n).step, measured[0]) for n, measured in VERL_7B_SYNC.items()]
    for (trainers, rollout), measured in VERL_7B_ASYNC.items():
        predicted = model.update.at(trainers) + model.sync
        rows.append((f"fully async, {trainers}:{rollout}", predicted, measured))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.parse_args(argv)
    model = verl_7b()
    print(f"fitted to verl's 7B runs: {model}")
    print("| run | predicted step s | measured step s | error |\n|---|---|---|---|")
    for run, predicted, measured in verl_rows(model):
        print(f"| {run} | {predicted:.1f} | {measured:.1f} | {predicted / measured - 1:+.0%} |")
    for gpus in (256, 512):
        print(f"predicted synchronous at {gpus} GPUs: {model.synchronous(gpus, gpus).row()}")
        half = gpus // 2
        print(f"predicted overlapped at {half}:{half}: {model.overlapped(half, half).row()}")


if __name__ == "__main__":
    main()
