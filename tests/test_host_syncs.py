"""Host syncs in a training step: each read of a device value (``.item()``, ``.tolist()``, ``bool(t)``, a
data-dependent shape such as ``nonzero``) makes the host wait for a GPU to drain its launch queue. Counted here on
CPU, where the same calls are made: the step's statistics are read once, at its end (``types.to_host``); what is
left is named below, each a shape the next operation needs."""

from __future__ import annotations

import collections
import json
import traceback
import warnings

import lightning as L
import pytest
import torch
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


def _tensor_at(args: tuple, i: int) -> bool:
    return len(args) > i and isinstance(args[i], torch.Tensor)


def _by_mask(name: str, args: tuple) -> bool:
    """``t[mask]`` and ``t[mask] = v``: a boolean index is turned into indices (``nonzero``) inside the op."""
    indices = args[1] if name in ("index", "index_put", "index_put_") and len(args) > 1 else []
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or [])


class _Reads(TorchDispatchMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        is_read = name in READ_OPS or _by_mask(name, args) or (name == "repeat_interleave" and _tensor_at(args, 1))
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


@pytest.fixture(scope="module", params=["equal prompts", "uneven prompts"])
def reads(request, tiny_model_dir, arith_jsonl, tmp_path_factory) -> CountReads:
    """The reads of one step on prompts of one length (no padding), or of several (each forward's masks padded)."""
    data = arith_jsonl
    if request.param == "uneven prompts":
        data = tmp_path_factory.mktemp("uneven") / "train.jsonl"
        rows = [{"prompt": "1+" * (1 + i % 4) + "1=", "answer": str(2 + i % 4)} for i in range(16)]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counter = CountReads()
    module = make_module(tiny_model_dir, loss={"beta": 0.04})  # the reference's log-probs too
    fit(module, PromptDataModule(str(data), batch_size=2), tmp_path_factory.mktemp("syncs"), callbacks=[counter])
    return counter


def test_the_steps_statistics_are_read_once(reads):
    """Every metric of the step (rewards, lengths, loss, clip ratios, KL, grad norm, tokens seen) in one read:
    ``types.to_host``. Before, each was read on its own."""
    where = {w: n for w, n in reads.counts.items() if w.startswith(("metrics.py", "loss/", "types/"))}
    assert where == {"types/host.py:to_host": 1, "types/host.py:read": 1}, where  # read: the rollout's rows (below)


def test_a_step_outside_the_decode_loop_reads_the_device_a_handful_of_times(reads):
    """What is left outside the rollout engine, each where the step cannot go on without the answer:
    - ``types/host.py:read``: the rollout's rows, once (``Rollout.host``): the texts and ids the rewards read, and the
      lengths that the micro-batch plan, the columns each forward keeps, the prompts it encodes once, the count of
      its completion tokens and whether its masks hold padding are decided from on the host;
    - ``update.py:step_fault``: whether the optimiser step may be taken (rewards, advantages and the
      gradient norm finite), once, after the step's backward passes;
    - ``types/host.py:to_host``: the step's statistics, together, at its end.
    Measured: 65 before the statistics were read together and per-row reads batched, 19 before the rollout's rows
    were read once (each forward read its columns and prompt runs, the normaliser its counts, the guards their
    flags; boolean indexing in the log-prob forward and the clip-ratio extremes was not counted then, 7 more, and
    transformers read each forward's mask for padding), 3 after.
    """
    outside = reads.outside("engines/")
    assert sorted(outside.items()) == [
        ("types/host.py:read", 1),
        ("types/host.py:to_host", 1),
        ("update.py:step_fault", 1),
    ]


class CountWaits(CountReads):
    """On a GPU, the waits that CUDA itself reports in step ``step`` (``torch.cuda.set_sync_debug_mode``): reads of
    the device, and copies from pageable host memory, which wait for the device's queue too."""

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            self.catch = warnings.catch_warnings()
            self.catch.__enter__()
            warnings.simplefilter("always")
            warnings.showwarning = self.show
            torch.cuda.set_sync_debug_mode("warn")

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step + 1:
            torch.cuda.set_sync_debug_mode("default")
            self.catch.__exit__(None, None, None)

    def show(self, message, category, *args, **kwargs) -> None:
        if "synchroniz" in str(message):
            self.counts[_where()] += 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_checks.sh runs it)")
def test_on_a_gpu_the_step_waits_for_the_device_a_handful_of_times(tiny_model_dir, arith_jsonl, tmp_path):
    """What the CPU count above stands for, as CUDA reports it: outside the decode loop, the same handful of reads
    and the copies from the host that wait (the rewards' scores, made after the rollout's read, when the queue is
    already empty). Printed with ``-s``."""
    counter = CountWaits()
    module = make_module(tiny_model_dir, loss={"beta": 0.04})
    fit(
        module, PromptDataModule(arith_jsonl, batch_size=2), tmp_path, callbacks=[counter], accelerator="gpu", devices=1
    )
    outside = counter.outside("engines/")
    print(f"waits in a step on {torch.cuda.get_device_name()}: {sorted(counter.counts.items())}")
    assert sum(outside.values()) <= 8, sorted(outside.items())
