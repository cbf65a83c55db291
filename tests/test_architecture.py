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
    "images": 1,  # image columns: opened lazily, checked before compute (data and the rollout stage read them)
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
    "checkpoints": 4,  # checkpoint files: atomic writes, readable, found across versions
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


# Every module with logic -> the test files that test it (STYLE 9: tests mirror the package). A new module must be
# added here with its tests; a test file named here must exist.
TESTS = {
    "advantages.py": ["test_advantages.py", "test_properties.py"],
    "callbacks/alerts.py": ["test_callbacks.py"],
    "callbacks/collapse.py": ["test_callbacks.py", "test_types.py"],
    "callbacks/distill.py": ["test_distill_alert.py"],
    "callbacks/divergence.py": ["test_callbacks.py"],
    "callbacks/early_stopping.py": ["test_early_stopping.py"],
    "callbacks/export.py": ["test_module.py", "test_lora.py"],
    "callbacks/faults.py": ["test_faults.py"],
    "callbacks/final.py": ["test_callbacks.py"],
    "callbacks/metricsfile.py": ["test_rundir.py"],
    "callbacks/mismatch.py": ["test_mismatch_alert.py"],
    "callbacks/monitor.py": ["test_callbacks.py"],
    "callbacks/preemption.py": ["test_resume.py"],
    "callbacks/progress.py": ["test_progress.py"],
    "callbacks/samples.py": ["test_callbacks.py"],
    "callbacks/tools.py": ["test_tool_use_alert.py"],
    "callbacks/summary.py": ["test_module.py", "test_demo.py"],
    "callbacks/threads.py": ["test_threads.py"],
    "callbacks/unscored.py": ["test_preflight.py"],
    "checks.py": ["test_settings.py"],
    "checkpoints.py": ["test_checkpoints.py"],
    "cli/failure.py": ["test_faults.py"],
    "cli/preflight.py": ["test_preflight.py"],
    "cli/resume.py": ["test_checkpoints.py", "test_faults.py"],
    "cli/suggest.py": ["test_cli.py"],
    "cli/main.py": ["test_cli.py", "test_restore.py"],
    "cli/report.py": ["test_callbacks.py"],
    "cli/selfcheck.py": ["test_selfcheck.py"],
    "cli/step_model.py": ["test_step_model.py"],
    "data.py": ["test_data.py"],
    "deadline.py": ["test_deadline.py"],
    "demo/calc.py": ["test_demo_tools.py"],
    "demo/agents.py": ["test_demo_agents.py"],
    "demo/anytool.py": ["test_demo_agents.py"],
    "demo/guess.py": ["test_openenv.py"],
    "demo/vision.py": ["test_vision.py", "test_vision_demo.py"],
    "demo/tiny.py": ["test_demo.py"],
    "dynamic.py": ["test_dynamic.py"],
    "engines/_moved.py": ["test_engines_moved.py"],
    "engines/base.py": ["test_rollout.py", "test_engine_async.py"],
    "engines/agents/endpoint.py": ["test_agents.py"],
    "engines/agents/engine.py": ["test_agents.py", "test_agents_ddp.py"],
    "engines/agents/served.py": ["test_agents.py"],
    "engines/agents/skyrl.py": ["test_skyrl.py"],
    "engines/asynchronous/async_rollouts.py": ["test_engine_async.py"],
    "engines/asynchronous/producer.py": ["test_engine_async.py"],
    "engines/decode/fused.py": ["test_engine_fused.py"],
    "engines/decode/graphed.py": ["test_engine_graphed.py"],
    "engines/decode/hf.py": ["test_generation.py"],
    "engines/decode/lean.py": ["test_engine_lean.py"],
    "engines/decode/packing.py": ["test_engine_fused.py"],
    "engines/decode/sampling.py": ["test_engine_lean.py"],
    "engines/multiturn/custom.py": ["test_environments.py"],
    "engines/multiturn/environments.py": ["test_environments.py"],
    "engines/multiturn/episodes.py": ["test_tools.py"],
    "engines/multiturn/openenv.py": ["test_openenv.py"],
    "engines/multiturn/toolcalls.py": ["test_tools.py"],
    "engines/multiturn/tools.py": [
        "test_tools.py",
        "test_tools_training.py",
        "test_tools_loss.py",
        "test_tools_ddp.py",
    ],
    "engines/vllm/colocate.py": ["test_vllm_real.py", "test_selfcheck.py"],
    "engines/vllm/heads.py": ["test_vllm_heads.py", "test_vllm_real_template.py"],
    "engines/vllm/launch.py": ["test_vllm_real.py", "test_vllm_real_template.py"],
    "engines/vllm/lora.py": ["test_vllm_sync.py", "test_vllm_real.py"],
    "engines/vllm/logprobs.py": ["test_sampler_logps.py"],
    "engines/vllm/seeds.py": ["test_vllm_real.py"],
    "engines/vllm/server.py": ["test_vllm_server.py", "test_vllm_servers.py", "test_vllm_real.py"],
    "engines/vllm/servers.py": ["test_vllm_servers.py", "test_vllm_real_servers.py"],
    "engines/vllm/sync.py": ["test_vllm_sync.py", "test_vllm_real.py"],
    "loss/config.py": ["test_settings.py", "test_loss_variants.py"],
    "loss/distill.py": ["test_loss_distill.py"],
    "loss/entropy.py": ["test_loss_variants.py"],
    "loss/grpo.py": ["test_loss.py", "test_loss_trl.py", "test_loss_variants.py"],
    "loss/objectives.py": ["test_loss_variants.py", "test_loss_trl.py"],
    "loss/reduce.py": ["test_loss.py", "test_properties.py"],
    "images.py": ["test_vision.py"],
    "metrics.py": ["test_metrics.py", "test_trl_metrics.py"],
    "model/config.py": ["test_policy.py"],
    "model/export.py": ["test_parallel.py"],
    "model/loading.py": ["test_family.py", "test_settings.py"],
    "model/logprobs.py": ["test_logprobs_scaling.py", "test_moe_aux.py"],
    "model/materialize.py": ["test_materialize.py"],
    "model/policy.py": ["test_policy.py", "test_lora.py"],
    "model/padding.py": ["test_padding.py"],
    "model/prefix.py": ["test_prefix.py"],
    "model/sharding.py": ["test_parallel.py"],
    "model/vision.py": ["test_vision.py", "test_vision_parallel.py"],
    "model/teacher.py": ["test_distill.py"],
    "model/served_teacher.py": ["test_distill.py", "test_vllm_real_distill.py"],
    "module.py": ["test_module.py"],
    "optim.py": ["test_optim.py"],
    "ranks.py": ["test_ranks.py", "test_ddp.py"],
    "rewards/_math_worker.py": ["test_rewards_math.py"],
    "rewards/code_execution.py": ["test_rewards_code.py"],
    "rewards/code_tests.py": ["test_rewards_code.py", "test_sandbox_adversarial.py"],
    "rewards/combine.py": ["test_rewards_combine.py"],
    "rewards/correctness.py": ["test_rewards_correctness.py"],
    "rewards/format.py": ["test_rewards_format.py"],
    "rewards/length.py": ["test_rewards_length.py"],
    "rewards/math_equivalence.py": ["test_rewards_math.py"],
    "rewards/model.py": ["test_rewards_model.py"],
    "rewards/calls.py": ["test_scoring.py", "test_rewards_async.py"],
    "rewards/convention.py": ["test_rewards_contract.py", "test_scoring.py"],
    "rewards/scoring.py": ["test_scoring.py", "test_module.py"],
    "rewards/style.py": ["test_rewards_style.py"],
    "rewards/text.py": ["test_rewards_correctness.py"],
    "rollout.py": ["test_rollout.py"],
    "run.py": ["test_rundir.py"],
    "sandbox/cgroups.py": ["test_sandbox.py", "test_sandbox_weaknesses.py"],
    "sandbox/inside/boot.py": ["test_sandbox.py", "test_sandbox_weaknesses.py"],
    "sandbox/inside/grader.py": ["test_sandbox.py", "test_sandbox_weaknesses.py"],
    "sandbox/inside/hooks.py": ["test_sandbox_adversarial.py", "test_sandbox_weaknesses.py"],
    "sandbox/inside/program.py": ["test_sandbox.py", "test_sandbox_adversarial.py"],
    "sandbox/inside/values.py": ["test_sandbox.py", "test_sandbox_weaknesses.py"],
    "sandbox/isolation.py": ["test_sandbox.py", "test_sandbox_adversarial.py"],
    "sandbox/python_tool.py": ["test_python_tool.py"],
    "sandbox/records.py": ["test_sandbox.py", "test_rewards_code.py", "test_sandbox_weaknesses.py"],
    "sandbox/runner.py": ["test_sandbox.py", "test_sandbox_adversarial.py"],
    "sandbox/supervise.py": ["test_sandbox.py", "test_sandbox_weaknesses.py"],
    "settings.py": ["test_settings.py"],
    "targets/build.py": ["test_targets.py"],
    "targets/config.py": ["test_targets.py"],
    "targets/correction.py": ["test_correction.py", "test_targets.py", "test_generation.py"],
    "targets/distill.py": ["test_distill.py"],
    "types.py": ["test_types.py"],
}


def has_logic(path: Path) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.ClassDef) for n in ast.parse(path.read_text()).body)


def test_every_module_with_logic_has_its_tests():
    modules = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "templates" not in p.parts and has_logic(p)
    }
    assert not modules - TESTS.keys(), f"modules with no tests named in TESTS: {sorted(modules - TESTS.keys())}"
    assert not TESTS.keys() - modules, f"TESTS names modules that are gone: {sorted(TESTS.keys() - modules)}"
    tests = Path(__file__).parent
    missing = sorted({f for files in TESTS.values() for f in files if not (tests / f).exists()})
    assert not missing, f"test files named in TESTS that do not exist: {missing}"
