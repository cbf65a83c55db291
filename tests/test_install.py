"""The README's test command on a fresh clone: after ``pip install -e ".[dev]"`` alone, ``pytest -q`` collects.

An optional extra's packages are made unimportable here (a folder of stand-ins that raise ImportError, first on the
path) and the whole suite is collected as the README's command collects it: a module that imports an extra at its
top must be in ``tests/extras.py``'s ``NEEDS_EXTRA`` (the root ``conftest.py`` reads it), and a test that needs
one must skip without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from extras import DEV, EXTRA_MODULES
from helpers import ROOT

tomllib = pytest.importorskip("tomllib")


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_extra_is_known_here():
    assert sorted(extras()) == sorted([*EXTRA_MODULES, DEV])


def blocked_folder(tmp_path: Path, modules: set[str]) -> Path:
    """A folder that, first on ``sys.path``, makes each of ``modules`` raise ImportError as a missing one would."""
    for name in modules:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    return tmp_path


def test_the_readme_test_command_collects_with_only_the_dev_extra(tmp_path):
    dev = {line.split(">")[0].split("[")[0].replace("-", "_") for line in extras()[DEV]}
    missing = {module for modules in EXTRA_MODULES.values() for module in modules} - dev
    assert "openenv" in missing  # the extra whose top-level import once broke the README's command
    env = {**os.environ, "PYTHONPATH": str(blocked_folder(tmp_path, missing)), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert "error" not in done.stdout.splitlines()[-1], tail
