"""The engines' old module paths, before ``engines/`` was split by family, kept importable.

``MOVED`` maps each old module to its new one; ``MovedModules``, a finder on ``sys.meta_path``, answers an import of
an old name with the new module itself (the same object: ``lightning_grpo.engines.lean.LeanDecode is
lightning_grpo.engines.decode.lean.LeanDecode``), so YAML ``class_path`` values, pickles and ``python -m`` of the old
paths keep working. Lazy: nothing is imported until an old name is. ``engines.vllm`` and ``engines.agents`` are
packages now; their ``__init__`` exports what users imported from the old modules.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

PACKAGE = "lightning_grpo.engines"

# old module (under engines) -> new module (under engines)
MOVED = {
    "lean": "decode.lean",
    "fused": "decode.fused",
    "packing": "decode.packing",
    "sampling": "decode.sampling",
    "hf": "decode.hf",
    "vllm_server": "vllm.server",
    "vllm_sync": "vllm.sync",
    "vllm_lora": "vllm.lora",
    "vllm_launch": "vllm.launch",
    "tools": "multiturn.tool_calling",
    "toolcalls": "multiturn.toolcalls",
    "episodes": "multiturn.episodes",
    "environments": "multiturn.environments",
    "openenv": "multiturn.openenv",
    "custom": "multiturn.custom",
    "endpoint": "agents.endpoint",
    "served": "agents.served",
    "skyrl": "agents.skyrl",
    "async_rollouts": "asynchronous.async_rollouts",
    "producer": "asynchronous.producer",
}


def new_name(fullname: str) -> str | None:
    """``lightning_grpo.engines.decode.lean`` for ``lightning_grpo.engines.lean``; None for any other name."""
    package, _, old = fullname.rpartition(".")
    return f"{PACKAGE}.{MOVED[old]}" if package == PACKAGE and old in MOVED else None


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old engine module path as its new module (``sys.modules`` then holds it under both names)."""

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None):
        if new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(new_name(spec.name))

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the new module ran when ``create_module`` imported it."""

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, for ``python -m lightning_grpo.engines.vllm_launch``."""
        new = new_name(fullname)
        return importlib.util.find_spec(new).loader.get_code(new)


def install() -> None:
    """Puts one ``MovedModules`` on ``sys.meta_path`` (again on a reload: no second one)."""
    if not any(type(finder).__name__ == MovedModules.__name__ for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
