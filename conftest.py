"""Collection of the package's own doctests (``--doctest-modules`` imports every module of ``lightning_grpo``).

A module that cannot be imported without an optional extra (``[project.optional-dependencies]`` in pyproject.toml)
is collected only where that extra is installed, so the README's test command, after ``pip install -e ".[dev]"``,
collects without it. ``tests/test_install.py`` checks that this table names every such module.
"""

from __future__ import annotations

import importlib

# module file -> (the extra that installs what it imports at its top, the module it imports)
NEEDS_EXTRA = {
    "lightning_grpo/demo/guess.py": ("openenv", "openenv.core.env_server.interfaces"),
}


def _installed(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


collect_ignore = [path for path, (_, module) in NEEDS_EXTRA.items() if not _installed(module)]
