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
    "checks": 0,  # settings checks: (ok, message) pairs -> one error naming every problem
    "docstrings": 0,  # a settings section's field docstrings -> its --help (field_help)
    "demo": 0,  # the embedded tasks and models
    "sandbox": 0,  # execution infrastructure: used by the code reward and the tool engine
    "deadline": 0,  # a callable with a timeout: reward calls and tool calls
    "data": 1,
    "images": 1,  # image columns: opened lazily, checked before compute (data and the rollout stage read them)
    "rewards": 1,
    "model": 1,  # the model substrate: loading, materialize, sharding, log-probs, prefix, Policy and its teacher
    "engines": 3,
    "advantages": 3,
    "loss": 3,
    "optim": 3,
    "metrics": 4,
    "ranks": 4,
    "targets": 4,
    "distill": 4,  # on-policy distillation: its section, math and targets (its teacher is model/'s: Policy holds it)
    "groups": 4,  # the groups an update trains on: DAPO's dynamic sampling
    "run": 4,  # the run directory and the version it takes
    "steplog": 4,  # a step's metrics logged at the cost the step can afford
    "seeding": 0,  # the seed of each step
    "checkpoints": 4,  # checkpoint files: atomic writes, readable, found across versions, last.ckpt; a run's state
    "update": 4,  # the optimiser steps of a generation batch, planned and driven
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


# Inside engines/, a family may import its own folder and the families below it, never a family beside or above:
# the decoding engines are what the agent and asynchronous engines sample with.
ENGINE_FAMILIES = {"decode": 0, "vllm": 0, "multiturn": 0, "agents": 1, "asynchronous": 1}


def engine_family(path: Path) -> str | None:
    """``decode`` for engines/decode/lean.py; None for a file of engines/ itself (its interface, its exports)."""
    parts = path.relative_to(PACKAGE / "engines").parts
    return parts[0] if len(parts) > 1 else None


def test_engine_families_import_only_the_families_below_them():
    wrong = []
    for path in sorted((PACKAGE / "engines").rglob("*.py")):
        own = engine_family(path)
        assert own is None or own in ENGINE_FAMILIES, f"{path}: engines/{own}/ is in no family of ENGINE_FAMILIES"
        imported = {n.split(".")[2] for n in ast_modules(path) if n.startswith("lightning_grpo.engines.")}
        for other in imported & ENGINE_FAMILIES.keys() - {own}:
            if own is not None and ENGINE_FAMILIES[other] >= ENGINE_FAMILIES[own]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports lightning_grpo.engines.{other}")
    assert not wrong, "engine families importing beside or above them:\n" + "\n".join(wrong)


