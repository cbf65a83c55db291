"""An agent's requests to the endpoint -> one episode's exact token record (what the policy sampled, what it was
shown), and the policy's sampled turns -> the replies the agent reads.

Token in, token out: the model's tokens are recorded as sampled, never re-tokenised. A request whose messages are
the episode's conversation so far (as the agent got it back) plus new ones (tool results, a user turn) continues the
episode: only the new messages are rendered, with the template's scaffolding, and appended as tokens the model did
not write (``model_mask`` 0). Any other request starts the episode over from its own messages (counted in
``restarts``): the rollout keeps the last run. An episode's context is bounded: a request whose messages would not
leave room for one more model token ends it (``full``), nothing of it recorded. A body the API would refuse is
refused with a 400 naming its field (``check_body``), and so are messages the chat template will not render.
Knows token ids, chat templates and the API's message shapes; nothing about HTTP or generation.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from transformers import PreTrainedTokenizerBase

from lightning_grpo.engines.agents.endpoint import Refusal, chat_reply, text_reply
from lightning_grpo.engines.multiturn.episodes import tool_suffix_ids
from lightning_grpo.types import Prompt


class Step(NamedTuple):
    """What a request adds to its episode, not yet recorded: a start (the prompt and its ids) or the ids of the
    messages shown after the last turn; ``seen``/``text`` are the conversation it leaves."""

    start: bool
    prompt: Any  # a start: the chat or text the ids render
    ids: list[int]
    messages: list[dict]  # a continuation: the new messages, for the transcript
    seen: list[tuple] | None  # chat: the conversation's ``normal`` form
    text: str | None  # /completions: the prompt text


@dataclass(frozen=True)
class CallRecord:
    """A tool call the model wrote: failed when it could not be parsed or names no tool of the request."""

    name: str
    failed: bool
    known: bool = True  # the name is a tool of the request (metrics count any other name under UNKNOWN_TOOL)
    malformed: bool = False  # the call could not be read (``ToolCall.error``)


def _text(content: Any) -> str:
    """Message content as text: a string, ``None``, or the API's list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _rendered(render: Callable[[], Any]) -> list[int]:
    """Token ids from the chat template; whatever it raises (``raise_exception("System role not supported")``, a
    missing key) refuses the request, naming the messages."""
    try:
        return list(render())
    except Exception as e:  # noqa: BLE001 - a template is the model's code: it may raise anything
        message = f"messages cannot be rendered by the model's chat template: {type(e).__name__}: {e}"
        raise Refusal(400, message, param="messages") from e


