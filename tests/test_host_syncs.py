"""Host syncs in a training step: each read of a device value (``.item()``, ``.tolist()``, ``bool(t)``, a
data-dependent shape such as ``nonzero``) makes the host wait for a GPU to drain its launch queue. Counted here on
CPU, where the same calls are made: the step's statistics are read once, at its end (``types.to_host``); what is
left is named below, each a shape the next operation needs."""

from __future__ import annotations

import collections
import traceback

import lightning as L
import pytest
from helpers import fit, make_module
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_grpo import PromptDataModule

# aten ops that read a device value or need one to know their output's shape
READ_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_consecutive", "bincount"}
READ_METHODS = {"tolist", "cpu", "numpy"}  # Tensor methods that copy to the host (not dispatched as an aten op)


def _where() -> str:
    """The package's innermost frame: ``folder/file.py:function``."""
    ours = [f for f in traceback.extract_stack() if "/lightning_grpo/" in f.filename]
    return f"{ours[-1].filename.split('/lightning_grpo/')[-1]}:{ours[-1].name}" if ours else "outside the package"


class _Reads(TorchDispatchMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        is_read = name in READ_OPS or (name == "repeat_interleave" and len(args) > 1 and not isinstance(args[1], int))
        if is_read:
            self.counts[_where()] += 1
        return func(*args, **(kwargs or {}))


class _Copies(TorchFunctionMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READ_METHODS:
            self.counts[_where()] += 1
        return func(*args, **(kwargs or {}))


class CountReads(L.Callback):
    """Counts the host reads of the training step ``step`` (the first is left out: set-up reads)."""

    def __init__(self, step: int = 1) -> None:
        self.step, self.counts = step, collections.Counter()
        self.modes = (_Reads(self.counts), _Copies(self.counts))

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            for mode in self.modes:
                mode.__enter__()

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step + 1:
            for mode in reversed(self.modes):
                mode.__exit__(None, None, None)

    def outside(self, folder: str) -> dict[str, int]:
        return {where: n for where, n in self.counts.items() if not where.startswith(folder)}


@pytest.fixture(scope="module")
def reads(tiny_model_dir, arith_jsonl, tmp_path_factory) -> CountReads:
    counter = CountReads()
    module = make_module(tiny_model_dir, loss={"beta": 0.04})  # the reference's log-probs too
    fit(module, PromptDataModule(arith_jsonl, batch_size=2), tmp_path_factory.mktemp("syncs"), callbacks=[counter])
    return counter


def test_the_steps_statistics_are_read_once(reads):
    """Every metric of the step (rewards, lengths, loss, clip ratios, KL, grad norm, tokens seen) in one read:
    ``types.to_host``. Before, each was read on its own."""
    where = {w: n for w, n in reads.counts.items() if w.startswith(("metrics.py", "loss/", "types.py"))}
    assert where == {"types.py:to_host": 1}, where


def test_a_step_outside_the_decode_loop_reads_the_device_a_handful_of_times(reads):
    """What is left outside the rollout engine, each a shape or a decision the next operation needs:
    - the rollout's width (columns that are padding in every row are trimmed), the texts and ids the rewards read;
    - the guards that skip a step: infinite rewards, non-finite advantages, non-finite gradients;
    - the loss normaliser's token counts, and the micro-batch plan (rows by length);
    - the padding trimmed before each log-prob forward, and the shared prompt's runs.
    Measured: 65 before the statistics were read together and per-row reads batched, 19 after; the bound leaves
    no room for a new read per metric or per row.
    """
    outside = reads.outside("engines/")
    assert sum(outside.values()) <= 20, sorted(outside.items())
