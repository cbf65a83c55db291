"""A tokenizer's chat template -> how a tool run reads the model's calls and renders the turns around them.

Each model family writes tool calls its own way (Qwen ``<tool_call>{json}</tool_call>``, Llama 3.1/3.2 a bare
``{"name": ..., "parameters": ...}``, gpt-oss harmony channels, GLM-4.5 and Qwen3.5 XML, Gemma 4, LFM2 ...). We
write no parser per family: TRL 1.16 knows the response template of each chat template it ships
(``add_response_schema``) and transformers reads a reply with it (``parse_response``, given the prompt before the
reply and the tools); a template TRL does not know but that renders Hermes ``<tool_call>`` JSON (probed by rendering a
call) is read by ``HermesParser``; a user's ``parser`` replaces both. A template that is not prefix-preserving is
swapped for TRL's training version for every prompt and tool turn (as TRL's GRPOTrainer does). Anything else is
refused before compute is spent (tool engines) or said once (the agent endpoint).
Knows chat templates, token ids and TRL's response templates; nothing about generation, tools' code or rewards.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.engines.multiturn.calls import HermesParser, ToolCall, call_of
from lightning_grpo.engines.multiturn.episodes import check_tool_template

UNRECOGNISED = "unrecognised"
READERS = ("response_template", "hermes", "parser", "none")  # how a format reads a reply; "none": it cannot
# What a tool call looks like in any family's format we know: a reply with one of these and no call read is
# "unparsed" (a malformed call, or the model writing another family's format), counted and answered with an error.
CALL_MARKERS = re.compile(
    r"<tool_call>|<\|python_tag\|>|\[TOOL_CALLS\]|<｜tool▁calls▁begin｜>|<｜tool▁call▁begin｜>|<\|tool_call>"
    r"|<\|tool_call_start\|>|to=functions\.|<function=|"
    r'\{\s*"name"\s*:\s*"[^"]*"\s*,\s*"(?:arguments|parameters)"\s*:'
)
WORKS = (
    "tool calls are read for the chat templates TRL ships a response template for (references/tool_families.md: "
    "Qwen2.5/Qwen3/Qwen3.5/Qwen3.6, Llama 3.1/3.2, GLM-4.5, gpt-oss, Gemma 4, LFM2, Nemotron 3) and for any template "
    "that renders Hermes <tool_call>{json}</tool_call>; for another, set tokenizer.response_template (transformers' "
    "response parsing) or give parser: (an object with parse(text) -> (content, [ToolCall]))"
)


@cache
def trl_templates() -> dict[str, str]:
    """TRL's chat templates by name (``llama3_2``), read from its package: byte-identical to the models' own."""
    import trl.chat_template_utils as utils

    folder = Path(utils.__file__).parent / "chat_templates"
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}


def template_name(chat_template: Any) -> str:
    """TRL's name for a template whose text equals one of its files, else ``"unrecognised"``.

    >>> template_name(trl_templates()["llama3_2"]), template_name("{{ messages }}")
    ('llama3_2', 'unrecognised')
    """
    if isinstance(chat_template, dict):  # named variants: the default one is the chat template
        chat_template = chat_template.get("default")
    return next((name for name, text in trl_templates().items() if text == chat_template), UNRECOGNISED)


@dataclass
class Reading:
    """One model turn read: its text, its calls in order, what else the family's template parses (reasoning);
    ``unparsed`` holds the text when it looks like a call but none could be read."""

    content: str
    calls: list[ToolCall]
    fields: dict[str, Any] = field(default_factory=dict)
    unparsed: str | None = None


@dataclass
class ToolFormat:
    """How one run reads tool calls and renders tool turns; ``setup`` builds it once from the tokenizer.

    ``chat_template`` is TRL's prefix-preserving training template that replaces the tokenizer's own for every
    prompt and tool turn, or ``None`` (the tokenizer's own is prefix-preserving); the tokenizer is never changed
    but for the ``response_template`` TRL's ``add_response_schema`` sets on it, as TRL's trainer does.
    """

    family: str  # TRL's template name, or "unrecognised"
    reader: str  # one of READERS
    chat_template: str | None = None
    parser: Any = None  # the text parser: HermesParser or the user's
    response_template: dict[str, Any] | None = None  # what transformers' parser reads, for reader "response_template"

    def render_kwargs(self, template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """``apply_chat_template`` keyword arguments: the run's ``chat_template_kwargs`` and the training template."""
        kwargs = dict(template_kwargs or {})
        return {**kwargs, "chat_template": self.chat_template} if self.chat_template else kwargs

    def read(
        self, tokenizer: PreTrainedTokenizerBase, ids: list[int], prefix: list[int], tools: list[dict] | None
    ) -> Reading:
        """The turn ``ids`` that followed ``prefix`` (the prompt and the episode so far), read in the family's
        format. A reply that looks like a call but yields none becomes one unreadable ``ToolCall`` (its ``error``
        is the model's tool reply) unless the format cannot read calls at all (``reader`` "none")."""
        if self.reader == "response_template":
            if getattr(tokenizer, "response_template", None) is None:  # a tokenizer loaded again (a producer process)
                tokenizer.response_template = copy.deepcopy(self.response_template)
            reading = _parsed(tokenizer, ids, prefix, tools)
        elif self.reader == "none":
            reading = Reading(tokenizer.decode(ids, skip_special_tokens=True).strip(), [])
        else:
            content, calls = self.parser.parse(tokenizer.decode(ids, skip_special_tokens=True))
            reading = Reading(content, list(calls))
        raw = tokenizer.decode(ids, skip_special_tokens=False)
        if reading.calls or self.reader == "parser" or not CALL_MARKERS.search(raw):
            return reading  # a user's parser decides alone what a call is
        reading.unparsed = raw
        if self.reader != "none":
            why = f"a tool call was written but cannot be read as a {self.family} tool call: {raw.strip()[:200]}"
            reading.calls = [ToolCall("unknown", error=why)]
        return reading


def _parsed(tokenizer: PreTrainedTokenizerBase, ids: list[int], prefix: list[int], tools: list[dict] | None) -> Reading:
    """TRL's ``parse_response``: the family's response template, arguments typed by the tools' schemas (a reply it
    cannot parse comes back as plain text)."""
    from trl.chat_template_utils import parse_response

    parsed = parse_response(tokenizer, list(ids), prefix=list(prefix), tools=tools or None)
    calls = [_tool_call(c) for c in parsed.get("tool_calls") or []]
    fields = {k: v for k, v in parsed.items() if k not in ("role", "content", "tool_calls")}
    return Reading(parsed.get("content") or "", calls, fields)


def _tool_call(call: dict[str, Any]) -> ToolCall:
    """A parsed ``{"type": "function", "function": {"name", "arguments"}}`` as our ``ToolCall``."""
    function = call.get("function", call)
    return call_of(str(function.get("name")), function.get("arguments") or {})


def training_template(tokenizer: PreTrainedTokenizerBase, family: str) -> str | None:
    """TRL's prefix-preserving training template when the tokenizer's own is not (a tool turn's tokens must follow
    the episode's exactly), else ``None``; a template with none is refused with the reason."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    try:
        if is_chat_template_prefix_preserving(tokenizer):
            return None
        template = get_training_chat_template(tokenizer)
    except Exception as e:  # noqa: BLE001 - a template is the model's code: it may raise anything
        raise ValueError(
            f"the tokenizer's chat_template ({family}) cannot be used for tool turns: it renders an assistant turn "
            f"differently once tool replies follow it (not prefix-preserving) and TRL has no training version of it "
            f"({type(e).__name__}: {e}); set tokenizer.chat_template to a prefix-preserving one"
        ) from e
    rank_zero_info(
        f"the chat template ({family}) is not prefix-preserving: prompts and tool turns are rendered with TRL's "
        f"training version of it ({family}_training.jinja), as TRL's GRPOTrainer does"
    )
    return template


def renders_hermes(tokenizer: PreTrainedTokenizerBase, chat_template: str | None) -> bool:
    """Whether the template writes an assistant's call as Hermes ``<tool_call>{json}</tool_call>``: a call rendered
    by it is read back by ``HermesParser``."""
    call = {"type": "function", "function": {"name": "lightning_grpo_probe", "arguments": {"x": 1}}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=chat_template)
    except Exception:  # noqa: BLE001 - a template that cannot render a call does not render Hermes calls
        return False
    return [(c.name, c.arguments) for c in HermesParser().parse(text)[1]] == [("lightning_grpo_probe", {"x": 1})]


def tool_format(
    tokenizer: PreTrainedTokenizerBase, schemas: list[dict], parser: Any = None, refuse: bool = True
) -> ToolFormat:
    """How this run reads and renders tool calls. A template that renders no tool calls, or writes them in a
    format none of the readers knows, is refused (``refuse``: tool engines, whose episodes would silently have no
    tool turn) or warned about once (the agent endpoint, whose agents may parse their own calls): it then answers
    with text."""
    family = template_name(tokenizer.chat_template)
    try:
        check_tool_template(tokenizer, schemas, family)
        chat_template = training_template(tokenizer, family)
        return _reader(tokenizer, family, chat_template, parser)
    except ValueError as e:
        if refuse:
            raise
        rank_zero_warn(
            f"{e}. The agent endpoint answers requests that carry tools with text only (no tool_calls); agents that "
            "read the model's text themselves are unaffected"
        )
        return ToolFormat(family, "none")


def _reader(tokenizer: PreTrainedTokenizerBase, family: str, chat_template: str | None, parser: Any) -> ToolFormat:
    """The user's parser; else the tokenizer's response template, or TRL's for the family; else Hermes."""
    from trl.chat_template_utils import add_response_schema

    if parser is not None:
        return ToolFormat(family, "parser", chat_template, parser)
    if getattr(tokenizer, "response_template", None) is None:
        try:
            add_response_schema(tokenizer)  # TRL's template for the family, where it knows one
        except ValueError:
            pass
    if getattr(tokenizer, "response_template", None) is not None:
        return ToolFormat(family, "response_template", chat_template, None, tokenizer.response_template)
    if renders_hermes(tokenizer, chat_template):
        return ToolFormat(family, "hermes", chat_template, HermesParser())
    unknown = f"the tokenizer's chat_template ({family}) writes tool calls in a format no reader here knows"
    raise ValueError(f"{unknown}: {WORKS}")
