"""Did-you-mean for a mistyped setting, on the command line and in config files: an unknown option, a setting
that moved into a section, a misspelt import path (``reward_funcs: [lightning_grpo.rewards.exact_match_rewrd]``)
and a misspelt ``init_args`` key of a ``class_path`` object. Knows jsonargparse's error wording; nothing else.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re

from lightning_grpo.callbacks.alert_set import MOVED as MOVED_SECTIONS
from lightning_grpo.settings import MOVED

NO_ATTRIBUTE = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")
NOT_ACCEPTED = re.compile(r"Problem with given class_path '([\w.]+)':\s+Option '(\w+)' is not accepted")


def unknown_options(message: str) -> list[str]:
    """The options an error message says are unknown: given on the command line (``unrecognized arguments:
    --model.num_generatons 4``) or in a config file (``Group 'model' does not accept option 'num_generatons'``)."""
    unknown = re.findall(r"(--[\w.]+)", message.split("arguments:", 1)[-1]) if "arguments:" in message else []
    in_files = re.findall(r"Group '([\w.]+)' does not accept option '([\w.]+)'", message)
    nested = re.findall(r"Subcommand '\w+' does not accept option '([\w.]+)'", message)
    return unknown + [f"--{g}.{o}" for g, o in in_files] + [f"--{o}" for o in nested]


def did_you_mean(message: str, options: list[str]) -> str:
    """``; did you mean --model.num_generations?`` for each unknown option in an error message, and the new place of
    a setting that moved into a section (``--model.num_iterations`` -> ``--model.update.num_iterations``).

    >>> did_you_mean("unrecognized arguments: --model.num_generatons 4", ["--model.num_generations", "--data.x"])
    '; did you mean --model.num_generations?'
    >>> did_you_mean("Group 'model' does not accept option 'num_generation'", ["--model.num_generations"])
    '; did you mean --model.num_generations?'
    >>> did_you_mean("unrecognized arguments: --model.peft_config {}", [])
    '; --model.peft_config moved to --model.policy.peft_config (settings sections: `lightning-grpo fit --help`)'
    >>> did_you_mean("Subcommand 'fit' does not accept option 'kl_alert.max_kl'", [])
    '; --kl_alert.max_kl moved to --alerts.kl.max_kl (settings sections: `lightning-grpo fit --help`)'
    """
    unknown = unknown_options(message)
    keys = {u: u[8:].split(".")[0] for u in unknown if u.startswith("--model.")}  # --model.peft_config.r: peft_config
    moved = [f"--model.{k} moved to --model.{MOVED[k]}" for k in dict.fromkeys(keys.values()) if k in MOVED]
    moved += moved_sections(unknown)
    if moved:
        return "; " + ", ".join(moved) + " (settings sections: `lightning-grpo fit --help`)"
    close = [m for u in unknown if u not in options for m in difflib.get_close_matches(u, options, n=1, cutoff=0.8)]
    close += import_suggestions(message) + init_args_suggestions(message)
    return f"; did you mean {', '.join(dict.fromkeys(close))}?" if close else ""


def moved_sections(options: list[str]) -> list[str]:
    """``--kl_alert.max_kl moved to --alerts.kl.max_kl`` for each option of a section that became part of another
    (``callbacks/alert_set.py``'s ``MOVED``)."""
    out = []
    for option in options:
        section, dot, rest = option.removeprefix("--").partition(".")
        if section in MOVED_SECTIONS:
            out.append(f"{option} moved to --{MOVED_SECTIONS[section]}{dot}{rest}")
    return out


def import_suggestions(message: str) -> list[str]:
    """``module.name`` for each misspelt ``module.nme`` import path in an error message.

    >>> import_suggestions("module 'lightning_grpo.rewards' has no attribute 'exact_match_rewrd'")
    ['lightning_grpo.rewards.exact_match_reward']
    """
    out = []
    for module, name in NO_ATTRIBUTE.findall(message):
        try:
            names = dir(importlib.import_module(module))
        except ImportError:
            continue
        out += [f"{module}.{m}" for m in difflib.get_close_matches(name, names, n=1, cutoff=0.8)]
    return out


def init_args_suggestions(message: str) -> list[str]:
    """``init_args.name`` for each misspelt ``init_args`` key of a ``class_path`` object in an error message.

    >>> init_args_suggestions(
    ...     "Problem with given class_path 'lightning.pytorch.callbacks.ModelCheckpoint':\\n"
    ...     "   Option 'every_n_train_step' is not accepted"
    ... )
    ['init_args.every_n_train_steps']
    """
    out = []
    for path, name in NOT_ACCEPTED.findall(message.replace("\\n", "\n")):
        module, _, attr = path.rpartition(".")
        try:
            params = list(inspect.signature(getattr(importlib.import_module(module), attr)).parameters)
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
        out += [f"init_args.{m}" for m in difflib.get_close_matches(name, params, n=1, cutoff=0.8)]
    return out
