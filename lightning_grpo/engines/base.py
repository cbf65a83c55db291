"""The rollout-engine interface: ``RolloutEngine``, what every engine implements, and ``Sampled``, what an engine
hands back for a training step. Knows the policy, prompts, Rollouts and, for an engine that scores what it samples,
the reward set; nothing about losses.

A training step asks ``rollout()`` for one ``Sampled`` record: the rollout, the prompt batch it answers, the
engine's own scores of it (``None``: ``GRPOModule`` scores it) and the weight version it was handed back at, from
which the staleness of its rows follows. An in-process engine answers the step's own batch with the current
weights; an engine that samples ahead (``AsyncRollouts``) answers an earlier batch, sampled by earlier weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy
from lightning_grpo.rewards.scoring import RewardSet
from lightning_grpo.types import Prompt, PromptBatch, RewardScores, Rollout


@dataclass
class Sampled:
    """A training step's rollout as its engine hands it back."""

    rollout: Rollout
    batch: PromptBatch  # the prompts it answers: the step's own, or an earlier batch's when sampled ahead
    scores: RewardScores | None = None  # the engine's own scores of it (scored as sampled); None: the module scores
    version: int | None = None  # updates the trainer had published when it was handed back; None: sampled by them

    def staleness(self, rows: Rollout | None = None) -> Tensor | None:
        """[N] updates between the weights that sampled each row and the current ones, of ``rows`` (this rollout
        by default, or rows kept from earlier ones: ``Rollout.versions``); ``None``: the current weights sampled
        them."""
        rows = self.rollout if rows is None else rows
        return None if self.version is None or rows.versions is None else self.version - rows.versions


class RolloutEngine:
    """Turns prompts into a Rollout. Subclass it and choose it with ``rollout_engine: {class_path: ...}``.

    An engine returns, for each of the B prompts, ``num_generations`` completions as token ids with their
    masks (``build_rollout`` does the bookkeeping), and may add per-token sampler log-probs (an engine that
    samples from its own copy of the weights), a ``tool_mask`` (tokens the model did not write), per-row
    ``columns`` for the reward functions and its own ``metrics``.
    """

    takes_images = False
    """Whether the engine carries a vision-language policy's images (``Rollout.vision``) to generation; one that
    does not is refused with such a policy when the module is built (``engines.engine_for``)."""

    def problems(self, sampling: SamplingConfig) -> list[str]:
        """What of ``sampling`` this engine cannot honour, one message per setting (name, value, what to do).
        ``GRPOModule`` lists them with every other bad setting, before any model is loaded."""
        return []

    def adopt(self, sampling: SamplingConfig, correction: str | None) -> list[str]:
        """The run's sampling and its resolved ``update.sampling_correction``, told once when ``GRPOModule`` is
        built (before any model loads): an engine keeps what it needs of them (vLLM: the log-prob mode it starts
        with) and returns what it cannot honour together, one message each naming the settings."""
        return []

    def model_problems(self, model: str | nn.Module, init_kwargs: dict[str, Any] | None) -> list[str]:
        """Why this engine cannot serve ``model`` (a name, path or built model; ``init_kwargs``: the policy's
        ``model_init_kwargs``), read from its config before any weight loads (vLLM-CPU: its head size)."""
        return []

    def reward_columns(self) -> tuple[str, ...] | None:
        """The columns this engine's rollouts add to the reward functions' arguments (``agent_reward``), checked
        with the dataset's before any compute; ``None``: not known until a rollout (a ``rollout_func``'s fields)."""
        return ()

    def setup(self, policy: Policy, trainer: Any, seed: int) -> None:
        """Called once the training processes exist (``LightningModule.setup``); ``trainer`` has the ranks."""

    def generate(
        self,
        policy: Policy,
        prompts: list[Prompt],
        num_generations: int,
        sampling: SamplingConfig,
        greedy: bool,
        columns: dict[str, list[Any]] | None = None,
    ) -> Rollout:
        """``num_generations`` completions for each prompt (one, greedy, for validation); rows are grouped.
        ``columns`` are the prompts' other dataset columns (name -> [B] values), for engines that need the rows
        (environments reset from them); single-turn engines ignore them."""
        raise NotImplementedError

    def rollout(
        self, policy: Policy, batch: PromptBatch, num_generations: int, sampling: SamplingConfig
    ) -> Sampled | None:
        """A training step's rollout: ``batch``'s own here, sampled by the current weights; an engine that samples
        ahead (``AsyncRollouts``) hands back an earlier batch's, with its own scores if it scored it and the version
        its rows' staleness is counted from, or ``None`` while its pipeline fills."""
        return Sampled(
            self.generate(policy, batch.prompts, num_generations, sampling, False, columns=batch.columns), batch
        )

    def use_rewards(self, rewards: RewardSet) -> None:
        """The run's rewards, offered once when a fit sets up to an engine that scores what it samples
        (``AsyncRollouts(score_in_producer=True)``, refusing there what it cannot score); others ignore them."""

    max_staleness = 0  # updates a rollout may lag the weights that train on it (an engine sampling ahead: k)

    def sync_weights(self, policy: Policy) -> None:
        """Make the next ``generate`` use the policy's current weights (after each training step)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this rank's engine (rollouts sampled ahead); every rank's is saved."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s content on resume."""

    def teardown(self) -> None:
        """Release what the engine started (processes) at the end of a fit."""


