"""cli/argv.py: the command line before LightningCLI reads it: a config's own directory and the working directory
importable, a config that is not YAML named by file and line (templates by name and bare ``fit``:
tests/test_wheel.py)."""

import sys

import pytest
from helpers import ROOT, run_cli

from lightning_grpo.cli import main

TINY = ROOT / "templates" / "tiny_cpu.yaml"
MY_REWARDS = "def my_reward(completions, **kwargs):\n    return [1.0 for _ in completions]\n"


def test_a_reward_module_next_to_the_config_is_importable(tmp_path):
    # `python -m` puts the working directory on sys.path, not the config's directory: that one is ours to add.
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "my_rewards.py").write_text(MY_REWARDS)
    (tmp_path / "exp" / "config.yaml").write_text("model:\n  reward_funcs: [my_rewards.my_reward]\n")
    args = ["fit", "--config", str(ROOT / "templates" / "tiny_cpu.yaml"), "--config", "exp/config.yaml"]
    proc = run_cli([*args, "--print_config"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "my_rewards.my_reward" in proc.stdout


def test_a_reward_module_in_the_working_directory_is_importable(tmp_path):
    # A console script's sys.path starts with its own bin/ directory, not the working directory.
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lightning-grpo").write_text("from lightning_grpo.cli import main\nmain()\n")
    args = ["fit", "--config", str(TINY), "--model.reward_funcs", "[my_rewards.my_reward]"]
    proc = run_cli([*args, "--print_config"], cwd=tmp_path, entry=[sys.executable, str(bin_dir / "lightning-grpo")])
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_tab_in_a_config_s_indentation_names_the_file_and_line(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  num_generations: 4\n\tseed: 1\n")
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(config), "--print_config"])
    message = str(done.value.code) + capsys.readouterr().err
    assert f"--config '{config}': line 3 indents with a tab: YAML indents with spaces only" in message
    assert "<unicode string>" not in message
