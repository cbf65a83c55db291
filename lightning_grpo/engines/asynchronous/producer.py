"""The generator process of asynchronous GRPO: prompt requests in, sampled Rollouts (with the policy version
that sampled them) out, scored when it was given the run's rewards. Knows an inner rollout engine, a copy of the
policy and a ``RewardSet``; nothing about losses.

Weights travel through a ``WeightsMailbox``: one copy of the policy's tensors in shared memory
(``share_memory_()``), written by the trainer after each update under a lock, read by the producer into its own
private copy before each request. The private copy lets the trainer publish while the producer generates; the
mailbox holds only the newest version, so the trainer publishes version ``v + 1`` only once the producer has taken
the weights of every request submitted under ``v`` (``taken``): each request is sampled with exactly the weights
current when it was submitted, whatever the timing, which makes an asynchronous run reproducible.
"""

from __future__ import annotations

import copy
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_grpo.engines.base import RolloutEngine
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy
from lightning_grpo.rewards.scoring import RewardSet
from lightning_grpo.types import PromptBatch, RewardScores, Rollout


@dataclass
class Request:
    """One training step's prompts, to be sampled with the weights of ``version``."""

    batch: PromptBatch
    version: int  # the trainer's version when submitted: updates published so far
    rng_state: Tensor  # the trainer's CPU RNG state at submission (the step's seeded state)
    salt: int  # 0: sample from ``rng_state`` as the synchronous path would; else mixed in to vary the seed
    sampling_logps: bool  # also compute the sampler's log-probs of the completions (for the correction)
    trainer_state: Any = None  # what the reward functions receive, when the producer scores (at submission)
    serving: Any = None  # the trainer's engine's ``serving()`` at submission (servers: the live ones, the model)


@dataclass
class Produced:
    """A Request's answer."""

    rollout: Rollout
    batch: PromptBatch
    version: int  # the weights that sampled it
    rng_state: Tensor  # the RNG state after sampling (k = 0 hands it back, so the trainer continues from it)
    busy_s: float  # seconds generating (and scoring) this request
    idle_s: float  # seconds waiting for it (the producer had nothing to do)
    scores: RewardScores | None = None  # when the producer scores
    scoring_s: float = 0.0  # seconds of busy_s spent scoring
    error: str | None = None  # a reward function's failure, raised again in the trainer with the words it has there
    trace: str | None = None  # its traceback here: the raised error's cause (LIGHTNING_GRPO_DEBUG=1 shows it)


class WeightsMailbox:
    """The newest published weights in shared memory, their version, and how many requests took weights."""

    def __init__(self, model: nn.Module, context: Any, version: int = 0, taken: int = 0) -> None:
        self.staging = copy.deepcopy(model).cpu().share_memory()
        self.moving = trained_names(model)  # what publish and take copy: a frozen weight is the same in every version
        self.version = context.Value("q", version, lock=False)
        self.taken = context.Value("q", taken, lock=False)  # requests whose weights the producer has copied
        self.lock = context.Lock()

    def _tensors(self, model: nn.Module) -> list[Tensor]:
        state = model.state_dict()
        return [state[name] for name in self.moving]

    @torch.no_grad()
    def publish(self, state: dict[str, Tensor]) -> int:
        """Copy the current weights in (a state dict with at least the trained weights' keys, e.g.
        ``model.state_dict()`` or a sharded model's gathered trainable ones); the new version."""
        with self.lock:
            for name, staged in zip(self.moving, self._tensors(self.staging)):
                staged.copy_(state[name].detach())
            self.version.value += 1
            return self.version.value

    @torch.no_grad()
    def take(self, private: nn.Module, have: int) -> int:
        """Copy the newest weights into ``private`` when newer than ``have``; count one request served. The
        version ``private`` now holds."""
        with self.lock:
            version = self.version.value
            if version != have:
                for mine, staged in zip(self._tensors(private), self._tensors(self.staging)):
                    mine.copy_(staged)
            self.taken.value += 1
            return version


