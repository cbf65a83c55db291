"""The optional extras (``[project.optional-dependencies]``) as the tests see them: what each installs, which
package modules import one at their top, and whether it is installed here. The README's test command installs
``dev`` alone, so whatever needs another extra is skipped, never an error, without it."""

from __future__ import annotations

import importlib
import re

# extra -> the top-level modules its packages install; `dev` is what the README's test command installs
EXTRA_MODULES = {
    "agents": ["aiohttp", "openai"],
    "skyrl": ["skyrl_gym", "aiohttp", "openai"],
    "openenv": ["openenv"],
    "loggers": ["mlflow", "wandb"],
    "gguf": ["gguf"],
}
DEV = "dev"

# package module file -> (the extra that installs what it imports at its top, the module it imports)
NEEDS_EXTRA = {
    "lightning_grpo/demo/guess.py": ("openenv", "openenv.core.env_server.interfaces"),
}


def installed(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_extra(text: str) -> str | None:
    """The extra that ``text`` (a doc block, a config) needs and this environment lacks: it names a module of
    ``NEEDS_EXTRA`` (``lightning_grpo.demo.guess``) or the extra's own package; None when nothing is missing."""
    for path, (extra, module) in NEEDS_EXTRA.items():
        dotted = path.removesuffix(".py").replace("/", ".")
        top = module.split(".")[0]
        if re.search(rf"\b({re.escape(dotted)}|{top}\.)", text) and not installed(module):
            return extra
    return None
