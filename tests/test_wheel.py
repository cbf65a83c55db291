"""A usable wheel: the templates ship in the package, ``--config tiny_cpu`` finds one by name from any directory,
bare ``lightning-grpo fit`` says what to run, and a built wheel installed in a fresh venv runs the default."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from lightning_grpo.cli.argv import TEMPLATES, resolve_configs
from lightning_grpo.cli.main import main


def test_a_template_name_resolves_to_the_shipped_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no templates/ here: the package's own
    assert resolve_configs(["fit", "--config", "tiny_cpu"]) == ["fit", "--config", str(TEMPLATES / "tiny_cpu.yaml")]
    assert resolve_configs(["fit", "--config=lora_cpu.yaml"]) == ["fit", f"--config={TEMPLATES / 'lora_cpu.yaml'}"]
    assert resolve_configs(["fit", "-c", "templates/ddp_cpu.yaml"])[2] == str(TEMPLATES / "ddp_cpu.yaml")
    with pytest.raises(SystemExit, match="'tiny_gpu' is neither a file nor a shipped template; the templates are "):
        resolve_configs(["fit", "--config", "tiny_gpu"])
    (tmp_path / "tiny_cpu.yaml").write_text("trainer: {max_steps: 3}\n")
    assert resolve_configs(["fit", "--config", "tiny_cpu.yaml"])[2] == "tiny_cpu.yaml"  # a user's file comes first
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", "tiny_cpu", "--print_config"])
    assert done.value.code == 0
    assert yaml.safe_load(capsys.readouterr().out)["data"]["dataset"] == "lightning-grpo/tiny-max"


def test_bare_fit_says_what_to_run():
    with pytest.raises(SystemExit, match=r"needs a config: `lightning-grpo fit --config tiny_cpu` trains"):
        main(["fit"])
    with pytest.raises(SystemExit, match="needs a config"):
        main(["fit", "--trainer.max_steps", "2"])


@pytest.mark.slow
def test_the_wheel_installed_in_a_fresh_venv_runs_the_default_from_an_empty_directory(tmp_path):
    """``pip wheel`` of this checkout, installed (without dependencies) in a new venv that sees this venv's
    packages through a ``.pth`` line (not its editable install of the checkout), then the documented command."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # the checkout unseen
    env |= {"OMP_NUM_THREADS": "1", "LIGHTNING_GRPO_HOME": str(tmp_path / "cache")}
    source, wheels = tmp_path / "source", tmp_path / "wheels"  # a copy: building writes build/ and *.egg-info
    # not the venvs (.venv is 2.4 GB; CI builds .ci/vllm-venv beside this test) nor CI's files
    ignore = shutil.ignore_patterns(
        ".git", ".ci", "*venv", "build", "runs", "lightning_logs", "*.egg-info", "__pycache__", ".*cache"
    )
    shutil.copytree(ROOT, source, symlinks=True, ignore=ignore)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]  # offline if it can
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(wheels), str(source)]
    subprocess.run(build, check=True, capture_output=True, timeout=600, env=env)
    wheel = next(wheels.glob("lightning_grpo-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    Path(site, "outer_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [python, "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, timeout=600, env=env, capture_output=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run(
        [python, "-c", "import lightning_grpo; print(lightning_grpo.__file__)"], cwd=empty, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    assert where.stdout.startswith(site), where.stderr[-3000:]  # the wheel's copy, not this checkout
    command = [venv / "bin" / "lightning-grpo", "fit", "--config", "tiny_cpu", "--trainer.max_steps", "2",
               "--trainer.val_check_interval", "2", "--data.max_val_prompts", "8"]  # fmt: skip
    proc = subprocess.run(command, cwd=empty, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GRPO run: 2 steps" in proc.stdout
    run = empty / "runs" / "tiny_cpu" / "lightning_logs" / "version_0"
    assert (run / "summary.json").exists() and (run / "hf_model" / "config.json").exists()
    bare = subprocess.run([venv / "bin" / "lightning-grpo", "fit"], cwd=empty, env=env, capture_output=True, text=True)
    assert bare.returncode != 0 and "--config tiny_cpu" in bare.stderr
