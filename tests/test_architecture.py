"""The package's shape: data flows one way through the stages, callbacks read a typed record, import is lean."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_grpo

PACKAGE = Path(lightning_grpo.__file__).parent

# A module may import its own layer and those below; never one above. Every module must be listed here, so a
# new one has to be placed deliberately.
LAYERS = {
    "types": 0,
    "checks": 0,
    "demo": 0,  # the embedded tasks and models
    "sandbox": 0,  # execution infrastructure: used by the code reward and the tool engine
    "deadline": 0,  # a callable with a timeout: reward calls and tool calls
    "data": 1,
    "rewards": 1,
    "model": 1,  # the model substrate: loading, materialize, sharding, log-probs, prefix, Policy
    "rollout": 3,
    "engines": 3,
    "advantages": 3,
    "loss": 3,
    "optim": 3,
    "metrics": 4,
    "ranks": 4,
    "targets": 4,
    "dynamic": 4,
    "run": 4,  # the run directory, its checkpoint, logging a step
    "settings": 5,
    "module": 5,
    "callbacks": 6,
    "cli": 6,  # fit, report, selfcheck
    "__init__": 7,
    "__main__": 7,
    "templates": 8,  # shipped example scripts: they use the public API, like a user's program
}
MODULE_INTERNALS = {"module", "targets", "model", "engines", "ranks", "settings"}  # callbacks read the record


def stage(path: Path) -> str:
    """The top-level name under the package: ``rewards`` for rewards/code_execution.py, ``loss`` for loss/grpo.py."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def is_stage(name: str) -> bool:
    """``from lightning_grpo import loss`` imports a stage; ``from lightning_grpo import GRPOModule`` a name."""
    return (PACKAGE / f"{name}.py").exists() or (PACKAGE / name).is_dir()


def package_imports(path: Path) -> set[str]:
    """Stages of lightning_grpo that ``path`` imports (``from lightning_grpo.x import`` and ``import ...``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + (
                [f"{node.module}.{a.name}" for a in node.names if is_stage(a.name)]
                if node.module == "lightning_grpo"
                else []
            )
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "lightning_grpo" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_import_points_down_the_stages():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = stage(path)
        assert own in LAYERS, f"{path} is in no layer of tests/test_architecture.py: place it"
        for other in package_imports(path) - {own}:
            assert other in LAYERS, f"{path} imports lightning_grpo.{other}, which is in no layer"
            if LAYERS[other] > LAYERS[own] or (own == "callbacks" and other in MODULE_INTERNALS):
                wrong.append(f"{path.relative_to(PACKAGE)} imports lightning_grpo.{other}")
    assert not wrong, "imports against the flow of data:\n" + "\n".join(wrong)


def test_the_check_catches_an_upward_import(tmp_path):
    bad = tmp_path / "loss.py"
    bad.write_text("from lightning_grpo.module import GRPOModule\n")
    assert package_imports(bad) == {"module"} and LAYERS["module"] > LAYERS["loss"]


# The baseline is what any Lightning + transformers program loads (transformers' accelerate sets a filter itself).
LEAN_CHECK = """
import sys, warnings
import lightning, transformers.modeling_utils
before, filters = set(sys.modules), list(warnings.filters)
import lightning_grpo
from lightning_grpo import GRPOModule, PromptDataModule
heavy = sorted({m.split('.')[0] for m in set(sys.modules) - before} & {HEAVY})
print(heavy, warnings.filters == filters)
"""


def test_import_loads_no_heavy_optional_library_and_no_warning_filter():
    heavy = {"datasets", "pandas", "pyarrow", "peft", "math_verify", "trl", "sympy", "matplotlib"}
    code = LEAN_CHECK.replace("{HEAVY}", repr(heavy))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[] True"


@pytest.mark.parametrize("hook_file", sorted(p.name for p in (PACKAGE / "callbacks").glob("*.py")))
def test_callback_hooks_are_marked_override(hook_file):
    tree = ast.parse((PACKAGE / "callbacks" / hook_file).read_text())
    hooks = ("on_", "state_dict", "load_state_dict", "setup", "teardown", "state_key")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name.startswith(hooks):
                    decorators = {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}
                    assert "override" in decorators, f"{hook_file}: {node.name}.{fn.name} lacks @override"
