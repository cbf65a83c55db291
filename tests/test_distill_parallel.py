"""The teacher under 2 CPU processes (gloo): under FSDP2 it is sharded like the reference, and the teacher's signal
(the reverse KL and the advantages it makes) equals DDP's, where every rank holds the whole teacher."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_distill import teacher_dir  # noqa: F401  (the fixture)

SCRIPT = Path(__file__).with_name("distill_parallel_run.py")


def run(mode: str, model_dir: str, teacher: str, data: str, out: Path) -> list[dict]:
    command = [sys.executable, str(SCRIPT), model_dir, teacher, data, str(out / mode), mode]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(out / mode / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.slow
def test_a_sharded_teacher_gives_the_signal_of_a_whole_one(tiny_model_dir, teacher_dir, arith_jsonl, tmp_path):  # noqa: F811
    ddp = run("ddp", tiny_model_dir, teacher_dir, arith_jsonl, tmp_path)
    fsdp = run("fsdp2", tiny_model_dir, teacher_dir, arith_jsonl, tmp_path)
    assert [r["sharded"] for r in fsdp] == [True, True] and [r["sharded"] for r in ddp] == [False, False]
    for rank in (0, 1):
        assert len(fsdp[rank]["steps"]) == len(ddp[rank]["steps"]) == 3
        for a, b in zip(ddp[rank]["steps"], fsdp[rank]["steps"]):
            assert a["reverse_kl"] > 0 and a["reverse_kl"] == pytest.approx(b["reverse_kl"], rel=1e-4, abs=1e-5)
            torch.testing.assert_close(a["advantages"], b["advantages"], rtol=1e-4, atol=1e-5)