def trained_names(model: nn.Module) -> list[str]:
    """The state-dict names of the weights an update changes, the parameters that require a gradient: every one
    when the whole model is trained, the adapter's under LoRA."""
    return [name for name, tensor in model.state_dict(keep_vars=True).items() if tensor.requires_grad]


def produce(
    policy: Policy,
    mailbox: WeightsMailbox,
    engine: RolloutEngine,
    sampling: SamplingConfig,
    num_generations: int,
    threads: int,
    requests: Any,
    results: Any,
    rewards: RewardSet | None = None,
) -> None:
    """The producer process's loop: take a request, copy its weights, sample, score (with ``rewards``), send the
    answer; ``None`` ends, and so does the trainer's death. Scoring runs on this process's main thread, so reward
    timeouts and math-verify's ``signal.alarm`` work as in the trainer. The signals that end a run (SIGTERM, SIGINT,
    SIGHUP, SIGQUIT, SIGUSR1: ``PreemptionCheckpoint``'s) are left to the trainer, which finishes its step, saves the
    queue and ends the producer (a scheduler's SIGTERM, a Ctrl+C and a closed terminal's SIGHUP reach the whole
    process group)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
    torch.set_num_threads(threads)
    policy.model = copy.deepcopy(mailbox.staging)  # private: the trainer may publish while this one samples
    have, waited_since, trainer = mailbox.version.value, time.perf_counter(), os.getppid()
    while (request := next_request(requests, trainer)) is not None:
        start = time.perf_counter()
        have = mailbox.take(policy.model, have)
        assert have == request.version, f"request of version {request.version} served with {have}"
        rollout = sample(policy, engine, sampling, num_generations, request)
        answer = Produced(rollout, request.batch, have, torch.get_rng_state(), 0.0, start - waited_since)
        if rewards is not None:
            score(rewards, answer, request.trainer_state)
        answer.busy_s, waited_since = time.perf_counter() - start, time.perf_counter()
        results.put(answer)


def score(rewards: RewardSet, answer: Produced, trainer_state: Any) -> None:
    """The answer's scores, or the reward failure's text (the trainer raises it: this process goes on)."""
    start = time.perf_counter()
    try:
        answer.scores = rewards.score(answer.rollout, answer.batch.columns, trainer_state)
    except Exception as err:  # noqa: BLE001 - user code: its failure is the trainer's to raise, as when it scores
        answer.error = str(err) if type(err) is RuntimeError else f"{type(err).__name__}: {err}"  # RewardSet's words
        answer.trace = f"(in the rollout producer)\n{traceback.format_exc()}"
    answer.scoring_s = time.perf_counter() - start


def next_request(requests: Any, trainer: int) -> Request | None:
    """The next request; ``None`` when told to stop or when the trainer process is gone (this one re-parented)."""
    while True:
        try:
            return requests.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != trainer:
                return None


def sample(
    policy: Policy, engine: RolloutEngine, sampling: SamplingConfig, num_generations: int, request: Request
) -> Rollout:
    """The request's completions from its RNG state, with the sampler's log-probs when asked (the engine's own as
    it drew, else a forward pass); the batch's dataset columns travel with it, repeated per completion. The model
    in eval mode: the producer never trains, and dropout would make its log-probs noise, not the sampler's."""
    policy.model.eval()
    torch.set_rng_state(request.rng_state)
    if request.salt:
        torch.manual_seed(int(torch.randint(0, 2**62, (1,))) + request.salt)
    batch = request.batch
    if request.serving is not None:  # a ServedWeights engine: the servers live now, the model version served
        engine.serve_as(request.serving)
    rollout = engine.generate(policy, batch.prompts, num_generations, sampling, False, columns=batch.columns)
    if not request.sampling_logps:
        rollout.sampling_logps = None  # k = 0: the synchronous path's rollout
    elif rollout.sampling_logps is None:
        with torch.no_grad():
            rollout.sampling_logps = policy.logps(rollout, [slice(None)])  # [N, T] the weights of request.version
    return rollout
