"""Finished episodes -> a Rollout with its ``tool_mask`` and turn/tool metrics; and the chat-template questions a
multi-turn engine asks (does it render tools? which tokens follow a tool reply?).

Knows token ids and chat templates; nothing about generation or rewards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from lightning_grpo.types import Rollout

PROBE = "lightning_grpo_probe_tool"
# The metrics' name for every call naming no tool of its episode: one key, however many names a model makes up.
UNKNOWN_TOOL = "unknown"
PROBE_SCHEMA = {
    "type": "function",
    "function": {"name": PROBE, "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


def _call_messages(name: str) -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": name, "arguments": {}}}
    return [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]


def check_tool_template(tokenizer: PreTrainedTokenizerBase, schemas: list[dict], family: str = "unrecognised") -> None:
    """The chat template must show the tools, the assistant's tool calls and the tool replies; ``family`` names it
    in the refusal (TRL's name for it, ``families.template_name``)."""
    reply = {"role": "tool", "name": PROBE, "content": "lightning_grpo_probe_reply"}
    try:
        plain = tokenizer.apply_chat_template(_call_messages(PROBE)[:1], tokenize=False)
        with_tools = tokenizer.apply_chat_template(_call_messages(PROBE)[:1], tools=[PROBE_SCHEMA], tokenize=False)
        called = tokenizer.apply_chat_template([*_call_messages(PROBE), reply], tools=schemas or None, tokenize=False)
        supported = with_tools != plain and called.count(PROBE) >= 1 and reply["content"] in called
    except Exception as e:  # templates raise on roles they do not know
        supported, plain = False, repr(e)
    if not supported:
        raise ValueError(
            f"the tokenizer's chat_template ({family}) has no tool support (it must render the `tools` list, an "
            "assistant message's `tool_calls` and `tool` role messages): use a tool-calling model (Qwen2.5/Qwen3/"
            "Qwen3.5 Instruct, Llama 3.1/3.2, GLM-4.5, gpt-oss, Gemma 4 ...: references/tool_families.md) or set "
            "tokenizer.chat_template to one that does"
        )


def tool_suffix_ids(
    tokenizer: PreTrainedTokenizerBase,
    tool_messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids that follow the model's EOS-ended tool-call turn: the tool replies as the template renders them,
    then the next assistant header. Found as TRL does, by rendering a dummy conversation with and without them;
    ``template_kwargs`` are the run's ``chat_template_kwargs`` (Qwen3's ``enable_thinking`` changes the header)."""
    kwargs = template_kwargs or {}
    dummy = _call_messages(tool_messages[0].get("name") or PROBE)  # a user message may follow a call, too
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False, **kwargs)
    full = tokenizer.apply_chat_template(
        dummy + tool_messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    ends = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    prefix = prefix[: ends[-1] + 1] if ends else prefix  # align on the assistant's EOS (Qwen adds "\n" after it)
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template renders an assistant turn differently once tool replies follow it")
    return full[len(prefix) :]


@dataclass(frozen=True)
class EpisodeStats:
    turns: list[int]  # [N] model turns
    calls: list[tuple[str, bool]]  # every call: tool name, failed
    ended: list[str]  # [N] answer, tokens or turns
    malformed: int = 0  # calls that could not be read (or were cut off): never run
    unparsed: int = 0  # model turns that looked like a tool call but none could be read

    @staticmethod
    def of(episodes: list[Any]) -> EpisodeStats:
        """The episodes' counts; a call to a name that is no tool of its episode is counted as ``UNKNOWN_TOOL``,
        so misspelt names do not grow the set of metric keys."""
        calls = [(r.name if r.known else UNKNOWN_TOOL, r.failed) for e in episodes for r in e.results]
        malformed = sum(r.malformed for e in episodes for r in e.results)
        unparsed = sum(e.unparsed for e in episodes)
        return EpisodeStats([e.turns for e in episodes], calls, [e.ended for e in episodes], malformed, unparsed)

    def metrics(self) -> dict[str, float]:
        """TRL's ``tools/call_frequency`` (calls per episode) and ``tools/failure_frequency`` (per call), the
        calls that could not be read (``tools/malformed_frequency``, per call), the model turns that looked like a
        call but yielded none (``tools/unparsed_frequency``, per turn), per-tool failure rates, turns per episode
        and how episodes were cut short."""
        n, calls = len(self.turns), len(self.calls)
        out = {
            "turns/mean": sum(self.turns) / n,
            "turns/max": float(max(self.turns)),
            "tools/call_frequency": calls / n,
            "tools/failure_frequency": sum(f for _, f in self.calls) / calls if calls else 0.0,
            "tools/malformed_frequency": self.malformed / calls if calls else 0.0,
            "tools/unparsed_frequency": self.unparsed / sum(self.turns) if sum(self.turns) else 0.0,
            "episodes/truncated_by_turns": self.ended.count("turns") / n,
            "episodes/truncated_by_tokens": self.ended.count("tokens") / n,
        }
        for name in sorted({name for name, _ in self.calls}):
            failed = [f for tool, f in self.calls if tool == name]
            out[f"tools/{name}/failure_frequency"] = sum(failed) / len(failed)
        return out

    def rollout(
        self,
        tokenizer: PreTrainedTokenizerBase,
        episodes: list[Any],
        group_size: int,
        truncated_prompts: int,
        columns: dict[str, list[Any]],
        metrics: dict[str, float],
        device: torch.device,
    ) -> Rollout:
        """Left-padded prompts, right-padded completions; ``completion_mask`` 1 on every episode token,
        ``tool_mask`` 1 on the model's own; truncated = the token budget ran out mid-turn (no EOS)."""
        return Rollout.from_token_lists(
            [e.prompt_ids for e in episodes],
            [e.ids for e in episodes],
            tokenizer.pad_token_id,
            is_truncated=[e == "tokens" for e in self.ended],
            tool_mask=[e.model_mask for e in episodes],
            device=device,
            prompts=[e.prompt for e in episodes],
            completions=[e.messages for e in episodes],
            group_size=group_size,
            num_truncated_prompts=truncated_prompts,
            columns=columns,
            metrics=metrics,
        )
