"""engines/_moved.py: every engine module path from before engines/ was split by family imports as the module at
its new place (the same objects), YAML ``class_path`` values with old paths resolve, and ``python -m`` of an old
path runs the new module."""

import importlib
import subprocess
import sys

import pytest
from jsonargparse import ArgumentParser

from lightning_grpo.engines import LeanDecode, ToolCalling, VLLMColocate
from lightning_grpo.engines._moved import MOVED
from lightning_grpo.rollout import RolloutEngine


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_new_module(old):
    before = importlib.import_module(f"lightning_grpo.engines.{old}")
    after = importlib.import_module(f"lightning_grpo.engines.{MOVED[old]}")
    assert before is after and sys.modules[f"lightning_grpo.engines.{old}"] is after
    public = [name for name in vars(after) if not name.startswith("_")]
    assert public and all(getattr(before, name) is getattr(after, name) for name in public)


def test_the_old_from_imports_give_the_same_classes():
    from lightning_grpo.engines.lean import LeanDecode as OldLean
    from lightning_grpo.engines.toolcalls import HermesParser as OldParser
    from lightning_grpo.engines.tools import ToolCalling as OldTools

    from lightning_grpo.engines.multiturn.toolcalls import HermesParser
    from lightning_grpo.engines.vllm import VLLMColocate as OldColocate  # the old module is the package now

    assert (OldLean, OldTools, OldParser, OldColocate) == (LeanDecode, ToolCalling, HermesParser, VLLMColocate)


def test_a_name_that_never_existed_still_fails():
    with pytest.raises(ModuleNotFoundError, match="lightning_grpo.engines.leanest"):
        importlib.import_module("lightning_grpo.engines.leanest")


@pytest.mark.parametrize(
    "class_path",
    [
        "lightning_grpo.engines.lean.LeanDecode",
        "lightning_grpo.engines.LeanDecode",
        "lightning_grpo.engines.hf.HFGenerate",
    ],
)
def test_jsonargparse_resolves_an_old_class_path(class_path):
    parser = ArgumentParser()
    parser.add_argument("--engine", type=RolloutEngine)
    config = parser.parse_args(["--engine", f'{{"class_path": "{class_path}", "init_args": {{}}}}'])
    engine = parser.instantiate_classes(config).engine
    assert type(engine).__name__ == class_path.rsplit(".", 1)[1]
    assert type(engine).__module__.startswith("lightning_grpo.engines.decode.")


def test_python_m_of_an_old_path_runs_the_new_module():
    # the module is found and its code run as __main__: serve_command is defined there (vLLM is not needed for it)
    code = "import runpy; g = runpy.run_module('lightning_grpo.engines.vllm_launch'); print('serve_command' in g)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
