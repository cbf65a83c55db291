"""What ``lightning-grpo --help`` and ``fit --help`` print: the descriptions, one line per option (its docstring's
first clause and its default, at 80 columns), and the parser whose errors name the fix (``did_you_mean``). Knows
jsonargparse's help formatter; nothing about training."""

from __future__ import annotations

import re
from argparse import SUPPRESS
from typing import Any, NoReturn

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser

from lightning_grpo.cli.suggest import did_you_mean

DESCRIPTION = (
    "GRPO fine-tuning of language models with PyTorch Lightning. "
    "`lightning-grpo fit --config CONFIG.yaml` trains; "
    "`lightning-grpo report RUN_DIR` draws a run's training curves as PNG and HTML; "
    "`lightning-grpo export CHECKPOINT OUT` writes a distributed checkpoint in Hugging Face format. "
    "Import paths in a config (reward_funcs, class_path) also find modules in the working directory and next "
    "to the config file."
)
FIT_DESCRIPTION = (
    "Trains. Each option shows its choices and, in brackets, its default; `--SECTION.KEY.help CLASS` shows the "
    "options of a class given to a setting (`--model.rollout_engine.help lightning_grpo.engines.VLLMColocate`)."
)
# jsonargparse lists every known subclass of a type in its help: 628 lines for `model: str | nn.Module` alone.
KNOWN_SUBCLASSES = re.compile(r", known subclasses: [^)]*")
TYPE = re.compile(r"type: .*?(, default: |\)$)")
RST = re.compile(r":\w+:`~?([^`]+)`|``([^`]+)``")  # :class:`x` and ``x`` -> `x`
FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[^a-z(])|;\s")  # a sentence's first clause
ABBREVIATIONS = ("e.g.", "i.e.", "Dr.", "vs.", "etc.")
HELP_OPTION = "Show the help for the given subclass of "
HELP_POSITION = 6  # argparse's default
DEFAULT = re.compile(r"(, )?default: %\(default\)s")


def first_clause(doc: str) -> str:
    """The text up to its first sentence end or semicolon outside parentheses and after no abbreviation.

    >>> first_clause("AdamW learning rate (TRL's default 1e-6 suits pretrained models; 1e-3 here). More.")
    "AdamW learning rate (TRL's default 1e-6 suits pretrained models; 1e-3 here)."
    >>> first_clause("extra arguments, e.g. `{top_k: 5}`; more")
    'extra arguments, e.g. `{top_k: 5}`'
    """
    for match in FIRST_SENTENCE.finditer(doc):
        head = doc[: match.start()]
        if head.count("(") == head.count(")") and not head.endswith(ABBREVIATIONS):
            return head
    return doc


def default_text(action: Any) -> str:
    """`` [0.2]`` for a default of 0.2 (``true``/``false`` as in YAML), `` [KLAlert]`` for a class; nothing for
    ``None``."""
    default = action.default
    if default is None or default == SUPPRESS or isinstance(default, (dict, list)) and not default:
        return ""
    if isinstance(default, dict) and "class_path" in default:
        return f" [{default['class_path'].rpartition('.')[2]}]"
    return f" [{str(default).lower() if isinstance(default, bool) else default}]"


USAGE = "%(prog)s [-h] [-c CONFIG] [--print_config] [--SECTION.KEY VALUE ...]"


class HelpFormatter(DefaultHelpFormatter):
    """``--help`` that fits on a few screens: each option with its choices and ``[default]``, its help's first
    clause on the same line when both fit, else below it; no lists of known subclasses and no ``--X.help CLASS``
    entries (the description says once that ``--model.model.help CLASS`` shows a class's options). The
    docstrings hold the rest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_help_position", HELP_POSITION)
        super().__init__(*args, **kwargs)

    def start_section(self, heading: str | None) -> None:
        super().start_section(heading and RST.sub(lambda m: f"`{m.group(1) or m.group(2)}`", heading))

    def _format_action(self, action: Any) -> str:
        nested_file = action.help == "Path to a configuration file." and action.option_strings != ["--config"]
        class_help = str(action.help).startswith(HELP_OPTION)  # `--X.help CLASS`: said once, in the description
        if nested_file or class_help:  # every section takes a file
            return ""
        text = super()._format_action(action)
        lines = text.splitlines()  # the option, then its help below it at HELP_POSITION
        one_line = f"{lines[0]}  {lines[-1].strip()}" if len(lines) == 2 else ""
        return one_line + "\n" if one_line and len(one_line) <= self._width else text

    def _format_action_invocation(self, action: Any) -> str:
        """``--model.seed [0]``, not ``--model.seed SEED, --model.seed+ SEED`` and ``(default: 0)`` after the help:
        the name says the value; the choices and the default (in brackets) stay on the option's line."""
        explicit = action.metavar and not str(action.metavar).startswith("{")  # `--print_config [=flags]`
        if not action.option_strings or action.nargs == 0 or explicit:
            return super()._format_action_invocation(action)
        names = ", ".join(o for o in action.option_strings if not o.endswith("+"))
        choices = action.metavar if str(action.metavar).startswith("{") else ""  # jsonargparse's {true,false,null}
        choices = choices or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices is not None else "")
        return names + (" " + choices if choices else "") + default_text(action)

    def _get_help_string(self, action: Any) -> str:
        text = KNOWN_SUBCLASSES.sub("", super()._get_help_string(action))
        text = TYPE.sub(lambda m: m.group(1).lstrip(", "), text)
        if action.option_strings and action.nargs != 0:  # the default is on the option's line
            text = DEFAULT.sub("", text).replace(", )", ")").replace(" ()", "")
        text = RST.sub(lambda m: f"`{m.group(1) or m.group(2)}`", text)
        if text.startswith(HELP_OPTION):  # the `--X.help CLASS` options
            return "options of one " + text.removeprefix(HELP_OPTION).removesuffix(" and exit.")
        doc, paren, details = text.rpartition(" (") if text.endswith(")") else (text, "", "")
        return first_clause(doc) + paren + details


class GRPOArgumentParser(LightningArgumentParser):
    """Full option names only, a one-line usage on errors, and a did-you-mean for a mistyped option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --model.num_generation must not set num_generations
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("usage", USAGE)  # the generated one lists every option: 130 lines above an error
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        parser = getattr(ex, "subcommand_parser", None) or self
        subcommands = getattr(parser, "_subcommands_action", None)
        parsers = [parser, *(subcommands.choices.values() if subcommands else [])]
        options = [o for p in parsers for o in p._option_string_actions]
        super().error(message + did_you_mean(message, options), ex)
