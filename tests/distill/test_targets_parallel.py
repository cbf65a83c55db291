"""The teacher under 2 CPU processes (gloo): under FSDP2 it is sharded like the reference, and the teacher's signal
(the reverse KL and the advantages it makes) equals DDP's, where every rank holds the whole teacher."""

from pathlib import Path

import pytest
import torch
from helpers import run_ranks

from tests.distill.test_targets import teacher_dir  # noqa: F401  (the fixture)


def run(mode: str, model_dir: str, teacher: str, data: str, out: Path) -> list[dict]:
    return run_ranks("distill_parallel_run.py", [model_dir, teacher, data, str(out / mode), mode], out / mode)


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
