"""Asynchronous GRPO: generation in its own process, overlapped with training, under a staleness bound. Prompt
batches -> Rollouts sampled ``max_staleness`` updates ago. Knows the producer process and an inner engine; of the
rewards, only how to hand them to the producer (``score_in_producer``); nothing about losses.

Step ``t`` submits its prompt batch and trains on the rollout of the batch submitted ``k = max_staleness`` steps
earlier, sampled by the weights of then (``asynchronous.producer``): the producer samples batch ``t`` while the
trainer scores and updates on batch ``t - k``. The first ``k`` steps only fill the pipeline (no update, like
``filter_groups`` waiting), and the staleness is at most ``k`` by construction: admission pacing, nothing is
generated that would be thrown away. With ``k = 0`` the trainer waits for each batch: the synchronous path's
samples and updates, from the producer process. The batch's dataset columns travel with its rollout.

Off-policy correction: the producer also returns its own log-probs (``Rollout.sampling_logps``; LeanDecode's as it
draws them, another engine's from a forward pass); the proximal log-probs are the current weights' (the training
forward's own when each row is trained once, ``targets.build.ProximalCorrection``) and the
``update.sampling_correction`` weights apply (``targets.correction``); k = 0 computes none (the sampler is the
trained policy).

Scoring: in the trainer when a batch is trained (the default), or with ``score_in_producer`` in the producer as soon
as the batch is sampled, so slow rewards (a sandbox, a judge) overlap the update instead of adding to the step.
The reward functions are then pickled into the producer (refused at set-up, naming the function, when one cannot
be) and receive the ``trainer_state`` of the step that submitted the batch; validation still scores in the trainer.

Over vLLM servers (``engine: VLLMServer``): the producer's copy of the engine sends the requests (this rank's own,
split over the live servers or through the router, a failed one sent to another) and the trainer's engine pushes
each update to every server. The servers hold one version of the weights, so a push first waits until every batch
submitted has been sampled (each is still sampled by exactly the weights of its submission); the overlap is the
training on batch t - k while batch t is sampled. Each request tells the producer the live servers and the model
version served (``ServedWeights.serving``); the servers' log-probs are kept at k = 0 too.

Checkpoints save the queue's content: the rollouts in flight are awaited and saved with their batches (every
rank's), so a resumed run trains on what the uninterrupted one would have; their producer scores are not saved:
the trainer scores restored rollouts again. One producer per rank (DDP, FSDP2): each rank's own prompts, seeds and
weights (the same on every rank after an update). A sharded (FSDP2) policy is gathered whole on every rank after
each update (a collective) and published from there: each producer holds an unsharded copy, built from a weightless
copy of the modules taken before sharding.
"""

from __future__ import annotations

import atexit
import collections
import pickle
import queue
import time
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn
from typing_extensions import override

from lightning_grpo.engines.asynchronous.producer import Produced, Request, WeightsMailbox, produce
from lightning_grpo.engines.base import RolloutEngine, Sampled, ServedWeights, TokenSampler
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode.lean import LeanDecode
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.sharding import full_state_dict, is_sharded, meta_copy, unsharded
from lightning_grpo.rewards.convention import reward_name
from lightning_grpo.rewards.scoring import RewardSet, trl_trainer_state
from lightning_grpo.types import Prompt, PromptBatch, Rollout, fields_of

POLL_S = 1.0  # how often a wait checks that the producer is alive


class ProducerTraceback(Exception):
    """The traceback of an error raised in the rollout producer process, as text (a traceback cannot be pickled)."""


