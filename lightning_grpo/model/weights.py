"""Where a Policy's weights live: placed for the strategy (FSDP2 shards them here, Lightning's FSDP wraps the module
itself, a policy built on the meta device loads its files) and what its checkpoints leave out because it is rebuilt
from ``model`` (the frozen reference, the teacher, a LoRA policy's frozen base), put back on load. Knows FSDP2 and
the state dict; nothing about log-probs or training.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, Strategy
from torch import Tensor

from lightning_grpo.model.materialize import is_empty, load_weights
from lightning_grpo.model.sharding import shard_causal_lm

REFERENCE = "reference."  # state-dict prefix of the frozen copy inside the Policy
TEACHER = "teacher."  # and of the distillation teacher


class PolicyWeights:
    """``Policy``'s placement and checkpoint contents. A part of ``Policy``, whose ``__init__`` sets what it reads:
    ``model``, ``reference``, ``teacher``, ``is_lora``, the ``weight_files`` and ``teacher_files`` of a policy built
    empty, and the ``real_tensors`` kept through loading them."""

    @staticmethod
    def shards_under(strategy: Strategy | None) -> bool:
        """Whether ``configure`` shards the policy under ``strategy`` (FSDP2 or Lightning's FSDP)."""
        return isinstance(strategy, (ModelParallelStrategy, FSDPStrategy))

    def configure(self, strategy: Strategy | None, mesh: Any | None) -> None:
        """Place the weights for ``strategy``: FSDP2 (``ModelParallelStrategy``, its device ``mesh``) shards
        here; Lightning's FSDP wraps the module itself; otherwise a policy built on the meta device loads."""
        if isinstance(strategy, ModelParallelStrategy):
            if mesh["tensor_parallel"].size() != 1:
                raise ValueError(
                    "ModelParallelStrategy tensor_parallel_size must be 1 for GRPOModule (FSDP2 data parallelism "
                    f"only), got {mesh['tensor_parallel'].size()}: set data_parallel_size to the number of processes"
                )
            self.shard(mesh["data_parallel"], strategy.world_size)
        elif isinstance(strategy, FSDPStrategy):
            self.shard(None, strategy.world_size)
        else:
            self.materialize()

    def shard(self, mesh: Any | None, world_size: int) -> None:
        """Shard over ``mesh`` with FSDP2 (``None``: the strategy shards the module itself, as FSDP1 does).
        Either way generation is then synced across ranks, so ranks that finish early keep stepping."""
        if mesh is not None:
            shard_causal_lm(self.model, mesh)  # under LoRA the frozen base is sharded too; the adapter trains
            for frozen in (self.reference, self.teacher):
                if frozen is not None:
                    shard_causal_lm(frozen, mesh, frozen=True)
        self.synced_generation = world_size > 1
        self.materialize()  # after sharding: each rank reads only its own rows

    def materialize(self) -> None:
        """Load the weights of a policy built on the meta device (Lightning's ``trainer.init_module(empty_init=True)``
        under FSDP2) from its checkpoint files: each rank's own shards once ``shard`` has run, else whole tensors.
        A no-op for a policy that has its weights."""
        for model in (self.model, self.reference):
            if model is not None and is_empty(model):
                load_weights(model, self.weight_files, self.real_tensors)
        if self.teacher is not None and is_empty(self.teacher):
            load_weights(self.teacher, self.teacher_files, {})
        self.real_tensors = {}

    def left_out(self) -> Iterator[tuple[str, Tensor]]:
        """(name, tensor) of what the Policy's state dict leaves out because it is rebuilt from ``model``: the
        reference, and under LoRA the frozen base weights. Every checkpoint (a ``.ckpt`` file or a distributed
        checkpoint directory, whose shards Lightning reads straight into ``state_dict()``'s keys) follows."""
        if self.reference is not None:
            yield from ((REFERENCE + n, t) for n, t in self.reference.state_dict(keep_vars=True).items())
        if self.teacher is not None:
            yield from ((TEACHER + n, t) for n, t in self.teacher.state_dict(keep_vars=True).items())
        if self.is_lora:
            yield from (
                ("model." + n, t) for n, t in self.model.state_dict(keep_vars=True).items() if not t.requires_grad
            )


def drop_left_out(policy: PolicyWeights, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    for name, _ in policy.left_out():
        state.pop(prefix + name, None)


def fill_left_out(policy: PolicyWeights, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """Loading puts the current values back in place of what was left out, so strict loading still catches a
    checkpoint that lacks weights that train."""
    for name, tensor in policy.left_out():
        state.setdefault(prefix + name, tensor.detach())
