"""The CLI: every shipped YAML parses, and a short real run goes through `lightning-grpo fit`."""

import json
from pathlib import Path

import pytest
import yaml

from lightning_grpo.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "templates").glob("*.yaml")) + sorted((ROOT / "examples").glob("*.yaml"))


def test_there_are_configs():
    assert CONFIGS


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_yaml_parses(config, capsys):
    first = config.read_text().splitlines()[0]
    assert first.startswith("# lightning-grpo fit --config"), "a config starts with the command that runs it"
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(config), "--print_config"])
    assert done.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["reward_funcs"] and printed["data"]["dataset"]


def test_short_cli_run_writes_summary_and_export(tmp_path):
    main(
        [
            "fit",
            "--config",
            str(ROOT / "templates" / "tiny_cpu.yaml"),
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--data.max_val_prompts",
            "16",
        ]
    )
    run_dir = next(tmp_path.glob("lightning_logs/version_*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["accuracy_after"] is not None
    assert (run_dir / "hf_model" / "config.json").exists() and (run_dir / "config.yaml").exists()


def test_bad_value_fails_before_training(tmp_path, capsys):  # exit 2 with the message, no traceback
    with pytest.raises(SystemExit) as done:
        main(
            [
                "fit",
                "--config",
                str(ROOT / "templates" / "tiny_cpu.yaml"),
                "--model.loss_type",
                "ppo",
                "--model.num_generations",
                "1",
                "--trainer.default_root_dir",
                str(tmp_path),
            ]
        )
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert (
        "loss_type must be one of ['bnpo', 'cispo', 'dapo', 'dr_grpo', 'grpo', 'luspo', 'sapo', 'vespo'], got 'ppo'"
        in err
    )
    assert "num_generations must be >= 2, got 1" in err
    assert not list(tmp_path.glob("lightning_logs/*/checkpoints/*"))


def test_console_script_exits_zero(tmp_path):
    """`sys.exit(main())` in the console script: a successful run must exit with status 0."""
    import shutil
    import subprocess

    proc = subprocess.run(
        [
            shutil.which("lightning-grpo"),
            "fit",
            "--config",
            str(ROOT / "templates" / "tiny_cpu.yaml"),
            "--trainer.max_steps",
            "2",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not recommended to provide both args and command line arguments" not in proc.stderr
