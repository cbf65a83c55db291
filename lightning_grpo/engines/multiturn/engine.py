"""Chat prompts -> multi-turn episodes: the model writes, its tool calls run, their results are appended as
``tool`` messages, and it writes again (TRL 1.16's ``tools`` / ``environment_factory`` loop).

An episode's completion is every token after the prompt: the model's turns (``tool_mask`` 1) and, between them,
the tool results with the template's scaffolding (``tool_mask`` 0: they condition the model but stay out of the
loss, KL and entropy). Ids are concatenated, never re-tokenised, so the trained tokens are the sampled ones.
Knows the policy, its tokenizer and the tools; nothing about rewards beyond the environments' own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_grpo.engines.base import RolloutEngine
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.multiturn.calls import ToolResult, resolve_tool, run_call, tool_schema
from lightning_grpo.engines.multiturn.environments import Environments, environment_tools, episode_rewards
from lightning_grpo.engines.multiturn.episodes import EpisodeStats, tool_suffix_ids
from lightning_grpo.engines.multiturn.families import ToolFormat, tool_format
from lightning_grpo.engines.prompts import cut_prompts, encode_prompts, is_conversational
from lightning_grpo.model.policy import Policy
from lightning_grpo.types import Prompt, Rollout, pad_rows


@dataclass
class Episode:
    """One rollout being played: its prompt ids, the completion so far and which of its tokens the model wrote."""

    prompt: list[dict]
    prompt_ids: list[int]
    tools: dict[str, Callable]
    schemas: list[dict]  # the tools' JSON schemas: the template showed them, the reader types arguments by them
    budget: int  # model-written tokens still allowed (max_completion_length counts them all)
    ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    turns: int = 0
    results: list[ToolResult] = field(default_factory=list)
    unparsed: int = 0  # turns that looked like a tool call but none could be read
    ended: str | None = None  # None while playing; "answer", "tokens" or "turns"


class ToolCalling(RolloutEngine):
    """Multi-turn rollouts with tools (``rollout_engine: {class_path: lightning_grpo.engines.ToolCalling}``).

    Every turn, all unfinished episodes of the rank are generated in one batched call. Under sharding
    (``synced_generation``) the ranks agree on whether any episode is still playing before each turn, and a
    rank with none left steps a one-token dummy call, so every rank makes the same number of generate calls.

    Metrics (``train/...``): ``tools/call_frequency`` and ``tools/failure_frequency`` (TRL's: calls per episode,
    failed calls per call), ``tools/malformed_frequency`` (calls that could not be read, per call; an unreadable
    call in a turn the token budget cut short is counted, though not run), ``tools/unparsed_frequency`` (model
    turns that look like a tool call, in any family's format, but yield none, per turn: each is answered with an
    error and warned about once), ``tools/<name>/failure_frequency``,
    ``turns/mean``, ``turns/max``,
    ``episodes/truncated_by_turns`` and ``episodes/truncated_by_tokens`` (fractions of episodes), and
    ``rewards/<Class>/mean`` for environments with ``get_reward``.

    Args:
        tools: callables or their import paths (``package.module.function``); each needs type hints and a
            Google-style docstring, from which its JSON schema is built for the chat template's ``tools``.
        environment_factory: TRL's: a callable (class) returning an environment, or ``{name: callable}`` picked
            per row by the ``environment`` column; its public methods are tools, ``reset(**row)`` starts an episode
            and ``get_reward()`` gives the ``environment_reward`` column (reward function
            ``lightning_grpo.engines.environment_reward``).
        max_tool_calling_iterations: most rounds of tool calls per episode (TRL's name); >= 1.
        parser: reads tool calls from the model's text: ``parse(text) -> (content, [ToolCall])``; default: the
            model family's own format, read by transformers' ``parse_response`` with TRL's response template for the
            chat template (Qwen, Llama 3.1/3.2, GLM-4.5, gpt-oss, Gemma 4, LFM2, Nemotron 3:
            ``references/tool_families.md``), or Hermes ``<tool_call>{json}</tool_call>`` for a template that renders
            it; a template none of them reads is refused at start-up.
        tool_timeout: seconds one tool call may take before its reply is a timeout error; ``None``: no limit.
    """

    def __init__(
        self,
        tools: Sequence[Callable | str] | None = None,
        environment_factory: Callable | str | dict[str, Callable | str] | None = None,
        max_tool_calling_iterations: int = 5,
        parser: Any = None,
        tool_timeout: float | None = 30.0,
    ) -> None:
        if not isinstance(max_tool_calling_iterations, int) or max_tool_calling_iterations < 1:
            raise ValueError(f"max_tool_calling_iterations must be an int >= 1, got {max_tool_calling_iterations!r}")
        if tool_timeout is not None and tool_timeout <= 0:
            raise ValueError(f"tool_timeout must be > 0 seconds or None (no limit), got {tool_timeout!r}")
        self.tools = [resolve_tool(t) for t in tools or []]
        self.schemas = [tool_schema(t) for t in self.tools]
        self.environments = Environments(environment_factory) if environment_factory is not None else None
        if not self.tools and self.environments is None:
            raise ValueError("ToolCalling needs tools (callables or import paths) or an environment_factory")
        if parser is not None and not callable(getattr(parser, "parse", None)):
            raise ValueError(f"parser must have parse(text) -> (content, calls), got {type(parser).__name__}")
        self.parser, self.format = parser, None  # the ToolFormat, set up once from the tokenizer
        self.max_iterations, self.tool_timeout = max_tool_calling_iterations, tool_timeout
        self.warned_unparsed = False

    @override
    def setup(self, policy: Policy, trainer: Any, seed: int) -> None:
        """The chat template must render tools, tool calls and tool replies, and its family's calls must be readable:
        checked before any compute."""
        self._format(policy)

    def _format(self, policy: Policy) -> ToolFormat:
        """The run's ToolFormat, built at the first ``setup`` or ``generate`` (an engine driven by hand)."""
        if self.format is None:
            env_schemas = self.environments.schemas.values() if self.environments else []
            self.format = tool_format(policy.tokenizer, self.schemas or next(iter(env_schemas), []), self.parser)
        return self.format

    @override
    def reward_columns(self) -> tuple[str, ...]:
        return ("environment_reward", "environments") if self.environments else ()

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
        if not is_conversational(prompts[0]):
            raise ValueError(
                "ToolCalling needs chat prompts (lists of messages), got plain text: the chat template renders tools"
            )
        rows = [{"prompt": p, **{k: v[i] for k, v in (columns or {}).items()}} for i, p in enumerate(prompts)]
        rows = [r for r in rows for _ in range(num_generations)]  # [N]
        fmt = self._format(policy)
        episodes, environments, truncated_prompts = self._start(policy, rows, sampling, fmt)
        self._play(policy, episodes, sampling, greedy, fmt)
        columns_out, metrics = episode_rewards(environments) if environments else ({}, {})
        stats = EpisodeStats.of(episodes)
        self._warn_unparsed(stats, fmt)
        rollout = stats.rollout(
            policy.tokenizer,
            episodes,
            num_generations,
            truncated_prompts // num_generations,
            columns_out,
            {**stats.metrics(), **metrics},
            policy.device,
        )
        return rollout

    def _warn_unparsed(self, stats: EpisodeStats, fmt: ToolFormat) -> None:
        """Replies that look like tool calls but are read as none are said once; the metric counts them each step."""
        if stats.unparsed and not self.warned_unparsed:
            self.warned_unparsed = True
            rank_zero_warn(
                f"{stats.unparsed} of {sum(stats.turns)} model turns look like a tool call but none could be read as "
                f"a {fmt.family} tool call (reader: {fmt.reader}): each is answered with an error; "
                "train/tools/unparsed_frequency counts them every step. A model that writes another family's format "
                "needs that family's chat template, or parser:"
            )

    def _start(
        self, policy: Policy, rows: list[dict], sampling: SamplingConfig, fmt: ToolFormat
    ) -> tuple[list[Episode], list, int]:
        """Episodes with rendered prompt ids; environments reset (their reply appended to the last message)."""
        prompts = [r["prompt"] for r in rows]
        environments, tools = [], [list(self.tools)] * len(rows)
        schemas = [self.schemas] * len(rows)
        if self.environments is not None:
            environments, prompts = self.environments.start(prompts, rows)
            tools = [self.tools + environment_tools(e) for e in environments]
            schemas = [self.schemas + s for s in self.environments.schemas_of(rows)]
        template_kwargs = fmt.render_kwargs(sampling.chat_template_kwargs)
        encoded = encode_prompts(policy.tokenizer, prompts, sampling, schemas, template_kwargs)
        encoded, cut = cut_prompts(encoded, sampling)
        episodes = []
        for prompt, ids, row_tools, row_schemas in zip(prompts, encoded, tools, schemas):
            by_name = {t.__name__: t for t in row_tools}
            episodes.append(Episode(prompt, list(ids), by_name, row_schemas, sampling.max_completion_length))
        return episodes, environments, cut

    def _play(
        self, policy: Policy, episodes: list[Episode], sampling: SamplingConfig, greedy: bool, fmt: ToolFormat
    ) -> None:
        """Turns until every episode has ended; all playing episodes of a turn in one generate call."""
        while True:
            playing = [e for e in episodes if e.ended is None]
            if not policy.ranks_max(bool(playing))[0]:  # under sharding, a rank with none left steps dummies
                return
            turns = self._generate_turn(policy, playing or episodes[:1], sampling, greedy, dummy=not playing)
            for episode, ids in zip(playing, turns):
                self._take_turn(policy, episode, ids, fmt, fmt.render_kwargs(sampling.chat_template_kwargs))

    @staticmethod
    def _generate_turn(
        policy: Policy, episodes: list[Episode], sampling: SamplingConfig, greedy: bool, dummy: bool
    ) -> list[list[int]]:
        """One batched, left-padded generate call; each row cut after its first EOS and to its own budget."""
        tokenizer, eos = policy.tokenizer, policy.eos_token_ids
        ids, mask = pad_rows([e.prompt_ids + e.ids for e in episodes], tokenizer.pad_token_id, left=True)
        config = sampling.generation_config(tokenizer, greedy=greedy)
        config.eos_token_id = eos
        config.max_new_tokens = 1 if dummy else max(e.budget for e in episodes)
        with policy.generating() as model:
            out = model.generate(
                input_ids=ids.to(policy.device),
                attention_mask=mask.to(policy.device),
                generation_config=config,
                synced_gpus=policy.synced_generation,
            )
        turns = []
        for episode, row in zip(episodes, out[:, ids.shape[1] :].tolist()):
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            turns.append(row[: min(cut, episode.budget)])
        return turns

    def _take_turn(
        self, policy: Policy, episode: Episode, ids: list[int], fmt: ToolFormat, template_kwargs: dict[str, Any]
    ) -> None:
        """Append the model's turn, read in its family's format (``fmt``); run its tool calls and append their
        replies (rendered with ``template_kwargs``, as the prompt was), or end the episode."""
        tokenizer = policy.tokenizer
        reading = fmt.read(tokenizer, ids, episode.prompt_ids + episode.ids, episode.schemas)
        content, calls = reading.content, reading.calls
        episode.unparsed += reading.unparsed is not None
        episode.ids += ids
        episode.model_mask += [1] * len(ids)
        episode.budget -= len(ids)
        episode.turns += 1
        message: dict[str, Any] = {"role": "assistant", "content": content, **reading.fields}
        if calls:
            message["tool_calls"] = [c.message() for c in calls]
        episode.messages.append(message)
        if not ids or ids[-1] not in policy.eos_token_ids:
            episode.ended = "tokens"  # the budget ran out mid-turn: no call in it is run
            episode.results += [run_call(c, episode.tools, None) for c in calls if c.error is not None]  # malformed
        elif not calls:
            episode.ended = "answer"
        elif episode.turns > self.max_iterations:
            episode.ended = "turns"
        if episode.ended is not None:
            return
        results = [run_call(c, episode.tools, self.tool_timeout) for c in calls]
        suffix = tool_suffix_ids(tokenizer, [r.message() for r in results], template_kwargs)
        limit = getattr(policy.model.config, "max_position_embeddings", None)
        if episode.budget <= 0 or (limit and len(episode.prompt_ids) + len(episode.ids) + len(suffix) >= limit):
            episode.ended = "tokens"  # no room for the replies and another turn (TRL drops them too)
            return
        episode.results += results
        episode.messages += [r.message() for r in results]
        episode.ids += suffix
        episode.model_mask += [0] * len(suffix)
