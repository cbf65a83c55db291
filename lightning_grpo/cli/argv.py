"""The command line before LightningCLI reads it: ``--config NAME`` of a shipped template resolved to its file,
every ``--config`` file parsed as YAML first (a syntax error named by file and line, moved sections named together),
``--model.distill null`` turned into what jsonargparse takes, bare ``fit`` told what to run, and the configs'
directories made importable. Knows argv, YAML and the shipped templates; nothing about training.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning_grpo.callbacks.alert_set import MOVED


def importable_dirs(argv: list[str]) -> list[str]:
    """The working directory and the directory of every ``--config`` / ``-c`` file, appended to ``sys.path``
    (after the installed packages) so a config's import paths find ``my_rewards.py`` next to it."""
    configs = [b for a, b in zip(argv, argv[1:]) if a in ("--config", "-c")]
    configs += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    dirs = [str(Path.cwd())] + [str(Path(c).resolve().parent) for c in configs if Path(c).is_file()]
    added = [d for d in dict.fromkeys(dirs) if d not in sys.path]
    sys.path.extend(added)
    return added


TEMPLATES = Path(__file__).parent.parent / "templates"


def bundled_templates() -> list[str]:
    return sorted(p.stem for p in TEMPLATES.glob("*.yaml"))


def section_off(argv: list[str]) -> list[str]:
    """``argv`` with ``--model.distill null`` (how one turns a section off; jsonargparse reads the value of a
    section's own flag as a config file and refuses ``null``) given as ``--model.distill.teacher null``: no teacher,
    no distillation."""
    out, i = [], 0
    while i < len(argv):
        pair = argv[i] == "--model.distill" and argv[i + 1 : i + 2] == ["null"]
        out.append("--model.distill.teacher=null" if pair or argv[i] == "--model.distill=null" else argv[i])
        i += 2 if pair else 1
    return out


def resolve_configs(argv: list[str]) -> list[str]:
    """``argv`` with every ``--config NAME`` that is not an existing file but names a shipped template (``tiny_cpu``
    or ``tiny_cpu.yaml``) replaced by that template's path; a missing file that names none is an error listing them.
    """
    out = list(argv)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag not in ("--config", "-c") or (not eq and i + 1 == len(out)):
            continue
        value = value if eq else out[i + 1]
        if Path(value).exists():
            continue
        template = TEMPLATES / f"{Path(value).name.removesuffix('.yaml')}.yaml"
        if not template.is_file() or Path(value).parent not in (Path("."), Path("templates")):
            raise SystemExit(
                f"lightning-grpo: error: --config {value!r} is neither a file nor a shipped template; the templates "
                f"are {', '.join(bundled_templates())} (e.g. --config tiny_cpu)"
            )
        if eq:
            out[i] = f"{flag}={template}"
        else:
            out[i + 1] = str(template)
    return out


def check_yaml(argv: list[str]) -> None:
    """Every ``--config`` file parsed as YAML first, so a syntax error names the file and its line (jsonargparse
    names ``<unicode string>``); a tab in the indentation, YAML's most common one, says to use spaces. The sections
    that moved (``kl_alert:``) are named together, with where each went."""
    import yaml

    for path in [Path(b) for a, b in zip(argv, argv[1:]) if a in ("--config", "-c")] + [
        Path(a.split("=", 1)[1]) for a in argv if a.startswith("--config=")
    ]:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SystemExit(f"lightning-grpo: error: --config {str(path)!r}: {yaml_problem(err, text)}") from None
        moved = (
            [f"`{key}:` moved to `{MOVED[key]}:`" for key in config if key in MOVED] if isinstance(config, dict) else []
        )
        if moved:  # every moved section at once, not one per try
            raise SystemExit(
                f"lightning-grpo: error: --config {str(path)!r}: {', '.join(moved)}, the same settings under it"
            )


def yaml_problem(err: Any, text: str) -> str:
    """``line 3: a tab in the indentation ...`` or the parser's own words, with the line where it stopped."""
    mark = getattr(err, "problem_mark", None)
    if mark is None:
        return str(err)
    line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
    if "\t" in line[: len(line) - len(line.lstrip())]:
        return f"line {mark.line + 1} indents with a tab: YAML indents with spaces only; replace the tab with spaces"
    return f"line {mark.line + 1}, column {mark.column + 1}: {err.problem} ({err.context or 'not valid YAML'})"


def check_not_bare(argv: list[str]) -> None:
    """``lightning-grpo fit`` with neither a config nor a dataset: say what to run instead of failing on the first
    missing setting."""
    asks = ("-h", "--help", "--print_config", "--config", "-c")
    if argv[:1] != ["fit"] or any(a.startswith(asks) or a.split("=")[0].endswith(".help") for a in argv):
        return  # `--alerts.kl.help KLAlert` asks for a class's options
    if not any(a.startswith("--data.dataset") or a.startswith("--data=") for a in argv):
        raise SystemExit(
            "lightning-grpo fit needs a config: `lightning-grpo fit --config tiny_cpu` trains the embedded tiny "
            f"model (shipped templates: {', '.join(bundled_templates())}), or `--config my_run.yaml`, or the "
            "settings on the command line (--data.dataset and --model.reward_funcs at least). "
            "`lightning-grpo fit --help` lists every setting."
        )