def _arguments(arguments: Any) -> dict[str, Any]:
    """Call arguments as a dict: the API sends them as a JSON string, chat templates want the object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return {"__raw__": arguments}
    return arguments if isinstance(arguments, dict) else {"__raw__": arguments}


def normal(message: dict[str, Any]) -> tuple:
    """What makes two messages the same turn, whichever way a client serialised it (ids, ``None`` fields, arguments
    as a string or an object do not count)."""
    functions = [c.get("function", {}) for c in message.get("tool_calls") or []]
    calls = tuple((f.get("name"), json.dumps(_arguments(f.get("arguments")), sort_keys=True)) for f in functions)
    return message.get("role"), _text(message.get("content")).strip(), calls


def template_message(message: dict[str, Any], call_names: dict[str, str]) -> dict[str, Any]:
    """A message as chat templates expect it: text content, arguments as objects, tool replies named."""
    out: dict[str, Any] = {"role": message.get("role"), "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))},
            }
            for c in message["tool_calls"]
        ]
    if out["role"] == "tool":
        out["name"] = message.get("name") or call_names.get(message.get("tool_call_id", ""), "tool")
    return out


@dataclass
class ServedEpisode:
    """One episode as the endpoint served it. ``prompt_ids`` + ``ids`` is exactly what the policy last saw; ``ids``
    holds the model's turns (``model_mask`` 1, ``logps`` the sampler's) and what was shown between them (0)."""

    session: str
    row: dict[str, Any]
    budget: int  # model-written tokens still allowed (sampling.max_completion_length counts them all)
    prompt: Any = None
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    sampler_logps: bool = True  # every turn came with the sampler's log-probs (LeanDecode's come with none)
    messages: list[dict] = field(default_factory=list)  # the completion: every message after the prompt
    seen: list[tuple] = field(default_factory=list)  # the conversation so far, ``normal`` form
    text: str = ""  # /completions: the prompt text so far
    call_names: dict[str, str] = field(default_factory=dict)  # tool_call id -> tool name
    tool_names: set[str] = field(default_factory=set)
    tools: list[dict] | None = None  # the request's tool schemas: the reader types call arguments by them
    results: list[CallRecord] = field(default_factory=list)
    turns: int = 0
    unparsed: int = 0  # turns that looked like a tool call but none could be read
    requests: int = 0
    restarts: int = 0
    ended: str = "answer"  # how the last model turn ended: answer (EOS) or tokens (budget or context ran out)
    full: bool = False  # a request would have left no room for a model token: the episode ended there
    status: str = "running"  # running, done, failed, timeout
    outcome: Any = None  # what the agent returned
    error: str | None = None

    def context(
        self, tokenizer: PreTrainedTokenizerBase, kind: str, body: dict, template_kwargs: dict, limit: int
    ) -> list[int] | None:
        """The ids the policy continues for this request: the episode so far plus what the request added. ``None``
        when that would leave no room for a model token under ``limit`` positions: the episode ends here (``full``,
        ``ended`` "tokens", as a tool engine ends one whose replies do not fit); nothing of this request or a later
        one is recorded."""
        self.requests += 1
        if self.full:
            return None
        step = self._chat(tokenizer, body, template_kwargs) if kind == "chat" else self._text_prompt(tokenizer, body)
        kept = 0 if step.start else len(self.prompt_ids) + len(self.ids)
        if kept + len(step.ids) >= limit:
            self.full, self.ended = True, "tokens"
            return None
        self._record(step)
        return self.prompt_ids + self.ids

    def _chat(self, tokenizer: PreTrainedTokenizerBase, body: dict, template_kwargs: dict) -> Step:
        messages, tools = body["messages"], body.get("tools") or None  # shapes checked by check_body
        seen, norm = len(self.seen), [normal(m) for m in messages]
        self.tool_names, self.tools = {t["function"]["name"] for t in tools or []}, tools
        if self.turns and len(norm) > seen and norm[:seen] == self.seen:
            new = [template_message(m, self.call_names) for m in messages[seen:]]
            ids = _rendered(lambda: tool_suffix_ids(tokenizer, new, template_kwargs))
            return Step(False, None, ids, new, norm, None)
        chat = [template_message(m, self.call_names) for m in messages]
        ids = _rendered(
            lambda: tokenizer.apply_chat_template(
                chat, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
            )
        )
        return Step(True, chat, ids, [], norm, None)

    def _text_prompt(self, tokenizer: PreTrainedTokenizerBase, body: dict) -> Step:
        prompt = body["prompt"]
        prompt = prompt[0] if isinstance(prompt, list) else prompt  # one string, checked by check_body
        if self.turns and prompt.startswith(self.text) and len(prompt) > len(self.text):
            added = prompt[len(self.text) :]
            ids = tokenizer(added, add_special_tokens=False)["input_ids"]
            return Step(False, None, ids, [{"role": "user", "content": added}], None, prompt)
        if self.turns and prompt == self.text:
            return Step(False, None, [], [], None, prompt)
        return Step(True, prompt, tokenizer(prompt)["input_ids"], [], None, prompt)

    def _record(self, step: Step) -> None:
        if step.start:
            self.restarts += bool(self.turns)
            self._start(step.prompt, step.ids)
        else:
            self._shown(step.ids)
            self.messages += step.messages
        self.seen = step.seen if step.seen is not None else self.seen
        self.text = step.text if step.text is not None else self.text

    def _start(self, prompt: Any, ids: list[int]) -> None:
        self.prompt, self.prompt_ids, self.turns = prompt, list(ids), 0
        self.ids, self.model_mask, self.logps, self.messages, self.results = [], [], [], [], []

    def _shown(self, ids: list[int]) -> None:
        self.ids += ids
        self.model_mask += [0] * len(ids)
        self.logps += [0.0] * len(ids)

    def turn_budget(self, body: dict, limit: int) -> int:
        """Tokens the model may write now: the episode's budget, the request's ``max_tokens``, the room left under
        ``limit`` positions."""
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.budget
        return max(0, min(self.budget, asked, limit - len(self.prompt_ids) - len(self.ids)))

    def take_turn(
        self,
        tokenizer: PreTrainedTokenizerBase,
        ids: list[int],
        logps: list[float] | None,
        eos: list[int],
        fmt: Any,
        kind: str,
    ) -> dict[str, Any]:
        """Record the sampled turn and answer it: text, tool calls read from it in the model family's format
        (``fmt``, a ``ToolFormat``), answered as the API shapes them whatever the family."""
        prefix = self.prompt_ids + self.ids
        self.ids += ids
        self.model_mask += [1] * len(ids)
        self.logps += list(logps) if logps is not None else [0.0] * len(ids)
        self.sampler_logps &= logps is not None
        self.budget -= len(ids)
        self.turns += 1
        self.ended = "answer" if ids and ids[-1] in eos else "tokens"
        text = tokenizer.decode(ids, skip_special_tokens=True)
        usage = (len(self.prompt_ids) + len(self.ids) - len(ids), len(ids))
        extra = {"token_ids": list(ids), "sampler_logprobs": list(logps) if logps is not None else None}
        finish = "stop" if self.ended == "answer" else "length"
        if kind != "chat":
            self.text += text
            self.messages.append({"role": "assistant", "content": text})
            return text_reply(text, finish, usage, extra)
        return self._chat_turn(tokenizer, ids, prefix, text, fmt, finish, usage, extra)

    def _call_record(self, call: Any) -> CallRecord:
        known, unread = call.name in self.tool_names, call.error is not None
        return CallRecord(call.name, unread or not known, known, unread)

    def _chat_turn(
        self,
        tokenizer: PreTrainedTokenizerBase,
        ids: list[int],
        prefix: list[int],
        text: str,
        fmt: Any,
        finish: str,
        usage: tuple[int, int],
        extra: dict,
    ) -> dict:
        # Without ``tools`` in the request the reply is text, as the OpenAI API (and vLLM) answer: the agent parses
        # its own actions (a SkyRL-gym environment reads the model's raw text).
        content, calls = text.strip(), []
        if self.tool_names:
            reading = fmt.read(tokenizer, ids, prefix, self.tools)
            content, calls = reading.content, reading.calls
            self.unparsed += reading.unparsed is not None
        good = [c for c in calls if c.error is None]
        self.results += [self._call_record(c) for c in calls]
        if len(good) < len(calls):
            content = text.strip()  # a call that cannot be read stays in the text, as the model wrote it
        api_calls = [
            {
                "id": f"call_{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in good
        ]
        self.call_names |= {c["id"]: c["function"]["name"] for c in api_calls}
        reply = chat_reply(content, api_calls, "tool_calls" if api_calls and finish == "stop" else finish, usage, extra)
        message = reply["choices"][0]["message"]
        self.messages.append(template_message(message, self.call_names))
        self.seen.append(normal(message))
        return reply

    def empty_reply(self, kind: str) -> dict[str, Any]:
        """No token left to write, or no room (``full``): an empty answer cut by length (no token recorded; a full
        episode records nothing more at all)."""
        usage, extra = (len(self.prompt_ids) + len(self.ids), 0), {"token_ids": [], "sampler_logprobs": []}
        if kind != "chat":
            return text_reply("", "length", usage, extra)
        reply = chat_reply("", [], "length", usage, extra)
        if not self.full:
            self.seen.append(normal(reply["choices"][0]["message"]))
            self.messages.append({"role": "assistant", "content": ""})
            self.turns += 1
            self.ended = "tokens"
        return reply


def render_prompt(tokenizer: Any, prompt: Prompt, sampling: Any, chat_template: str | None = None) -> list[int]:
    """An episode's first prompt as token ids: plain text tokenized, chat messages through the chat template with
    ``sampling.chat_template_kwargs`` and the generation prompt (``chat_template``: the training template that
    replaces the tokenizer's, ``ToolFormat.chat_template``)."""
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]
    kwargs = sampling.chat_template_kwargs or {}
    kwargs = {**kwargs, "chat_template": chat_template} if chat_template else kwargs
    return list(
        tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs)
    )