class TokenSampler(RolloutEngine):
    """An engine that also serves the agent endpoint (``engines.OpenAIAgent``'s ``sampler``): token ids in, token
    ids out, one turn at a time, as its agents ask. ``OpenAIAgent`` takes only such an engine (``isinstance``);
    HFGenerate, LeanDecode, VLLMColocate and VLLMServer are."""

    def before_requests(self, policy: Policy) -> None:
        """Called on every rank before a rollout's ``complete`` calls, which the agent endpoint makes only as its
        agents ask (a rank whose agents ask nothing makes none): an engine whose first weight push is a collective
        of the ranks (``VLLMServer``) makes it here, where every rank is."""

    def complete(
        self, policy: Policy, contexts: list[list[int]], budgets: list[int], sampling: SamplingConfig, greedy: bool
    ) -> list[tuple[list[int], list[float] | None]]:
        """Token ids in, token ids out, for the agent endpoint (``engines.OpenAIAgent``): one continuation of each
        context, at most its budget of tokens, cut after the first EOS, with the sampler's log-prob of each sampled
        token (``None`` where this engine cannot give them). Sampled as ``generate`` samples."""
        raise NotImplementedError

    def complete_episodes(
        self,
        policy: Policy,
        contexts: list[list[int]],
        budgets: list[int],
        sampling: SamplingConfig,
        greedy: bool,
        episodes: list[str],
    ) -> list[tuple[list[int], list[float] | None]]:
        """``complete`` told which agent episode each context continues (``OpenAIAgent`` calls this): an engine
        over several servers keeps an episode's turns on one, where its prefix is cached; others ignore it."""
        return self.complete(policy, contexts, budgets, sampling, greedy)

    def served_metrics(self) -> dict[str, float]:
        """What the engine measured of its pushes and servers since last asked, for a rollout that ``complete``
        served (``OpenAIAgent``'s): ``vllm/*`` and ``servers/*`` entries; none by default."""
        return {}


class ServedWeights(RolloutEngine):
    """An engine that samples from weights held outside the trainer's processes (vLLM servers), which
    ``sync_weights`` moves there. Sampling ahead (``AsyncRollouts``, which asks ``isinstance``), a push waits until
    the batches submitted are sampled, and each request carries ``serving()`` to the producer's copy."""

    def serving(self) -> Any:
        """What a copy of this engine in another process (``AsyncRollouts``' producer) needs to sample as this
        one would now (servers: the live ones and the model version served)."""
        raise NotImplementedError

    def serve_as(self, serving: Any) -> None:
        """The copy of the engine in another process takes ``serving()`` of the one in the trainer."""
