"""Prompts -> a Rollout played by the user's own agent program against an OpenAI-compatible endpoint over the policy.

For each of the N = B * G rows, ``agent(base_url, row)`` runs on its own thread; its requests reach the endpoint
(``agents.endpoint``), are gathered on the trainer's thread and generated in batches by the sampler engine
(``agents.batches``; ``complete``: HF ``generate`` by default), recorded token by token (``agents.served``). When
every agent has returned, failed or run out of time, the records become the Rollout: the sampled tokens as they
were sampled, the tokens the model was shown between its turns masked out of the loss (``tool_mask``). Knows
threads, the episode record and the Rollout; nothing about HTTP or rewards beyond the agent's own.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import uuid
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from typing_extensions import override

from lightning_grpo.engines.agents.batches import RequestBatches
from lightning_grpo.engines.agents.endpoint import Endpoint, Refusal, Request, refuse
from lightning_grpo.engines.agents.served import (
    ServedEpisode,
    episode_metrics,
    episode_reward,
    render_prompt,
    template_message,
)
from lightning_grpo.engines.base import RolloutEngine, TokenSampler
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode.hf import HFGenerate
from lightning_grpo.engines.multiturn.calls import resolve_tool
from lightning_grpo.engines.multiturn.episodes import EpisodeStats
from lightning_grpo.engines.multiturn.families import ToolFormat, tool_format
from lightning_grpo.model.policy import Policy
from lightning_grpo.rewards.calls import ON_ERROR
from lightning_grpo.types import Prompt, Rollout, pad_rows

AGENT_ARGUMENTS = ("client", "base_url")
NOT_PLAYING = (
    "no episode {session!r} is being played: the endpoint serves only the episodes of the rollout in progress, "
    "at the base URL the agent was given"
)


class OpenAIAgent(RolloutEngine, RequestBatches):
    """Your agent, unchanged, against the policy (``rollout_engine: {class_path: lightning_grpo.engines.OpenAIAgent}``).

    ``agent(client, row)`` gets an ``openai.OpenAI`` client bound to its episode (``agent_argument: client``, the
    default: one connection pool for all, as building a client per episode costs ~0.1 s of CPU), or its episode's
    base URL (``agent_argument: base_url``, for ``OpenAI(base_url=base_url, api_key="-")`` or any other HTTP
    client), and the dataset row (``prompt`` and the other columns), and returns a reward (a number: the
    ``agent_reward`` column, scored by the reward function ``lightning_grpo.engines.agent_reward``), the
    conversation's messages after the prompt (scored by your reward functions), or ``None`` (the recorded
    conversation is scored). It may be ``async def``. ``references/agents.md``: what is recorded, the limits.

    Metrics (``train/...``): ``agents/errors`` and ``agents/timeouts`` (fractions of episodes), ``agents/requests``
    (per episode), ``agents/restarts`` (requests that did not continue their episode), ``agents/context_full``
    (episodes ended because a request's messages left no room under the context bound: the model's positions and
    ``sampling.max_prompt_length + max_completion_length``), and the tool engine's ``tools/call_frequency``,
    ``tools/failure_frequency`` (calls that could not be parsed or name no tool of the request),
    ``tools/malformed_frequency`` (calls that could not be parsed, per call), ``tools/unparsed_frequency`` (model
    turns that look like a call in any family's format but yield none, per turn; warned about once), ``turns/mean``.

    Args:
        agent: the callable, or its import path.
        agent_argument: what the agent gets first: ``client`` (an ``openai.OpenAI``, ``pip install openai``) or
            ``base_url`` (a string).
        timeout: seconds the N agents of a rollout may take together; one still running then is abandoned (its
            later requests are refused) and counts as failed. ``None``: no limit.
        on_error: an agent that raises, returns something else or runs out of time: ``raise`` (the run stops,
            naming the row and the error), ``skip`` (its reward is ``None`` and none of its tokens is trained) or
            ``zero`` (its reward is 0 and its tokens are trained: a crash the model caused is penalised).
        sampler: the engine that generates (``HFGenerate`` by default, which records its log-probs for the
            sampler/trainer mismatch metrics; ``LeanDecode``, faster, records none: it is the policy itself;
            ``VLLMColocate``, the weights pushed to it after every step; ``VLLMServer``, each episode's turns on
            one server, where its prefix is cached); it needs ``complete``.
        parser: reads tool calls from the model's text (``parse(text) -> (content, [ToolCall])``); default: the
            model family's own format (transformers' ``parse_response`` with TRL's response template for the chat
            template, or Hermes ``<tool_call>{json}</tool_call>`` for a template that renders it:
            ``references/tool_families.md``). Whatever the family, the endpoint answers with OpenAI ``tool_calls``;
            for a template none of them reads it warns at start-up and answers with text.
        batch_wait: seconds to wait for the other agents' requests before generating a partial batch.
        port: the endpoint's port on 127.0.0.1; 0 picks a free one. Under DDP/FSDP2 each rank serves its own
            episodes on ``port + local rank`` (one machine's ranks never share a port).
    """

    def __init__(
        self,
        agent: Callable | str,
        agent_argument: Literal[AGENT_ARGUMENTS] = "client",
        timeout: float | None = 120.0,
        on_error: Literal[ON_ERROR] = "zero",
        sampler: TokenSampler | None = None,
        parser: Any = None,
        batch_wait: float = 0.05,
        port: int = 0,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {list(ON_ERROR)}, got {on_error!r}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds or None (no limit), got {timeout!r}")
        if agent_argument not in AGENT_ARGUMENTS:
            raise ValueError(f"agent_argument must be one of {list(AGENT_ARGUMENTS)}, got {agent_argument!r}")
        if batch_wait < 0:
            raise ValueError(f"batch_wait must be >= 0 seconds, got {batch_wait!r}")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be 0 (a free port) or a TCP port 1-65535, got {port!r}")
        self.agent = resolve_tool(agent, "agent")
        self.timeout, self.on_error, self.batch_wait = timeout, on_error, batch_wait
        self.agent_argument, self._client = agent_argument, None
        self.sampler = sampler or HFGenerate()
        if not isinstance(self.sampler, TokenSampler):
            raise ValueError(
                f"sampler must be an engine that serves the endpoint (an engines.base.TokenSampler): HFGenerate, "
                f"LeanDecode, VLLMColocate or VLLMServer, got {type(self.sampler).__name__}"
            )
        if parser is not None and not callable(getattr(parser, "parse", None)):
            raise ValueError(f"parser must have parse(text) -> (content, calls), got {type(parser).__name__}")
        self.parser, self.format = parser, None  # the ToolFormat, set up once from the tokenizer
        self.endpoint, self.port, self.local_rank = Endpoint(), port, 0
        self.inbox: queue.Queue = queue.Queue()
        self.live: dict[str, ServedEpisode] = {}
        self.lock = threading.Lock()
        self.warned: set[str] = set()  # agent errors already reported

    @override
    def problems(self, sampling: SamplingConfig) -> list[str]:
        return self.sampler.problems(sampling)

    @override
    def adopt(self, sampling: SamplingConfig, correction: str | None) -> list[str]:
        return self.sampler.adopt(sampling, correction)  # a vLLM sampler's log-prob mode, and its refusals

    @override
    def model_problems(self, model: str | nn.Module, init_kwargs: dict[str, Any] | None) -> list[str]:
        return self.sampler.model_problems(model, init_kwargs)

    @override
    def reward_columns(self) -> tuple[str, ...]:
        return ("agent_reward", "episode_id")

    @override
    def sync_weights(self, policy: Policy) -> None:
        self.sampler.sync_weights(policy)  # an engine with its own weights (vLLM) gets the update

    @override
    def setup(self, policy: Policy, trainer: Any, seed: int) -> None:
        self.sampler.setup(policy, trainer, seed)
        self._format(policy)
        self.local_rank = getattr(trainer, "local_rank", 0)
        self._start_endpoint()

    def _format(self, policy: Policy) -> ToolFormat:
        """How the model's calls are read, built once (at ``setup``, or the first ``generate`` of an engine driven by
        hand); a template it cannot read is warned about, not refused: agents may parse their own calls."""
        if self.format is None:
            self.format = tool_format(policy.tokenizer, [], self.parser, refuse=False)
        return self.format

    def _start_endpoint(self) -> None:
        """Listen on ``port + local rank`` (or a free port); a port that cannot be bound is reported at once."""
        port = self.port + self.local_rank if self.port else 0
        try:
            self.endpoint.start(self._accept, port)
        except OSError as e:
            rank = f" + local rank {self.local_rank}" if self.local_rank else ""
            raise RuntimeError(
                f"OpenAIAgent(port={self.port}){rank}: the agent endpoint cannot listen on "
                f"{self.endpoint.host}:{port}: {e.strerror or e}; set another port, or port: 0 for a free one"
            ) from e

    def _accept(self, request: Request) -> None:
        """On the server's thread: refuse what is not ours to serve, queue the rest for the trainer's thread. Under
        the lock that closes a rollout: a request is queued while its episode plays, or refused."""
        with self.lock:
            episode = self.live.get(request.session)
            if episode is None:
                raise Refusal(404, NOT_PLAYING.format(session=request.session))
            if episode.status != "running":
                ended = f"episode {request.session!r} has ended ({episode.status}); it takes no more requests"
                raise Refusal(410, ended)
            self.inbox.put(request)

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
        self._start_endpoint()  # setup() is skipped when the engine is driven by hand
        self._format(policy)
        self.sampler.before_requests(policy)  # here every rank is; its agents may ask nothing
        rows = [{"prompt": p, **{k: v[i] for k, v in (columns or {}).items()}} for i, p in enumerate(prompts)]
        episodes = [
            ServedEpisode(uuid.uuid4().hex, dict(r), sampling.max_completion_length)
            for r in rows
            for _ in range(num_generations)
        ]
        with self.lock:
            self.live = {e.session: e for e in episodes}
        for episode in episodes:
            handle = self._handle(self.endpoint.base_url(episode.session))
            threading.Thread(target=self._play, args=(episode, handle), name="agent", daemon=True).start()
        try:
            self._serve(policy, episodes, sampling, greedy)
        finally:
            self._close(episodes)
        return self._rollout(policy, episodes, num_generations, sampling)

    def _handle(self, base_url: str) -> Any:
        """What the agent gets: the base URL, or a client on it that shares one connection pool with the others
        (no retries: a refused request is final)."""
        if self.agent_argument == "base_url":
            return base_url
        if self._client is None:
            from openai import OpenAI

            self._client = OpenAI(base_url=base_url, api_key="lightning-grpo", max_retries=0, timeout=None)
        return self._client.with_options(base_url=base_url)

    def _play(self, episode: ServedEpisode, handle: Any) -> None:
        """One agent run, on its own thread; whatever happens ends as the episode's status."""
        try:
            value = self.agent(handle, dict(episode.row))
            value = asyncio.run(value) if inspect.iscoroutine(value) else value
            if not (value is None or isinstance(value, int | float | list)):
                raise TypeError(f"the agent returned {type(value).__name__}: return a reward, messages or None")
            episode.outcome, status = value, "done"
        except BaseException as e:  # noqa: BLE001 - any failure of user code is this episode's failure
            episode.error, status = f"{type(e).__name__}: {e}", "failed"
        with self.lock:
            if episode.status == "running":  # not already timed out
                episode.status = status
            if self.live.get(episode.session) is episode:  # the rollout is still collecting
                self.inbox.put(episode)

    def _close(self, episodes: list[ServedEpisode]) -> None:
        """No episode takes requests any more; any still queued is refused. Under the lock ``_accept`` queues in: no
        request lands in the queue once it is drained."""
        with self.lock:
            self.live = {}
            while True:
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    return
                if isinstance(item, Request):
                    refuse([item], "the rollout has ended")

    def _rollout(
        self, policy: Policy, episodes: list[ServedEpisode], group_size: int, sampling: SamplingConfig
    ) -> Rollout:
        failed = [e for e in episodes if e.status != "done"]
        if failed:
            self._report(failed[0])
        for e in episodes:
            if not e.prompt_ids:  # the agent never asked: the row's prompt, nothing to train
                ids = render_prompt(policy.tokenizer, e.row["prompt"], sampling, self.format.chat_template)
                e.prompt, e.prompt_ids = e.row["prompt"], ids
            if e.status != "done" and self.on_error == "skip":
                e.model_mask = [0] * len(e.ids)
            if isinstance(e.outcome, list):  # the agent's own transcript, in the template's form for the rewards
                e.messages = [template_message(m, e.call_names) for m in e.outcome]
        stats = EpisodeStats.of(episodes)
        if stats.unparsed and "unparsed" not in self.warned:
            self.warned.add("unparsed")
            rank_zero_warn(
                f"{stats.unparsed} of {sum(stats.turns)} model turns look like a tool call but none could be read as a "
                f"{self.format.family} tool call (reader: {self.format.reader}): they were answered as text; "
                "train/tools/unparsed_frequency counts them every step"
            )
        rewards = [episode_reward(e, self.on_error) for e in episodes]
        columns = {"agent_reward": rewards, "episode_id": [e.session for e in episodes]}
        metrics = {**stats.metrics(), **episode_metrics(episodes), **self.sampler.served_metrics()}  # a vLLM sampler's
        rollout = stats.rollout(policy.tokenizer, episodes, group_size, 0, columns, metrics, policy.device)
        if all(e.sampler_logps for e in episodes):  # else the policy sampled itself: nothing to correct
            logps, _ = pad_rows([e.logps for e in episodes], 0.0, dtype=torch.float32, min_width=1)
            rollout.sampling_logps = logps[:, : rollout.completion_ids.shape[1]].to(policy.device)
        return rollout

    def _report(self, episode: ServedEpisode) -> None:
        """A failed episode stops the run (``on_error: raise``) or is warned about, once per distinct error."""
        name = getattr(self.agent, "__name__", self.agent)
        why = episode.error or f"still running after timeout={self.timeout}s"
        if self.on_error == "raise":
            raise RuntimeError(f"agent {name!r} failed on row {episode.row}: {why}")
        if why not in self.warned:
            self.warned.add(why)
            rank_zero_warn(
                f"agent {name!r} failed ({why}), first on row {episode.row}: its episodes score "
                f"{'0' if self.on_error == 'zero' else 'nothing'} (on_error={self.on_error}); "
                "train/agents/errors and train/agents/timeouts count them every step"
            )

    @override
    def teardown(self) -> None:
        """The endpoint stops (a later rollout starts it again); the sampler releases what it holds."""
        self.endpoint.stop()
        self.sampler.teardown()