def episode_reward(episode: ServedEpisode, on_error: str) -> float | None:
    """The reward the agent returned (a number; ``None`` where it returned messages); an episode that did not finish
    scores 0 (``on_error="zero"``) or ``None``."""
    if episode.status != "done":
        return 0.0 if on_error == "zero" else None
    outcome = episode.outcome
    return float(outcome) if isinstance(outcome, int | float) else None


def episode_metrics(episodes: list[ServedEpisode]) -> dict[str, float]:
    """The ``agents/*`` metrics of a rollout's episodes."""
    n = len(episodes)
    return {
        "agents/errors": sum(e.status == "failed" for e in episodes) / n,
        "agents/timeouts": sum(e.status == "timeout" for e in episodes) / n,
        "agents/requests": sum(e.requests for e in episodes) / n,
        "agents/restarts": float(sum(e.restarts for e in episodes)),
        "agents/context_full": sum(e.full for e in episodes) / n,
    }


def agent_reward(completions: list[Any], agent_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """The reward each agent returned (``None`` where it returned messages), as a reward function: add
    ``lightning_grpo.engines.agent_reward`` to ``reward_funcs``.

    >>> agent_reward(["a", "b"], agent_reward=[1.0, None])
    [1.0, None]
    """
    return list(agent_reward)
