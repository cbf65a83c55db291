"""templates/multinode.yaml under SLURM: Lightning's own SLURM detection, with the variables ``srun`` would set for
the template's ``sbatch`` line, picks the cluster environment and agrees with the template's trainer settings."""

import re

import lightning as L
import pytest
import yaml
from helpers import ROOT
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

TEMPLATE = ROOT / "templates" / "multinode.yaml"


def sbatch_line() -> dict[str, int]:
    line = next(line for line in TEMPLATE.read_text().splitlines() if "sbatch" in line)
    return {k: int(v) for k, v in re.findall(r"--(nodes|ntasks-per-node|gpus-per-node) (\d+)", line)}


@pytest.mark.parametrize("node,local", [(0, 0), (1, 3)])
def test_multinode_template_under_slurm(monkeypatch, node, local):
    sbatch, trainer = sbatch_line(), yaml.safe_load(TEMPLATE.read_text())["trainer"]
    per_node = sbatch["ntasks-per-node"]
    variables = {
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NAME": "grpo",  # not "bash"/"interactive", which Lightning treats as not SLURM-launched
        "SLURM_NNODES": sbatch["nodes"],
        "SLURM_NTASKS": sbatch["nodes"] * per_node,
        "SLURM_NTASKS_PER_NODE": per_node,
        "SLURM_NODEID": node,
        "SLURM_LOCALID": local,
        "SLURM_PROCID": node * per_node + local,
        "SLURM_NODELIST": "gpu-[07-08]",
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # Lightning derives and exports both: restored after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert SLURMEnvironment.detect()
    assert sbatch["gpus-per-node"] == per_node == trainer["devices"] and sbatch["nodes"] == trainer["num_nodes"]
    SLURMEnvironment().validate_settings(num_devices=trainer["devices"], num_nodes=trainer["num_nodes"])

    # The template's trainer on CPU (no GPUs here): same strategy, devices and nodes; no process group started.
    settings = {**trainer, "accelerator": "cpu", "precision": "32-true", "logger": False}
    # A Trainer of global rank k sets Lightning's process-wide rank_zero_only.rank; later tests need rank 0 back
    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)
    built = L.Trainer(**settings)
    assert isinstance(built.strategy.cluster_environment, SLURMEnvironment)
    assert (built.world_size, built.node_rank, built.local_rank) == (16, node, local)
    assert built.global_rank == node * per_node + local
    assert built.strategy.cluster_environment.main_address == "gpu-07"