class AsyncRollouts(RolloutEngine):
    """Sample in a separate process while the trainer updates, at most ``max_staleness`` updates behind.

    Args:
        engine: what samples in the producer (and in-process for validation): ``None`` is ``LeanDecode``, the
            synchronous default.
        max_staleness: k, updates between the weights that sampled a batch and the update that trains on it;
            0 is the synchronous behaviour, 1 one-step-off. The pipeline holds k batches.
        producer_threads: torch threads of the producer process (the trainer keeps its own).
        score_in_producer: score each batch in the producer as soon as it is sampled (reward functions must be
            picklable: defined at module level, or import paths), overlapping slow rewards with the update.
    """

    def __init__(
        self,
        engine: RolloutEngine | None = None,
        max_staleness: int = 1,
        producer_threads: int = 1,
        score_in_producer: bool = False,
    ) -> None:
        self.engine = engine or LeanDecode()
        if isinstance(self.engine, LeanDecode) and max_staleness > 0:
            self.engine.sampler_logps = True  # the correction's sampler log-probs, as drawn: no forward pass for them
        self.max_staleness = max_staleness
        self.producer_threads = producer_threads
        self.score_in_producer = score_in_producer
        self.rewards: RewardSet | None = None  # handed to the producer when it scores
        self.trainer: Any = None
        self.version = 0  # updates published: the trainer's policy version
        self.submitted = 0  # requests sent since the start of training
        self.pending: collections.deque[int] = collections.deque()  # versions of requests not yet answered
        self.ready: collections.deque[Produced] = collections.deque()  # answers received (or restored) not used
        self.process: Any = None
        self.skeleton: torch.nn.Module | None = None  # a sharded policy's modules before sharding, weightless
        self.last_receive, self.waited_s = time.perf_counter(), 0.0  # trainer's idle time since last_receive

    @override
    def problems(self, sampling: SamplingConfig) -> list[str]:
        own = [] if self.max_staleness >= 0 else [f"max_staleness must be >= 0, got {self.max_staleness!r}"]
        if self.producer_threads < 1:
            own.append(f"producer_threads must be >= 1, got {self.producer_threads!r}")
        return own + self.engine.problems(sampling)

    @override
    def adopt(self, sampling: SamplingConfig, correction: str | None) -> list[str]:
        return self.engine.adopt(sampling, correction)

    @override
    def model_problems(self, model: str | nn.Module, init_kwargs: dict[str, Any] | None) -> list[str]:
        return self.engine.model_problems(model, init_kwargs)

    @override
    def reward_columns(self) -> tuple[str, ...] | None:
        return self.engine.reward_columns()

    @override
    def setup(self, policy: Policy, trainer: Any, seed: int) -> None:
        self.trainer = trainer
        if Policy.shards_under(trainer.strategy) and not is_sharded(policy.model) and self.skeleton is None:
            self.skeleton = meta_copy(policy.model)  # configure_model shards next: the producers' model, unsharded
        self.engine.setup(policy, trainer, seed)

    @override
    def use_rewards(self, rewards: RewardSet) -> None:
        if self.score_in_producer:
            unpicklable(rewards.funcs)
            self.rewards = rewards

    @override
    def generate(
        self,
        policy: Policy,
        prompts: list[Prompt],
        num_generations: int,
        sampling: SamplingConfig,
        greedy: bool,
        columns: dict[str, list[Any]] | None = None,
    ) -> Rollout:
        """In-process, with the trainer's weights: validation, test and predict."""
        return self.engine.generate(policy, prompts, num_generations, sampling, greedy, columns=columns)

    @override
    def rollout(
        self, policy: Policy, batch: PromptBatch, num_generations: int, sampling: SamplingConfig
    ) -> Sampled | None:
        if self.process is None:
            self._start(policy, num_generations, sampling)
        self._submit(batch)
        if len(self.ready) + len(self.pending) <= self.max_staleness:
            return None  # filling the pipeline
        if not self.ready:
            self.ready.append(self._receive())
        return self._use(self.ready.popleft())

    @override
    def sync_weights(self, policy: Policy) -> None:
        """Publish the updated weights, once the producer has taken those of every request submitted so far. Only
        the trained ones move: under LoRA the adapter, and a sharded model gathers no frozen base."""
        model = policy.model
        sharded = is_sharded(model)
        state = full_state_dict(model, every_rank=True, trained_only=True) if sharded else model.state_dict()
        start = time.perf_counter()
        if isinstance(self.engine, ServedWeights):  # the servers hold one version: what was submitted is sampled first
            while self.pending:
                self.ready.append(self._receive())
            self.engine.sync_weights(policy)
        while self.mailbox.taken.value < self.submitted:
            self._check_alive("take the weights of its requests")
            time.sleep(0.0005)
        self.waited_s += time.perf_counter() - start  # idle too: async/trainer_idle_fraction counts every wait
        self.version = self.mailbox.publish(state)

    # ---- the producer process -----------------------------------------------------------------------------

    def _start(self, policy: Policy, num_generations: int, sampling: SamplingConfig) -> None:
        if policy.device.type != "cpu":
            raise ValueError(
                "rollout_engine AsyncRollouts samples on CPU from a copy of the policy, got a policy on "
                f"{policy.device}: on GPU use VLLMServer, or trainer.accelerator: cpu"
            )
        if isinstance(self.engine, ServedWeights):  # the servers get the policy's weights before the producer asks them
            self.engine.sync_weights(policy)
        model = policy.model
        if is_sharded(model):
            if self.skeleton is None:
                raise ValueError("AsyncRollouts was set up after the policy was sharded: it cannot rebuild it whole")
            model, self.skeleton = unsharded(model, self.skeleton), None  # every rank's, whole (a collective)
        context = mp.get_context("spawn")
        # after a resume, the requests submitted before it were answered by the producer before it
        self.mailbox = WeightsMailbox(model, context, self.version, self.submitted)
        self.requests, self.results = context.Queue(), context.Queue()
        args = (policy.without_models(), self.mailbox, self.engine, sampling, num_generations, self.producer_threads)
        self.process = context.Process(
            target=produce, args=(*args, self.requests, self.results, self.rewards), daemon=True
        )
        self.process.start()
        atexit.register(self.teardown)  # a fit that raised skips Lightning's teardown hook

    def _submit(self, batch: PromptBatch) -> None:
        k = self.max_staleness
        salt = 0 if k == 0 else self.submitted + 1
        state = None
        if self.rewards is not None:  # what the trainer would pass if it scored now, as TRL does
            t = self.trainer
            state = trl_trainer_state(t.global_step, t.max_steps, t.current_epoch)
        outside = isinstance(self.engine, ServedWeights)
        logps = k > 0 or outside  # a server's own log-probs: its kernels are not the trainer's
        serving = self.engine.serving() if outside else None
        request = Request(batch, self.version, torch.get_rng_state(), salt, logps, state, serving)
        self.requests.put(request)
        self.pending.append(self.version)
        self.submitted += 1

    def _receive(self) -> Produced:
        start = time.perf_counter()
        while True:
            try:
                answer = self.results.get(timeout=POLL_S)
                break
            except queue.Empty:
                self._check_alive("answer")
        self.pending.popleft()
        self.waited_s += time.perf_counter() - start
        return answer

    def _check_alive(self, what: str) -> None:
        if not self.process.is_alive():
            raise RuntimeError(
                f"the rollout producer process died (exit code {self.process.exitcode}) before it could {what}: "
                "see its error above"
            )

    def _use(self, answer: Produced) -> Sampled:
        """The answer's rollout, its rows marked with the version that sampled them and the queue's metrics, its
        batch, its producer scores and the current version; the RNG continues from the producer's when the trainer
        waited for it (k = 0: as the synchronous path's)."""
        rollout = answer.rollout
        if answer.error is not None:  # the in-process error's message; the producer's traceback as its cause
            raise RuntimeError(answer.error) from ProducerTraceback(answer.trace)
        if self.max_staleness == 0:
            torch.set_rng_state(answer.rng_state)
        rollout.versions = torch.full((len(rollout),), answer.version)  # [N]
        now = time.perf_counter()
        served = self.engine.served_metrics() if isinstance(self.engine, TokenSampler) else {}  # its pushes'
        rollout.metrics = {**served, **rollout.metrics, **self._metrics(answer, now - self.last_receive)}
        self.last_receive, self.waited_s = now, 0.0
        return Sampled(rollout, answer.batch, answer.scores, self.version)

    def _metrics(self, answer: Produced, step_s: float) -> dict[str, float]:
        return {
            "async/queue_depth": float(len(self.ready) + self.results.qsize()),
            "async/producer_idle_fraction": answer.idle_s / max(answer.idle_s + answer.busy_s, 1e-9),
            "async/trainer_idle_fraction": min(self.waited_s / max(step_s, 1e-9), 1.0),
            "async/generation_s": answer.busy_s - answer.scoring_s,
        } | ({"async/scoring_s": answer.scoring_s} if answer.scores is not None else {})

    # ---- checkpoints and shutdown -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's queue: answers in flight are awaited, then saved with the counters."""
        while self.pending:
            self.ready.append(self._receive())
        return {"version": self.version, "submitted": self.submitted, "ready": [plain(a) for a in self.ready]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version, self.submitted = state["version"], state["submitted"]
        self.ready = collections.deque(from_plain(a) for a in state["ready"])

    def teardown(self) -> None:
        """End the producer process once it has answered every request (a checkpoint after the fit keeps them),
        and let go of what it shared: the exit hook (which held this engine, and through it the trainer and the
        policy, until the interpreter ended), the mailbox's shared-memory copy of the model and the queues; then
        the inner engine ends what it holds (``VLLMServer``: its temporary weights folder, a whole model)."""
        atexit.unregister(self.teardown)
        if self.process is not None and self.process.is_alive():
            while self.pending:
                self.ready.append(self._receive())
            self.requests.put(None)
            self.process.join(timeout=30)
            if self.process.is_alive():
                self.process.kill()  # it ignores SIGTERM (left to the trainer)
        self.process = self.mailbox = self.requests = self.results = None
        self.engine.teardown()


def unpicklable(funcs: list[Any]) -> None:
    """Refuse, before any compute, reward functions that cannot travel to the producer process."""
    for fn in funcs:
        try:
            pickle.dumps(fn)
        except Exception as err:  # noqa: BLE001 - pickle raises several types for one cause
            raise ValueError(
                f"AsyncRollouts(score_in_producer=True) sends the reward functions to the producer process, and "
                f"reward function {reward_name(fn)!r} cannot be pickled ({type(err).__name__}: {err}): define it at "
                "module level (not a lambda or a closure) or give its import path, or set score_in_producer: false"
            ) from err


def plain(answer: Produced) -> dict[str, Any]:
    """An answer as dicts, lists and tensors: what ``torch.load(weights_only=True)`` reads back. The producer's
    scores (or its reward failure) are left out: the trainer scores a restored rollout again."""
    return (
        fields_of(answer)
        | {"rollout": fields_of(answer.rollout), "batch": fields_of(answer.batch)}
        | {
            "scores": None,
            "error": None,
        }
    )


def from_plain(fields: dict[str, Any]) -> Produced:
    return Produced(**fields | {"rollout": Rollout(**fields["rollout"]), "batch": PromptBatch(**fields["batch"])})
