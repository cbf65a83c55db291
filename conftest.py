"""Collection of the package's own doctests (``--doctest-modules`` imports every module of ``lightning_grpo``).

A module that cannot be imported without an optional extra (``tests/extras.py``'s ``NEEDS_EXTRA``) is collected
only where that extra is installed, so the README's test command, after ``pip install -e ".[dev]"``, collects
without it (``tests/test_install.py``).
"""

from extras import NEEDS_EXTRA, installed  # tests/ is on the path (pyproject.toml: pythonpath)

collect_ignore = [path for path, (_, module) in NEEDS_EXTRA.items() if not installed(module)]
