"""A LoRA policy's adapter -> numbered adapter folders that a vLLM engine serves by name (``lora_sync="adapter"``).
Shared by ``VLLMColocate`` and ``VLLMServer``; knows PEFT's adapter format and the folders, nothing about how an
engine loads them.

Adapter-only sync: vLLM keeps the base weights it loaded at start-up and applies the adapter per request, so after
each optimiser step only the adapter moves (KBs to MBs instead of the whole model). Each push is a NEW version: a
new folder, a new name and a new integer id, because vLLM caches adapters by id and a reused id with a new path
serves the stale adapter (GRPO_REFERENCE.md, vLLM 0.32). Older folders are removed once the new one is written:
only the newest version is ever requested again.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning_grpo.model.policy import Policy
from lightning_grpo.model.sharding import full_state_dict, is_sharded

LORA_SYNCS = {
    "adapter": "the adapter alone, a new version after each step, served by name; the base weights never move",
    "merged": "the adapter merged into the base weights and the whole model pushed after each step (TRL's way)",
}
LoraSync = Literal[tuple(LORA_SYNCS)]
# vLLM's accepted `max_lora_rank` values (`vllm.config.lora.MaxLoRARanks`, 0.32): a rank in between is refused
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def check_lora_sync(engine: str, lora_sync: str) -> None:
    if lora_sync not in LORA_SYNCS:
        raise ValueError(f"{engine} lora_sync must be one of {sorted(LORA_SYNCS)}, got {lora_sync!r}")


def adapter_rank(policy: Policy) -> int:
    """The largest LoRA rank of the policy's adapter (its ``r``, or a larger one of ``rank_pattern``)."""
    config = policy.model.peft_config[policy.model.active_adapter]
    return max([config.r, *(config.rank_pattern or {}).values()])


def max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")
    return fitting[0]


@dataclass(frozen=True)
class AdapterVersion:
    """One pushed adapter: what vLLM is told (``LoRARequest(name, number, path)`` or ``/v1/load_lora_adapter``)."""

    name: str  # "<folder>-v3": unique across runs sharing a server (a name already loaded is refused)
    number: int  # 3: vLLM's lora_int_id, new each push
    path: str  # the folder PEFT wrote: adapter_config.json, adapter_model.safetensors
    num_bytes: int  # the size of the files the engine reads: what moves


class AdapterVersions:
    """Owns a temporary folder of adapter versions, made at the first write: ``save`` writes the next version and
    removes the older ones; the folder is removed with this object (or at exit).

    Args:
        parent: where the folder is made (one the engine can read); ``None``: the system's temporary folder.
    """

    def __init__(self, parent: str | None = None) -> None:
        self.parent, self.root = parent, None
        self.number = 0

    def _folder(self) -> Path:
        if self.root is None:
            if self.parent is not None:
                Path(self.parent).mkdir(parents=True, exist_ok=True)
            self.root = Path(tempfile.mkdtemp(prefix="lightning_grpo_lora_", dir=self.parent))
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
        return self.root

    def save(self, policy: Policy, writer: bool = True) -> AdapterVersion | None:
        """The policy's adapter as the next version (``None`` on ranks that do not write). Every rank calls it: a
        sharded policy is gathered first (a collective); ``writer`` ranks write (rank 0 of a sharded policy only:
        the others hold no gathered weights)."""
        state = full_state_dict(policy.model) if is_sharded(policy.model) else None
        if not writer or (state is not None and not state):
            return None
        self.number += 1
        path = self._folder() / f"v{self.number}"
        policy.model.save_pretrained(str(path), state_dict=state)  # PEFT: the adapter's tensors and config only
        num_bytes = sum(f.stat().st_size for f in path.glob("adapter_*"))  # what vLLM reads (not PEFT's README)
        self._remove_older()
        return AdapterVersion(f"{self.root.name}-v{self.number}", self.number, str(path), num_bytes)

    def _remove_older(self) -> None:
        for folder in self.root.iterdir():
            if folder.name != f"v{self.number}":
                shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """Remove the folder now."""
        if self.root is not None:
            self._cleanup()