def ast_modules(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports from."""
    tree = ast.parse(path.read_text())
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    return found | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


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


# Tests mirror the package (STYLE 9): the tests of `dir/name.py` are in `tests/dir/`, named `test_name.py` or
# `test_name_<aspect>.py`. A module tested only inside another module's tests is named here, with those files.
TESTED_WITH = {
    "callbacks/export.py": ["test_module.py", "model/test_policy_lora.py"],
    "callbacks/metricsfile.py": ["test_run.py"],
    "callbacks/samples.py": ["callbacks/test_monitor.py"],
    "callbacks/summary.py": ["test_module.py", "demo/test_tiny.py"],
    "callbacks/unscored.py": ["cli/test_preflight.py"],
    "checks.py": ["test_settings.py"],
    "cli/failure.py": ["callbacks/test_faults.py"],
    "cli/help.py": ["cli/test_main.py", "callbacks/test_alert_set.py"],
    "cli/resume.py": ["test_checkpoints.py", "callbacks/test_faults.py"],
    "cli/suggest.py": ["cli/test_main.py"],
    "data/files.py": ["test_data.py", "cli/test_preflight.py"],
    "data/module.py": ["test_data.py"],
    "data/rows.py": ["test_data.py"],
    "demo/agents.py": ["demo/test_anytool.py"],
    "demo/home.py": ["demo/test_tiny.py", "model/test_gguf.py"],
    "demo/registry.py": ["demo/test_tiny.py", "engines/vllm/test_heads.py"],
    "demo/guess.py": ["engines/multiturn/test_openenv.py"],
    "distill/config.py": ["distill/test_targets.py"],
    "engines/agents/batches.py": ["engines/agents/test_engine.py", "engines/agents/test_engine_ddp.py"],
    "engines/agents/endpoint.py": ["engines/agents/test_engine.py"],
    "engines/agents/served.py": ["engines/agents/test_engine.py"],
    "engines/asynchronous/producer.py": ["engines/asynchronous/test_async_rollouts.py"],
    "engines/base.py": ["engines/test_rollout.py", "engines/asynchronous/test_async_rollouts.py"],
    "engines/choice.py": ["model/test_policy.py", "model/test_vision.py"],
    "engines/config.py": ["engines/test_rollout.py", "test_settings.py"],
    "engines/decode/packing.py": ["engines/decode/test_fused.py"],
    "engines/decode/sampling.py": ["engines/decode/test_lean.py"],
    "engines/multiturn/custom.py": ["engines/multiturn/test_environments.py"],
    "engines/multiturn/episodes.py": ["engines/multiturn/test_tool_calling.py"],
    "engines/prompts.py": ["engines/test_rollout.py", "model/test_loading.py"],
    "engines/multiturn/calls.py": ["engines/multiturn/test_tool_calling.py"],
    "engines/multiturn/engine.py": ["engines/multiturn/test_tool_calling.py", "engines/multiturn/test_environments.py"],
    "engines/vllm/colocate.py": ["engines/vllm/test_real.py", "cli/test_selfcheck.py"],
    "engines/vllm/liveness.py": ["engines/vllm/test_servers.py", "engines/vllm/test_server.py"],
    "engines/vllm/lora.py": ["engines/vllm/test_sync.py", "engines/vllm/test_real.py"],
    "engines/vllm/seeds.py": ["engines/vllm/test_real.py"],
    "engines/vllm/agree.py": ["engines/vllm/test_servers.py", "engines/vllm/test_real_servers_ranks.py"],
    "engines/vllm/control.py": [
        "engines/vllm/test_servers.py",
        "engines/vllm/test_real_servers.py",
        "engines/vllm/test_servers_router.py",
    ],
    "engines/vllm/pool.py": [
        "engines/vllm/test_servers.py",
        "engines/vllm/test_servers_sticky.py",
        "engines/vllm/test_servers_router.py",
    ],
    "images.py": ["model/test_vision.py"],
    "loss/config.py": ["test_settings.py", "loss/test_objectives.py"],
    "loss/entropy.py": ["loss/test_objectives.py"],
    "loss/reduce.py": ["loss/test_grpo.py", "test_properties.py"],
    "model/config.py": ["model/test_policy.py"],
    "model/export.py": ["model/test_sharding.py"],
    "model/weights.py": ["model/test_materialize.py", "test_module.py", "model/test_sharding.py"],
    "rewards/_math_worker.py": ["rewards/test_math_equivalence.py"],
    "rewards/code_tests.py": ["rewards/test_code_execution.py", "sandbox/test_runner_adversarial.py"],
    "rewards/text.py": ["rewards/test_correctness.py"],
    "sandbox/cgroups.py": ["sandbox/test_runner.py", "sandbox/test_supervise.py"],
    "sandbox/inside/arguments.py": ["rewards/test_code_execution.py", "sandbox/test_runner.py"],
    "sandbox/inside/boot.py": ["sandbox/test_runner.py", "sandbox/test_supervise.py"],
    "sandbox/inside/collect.py": ["rewards/test_code_execution.py", "sandbox/test_runner.py"],
    "sandbox/inside/grader.py": ["sandbox/test_runner.py", "sandbox/test_supervise.py"],
    "sandbox/inside/hooks.py": ["sandbox/test_runner_adversarial.py", "sandbox/test_supervise.py"],
    "sandbox/inside/program.py": ["sandbox/test_runner.py", "sandbox/test_runner_adversarial.py"],
    "sandbox/inside/remote.py": ["sandbox/test_runner.py", "rewards/test_code_execution.py"],
    "sandbox/inside/running.py": ["sandbox/test_runner.py", "rewards/test_code_execution.py"],
    "sandbox/inside/values.py": ["sandbox/test_runner.py", "sandbox/test_supervise.py"],
    "sandbox/isolation.py": ["sandbox/test_runner.py", "sandbox/test_runner_adversarial.py"],
    "sandbox/records.py": ["sandbox/test_runner.py", "rewards/test_code_execution.py", "sandbox/test_supervise.py"],
    "steplog.py": ["callbacks/test_monitor.py", "test_module.py"],
    "targets/config.py": ["targets/test_build.py"],
    "update.py": ["test_module.py", "targets/test_build.py", "test_host_syncs.py"],
    "types/host.py": ["test_types.py", "test_host_syncs.py"],
    "types/records.py": ["test_types.py", "engines/test_rollout.py"],
    "types/signal.py": ["test_types.py", "test_advantages.py"],
    "types/stats.py": ["test_types.py", "test_metrics.py"],
    "types/text.py": ["rewards/test_correctness.py"],
}
TESTS_DIR = Path(__file__).parent


def has_logic(path: Path) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.ClassDef) for n in ast.parse(path.read_text()).body)


def named_tests(module: str) -> list[Path]:
    """``dir/name.py`` -> ``tests/dir/test_name.py`` and ``tests/dir/test_name_*.py`` (a leading ``_`` dropped)."""
    path = Path(module)
    folder, stem = TESTS_DIR / path.parent, path.stem.lstrip("_")
    return [*folder.glob(f"test_{stem}.py"), *folder.glob(f"test_{stem}_*.py")]


def test_every_module_with_logic_has_its_tests_where_the_layout_says():
    modules = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "templates" not in p.parts and has_logic(p)
    }
    unfound = sorted(m for m in modules - TESTED_WITH.keys() if not named_tests(m))
    assert not unfound, (
        f"modules with no tests/<folder>/test_<name>.py (write one, or name them in TESTED_WITH): {unfound}"
    )
    assert not TESTED_WITH.keys() - modules, (
        f"TESTED_WITH names modules that are gone: {sorted(TESTED_WITH.keys() - modules)}"
    )
    named = sorted(m for m in TESTED_WITH if named_tests(m))
    assert not named, f"modules in TESTED_WITH whose tests are now found by name (drop them from the map): {named}"
    missing = sorted({f for files in TESTED_WITH.values() for f in files if not (TESTS_DIR / f).exists()})
    assert not missing, f"test files named in TESTED_WITH that do not exist: {missing}"


def test_tests_mirror_the_package_folders():
    """Every test folder is a package folder (or the multi-process scripts' own), and holds no stray test files."""
    package_dirs = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*") if p.is_dir()}
    test_dirs = {
        p.relative_to(TESTS_DIR).as_posix()
        for p in TESTS_DIR.rglob("*")
        if p.is_dir() and "__pycache__" not in p.parts and "vllm_stand_in" not in p.parts
    }
    assert not test_dirs - package_dirs - {"multiprocess"}, sorted(test_dirs - package_dirs - {"multiprocess"})


def test_the_engine_interface_is_what_the_module_and_settings_call():
    """``RolloutEngine`` stays narrow: what a wrapper asks of the engine inside it is a protocol of its own
    (``TokenSampler``: the agent endpoint's; ``ServedWeights``: sampling ahead over servers), checked by type."""
    from lightning_grpo.engines import (
        AsyncRollouts,
        HFGenerate,
        LeanDecode,
        OpenAIAgent,
        RolloutEngine,
        ServedWeights,
        TokenSampler,
        VLLMColocate,
        VLLMServer,
    )

    members = [name for name in vars(RolloutEngine) if not name.startswith("_")]
    assert len(members) <= 14, members
    assert not {"complete", "complete_episodes", "before_requests", "served_metrics"} & set(members)
    assert not {"serving", "serve_as", "weights_outside"} & set(members)
    assert all(issubclass(e, TokenSampler) for e in (HFGenerate, LeanDecode, VLLMColocate, VLLMServer))
    assert issubclass(VLLMServer, ServedWeights) and not issubclass(VLLMColocate, ServedWeights)
    assert not issubclass(OpenAIAgent, TokenSampler) and not issubclass(AsyncRollouts, TokenSampler)
