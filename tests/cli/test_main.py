"""The CLI: every shipped YAML parses, and a short real run goes through `lightning-grpo fit`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import ROOT, run_cli

from lightning_grpo.cli import main
from lightning_grpo.cli.failure import failure_message

TINY = ROOT / "templates" / "tiny_cpu.yaml"
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


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--model.loss.loss_type", "ppo", "Expected a typing.Literal['grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo'"),
        ("--model.num_generations", "1", "num_generations must be >= 2, got 1"),
        ("--model.sampling.top_p", "1.5", "sampling.top_p must be in (0, 1], got 1.5"),
    ],
)
def test_bad_value_fails_before_training(tmp_path, capsys, flag, value, message):  # exit 2, the message, no traceback
    with pytest.raises(SystemExit) as done:
        main(
            [
                "fit",
                "--config",
                str(ROOT / "templates" / "tiny_cpu.yaml"),
                flag,
                value,
                "--trainer.default_root_dir",
                str(tmp_path),
            ]
        )
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.glob("lightning_logs/*/checkpoints/*"))


def test_console_script_exits_zero(tmp_path):
    """`sys.exit(main())` in the console script: a successful run must exit with status 0, and says its torch
    threads in one line."""
    proc = subprocess.run(
        [
            sys.executable,  # what the console script runs, without needing it on PATH
            "-c",
            "import sys; from lightning_grpo.cli import main; sys.exit(main())",
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
    assert len([line for line in proc.stderr.splitlines() if line.startswith("torch threads: ")]) == 1
    assert "not recommended to provide both args and command line arguments" not in proc.stderr


def test_python_dash_m_runs_the_cli(tmp_path):
    proc = run_cli(["--help"], cwd=tmp_path, entry=[sys.executable, "-m", "lightning_grpo"])
    assert proc.returncode == 0 and "usage: lightning-grpo" in proc.stdout


def test_top_level_help_names_report(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "lightning-grpo report RUN_DIR" in capsys.readouterr().out


def test_fit_help_fits_on_a_few_screens(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    # 580 lines with each option's metavar, `--X.help` entries and `(default: ...)` on lines of their own
    # 450 -> 460 for the distill: section (its 9 options and heading: 11 lines); 462: distill.teacher_server;
    # 438 -> 383 with the five alerts in one section, each a line (`--alerts.kl.help KLAlert` shows its settings);
    # 387 -> 390 with alerts.distill (its line and two of help); 394 with alerts.signal
    assert len(out.splitlines()) <= 400, "fit --help grew: was 1,565 lines before the known subclasses went"
    assert "known subclasses" not in out and "torch.nn.Identity" not in out
    assert "--model.num_generations [8]  completions per prompt (G), >= 2." in out and "--data.few_shot" in out
    assert "--model.loss.loss_type {grpo,bnpo,dr_grpo,dapo,luspo,cispo,sapo,vespo} [dapo]" in out  # choices, default
    assert "--trainer.enable_checkpointing {true,false,null}" in out
    assert "--alerts.kl [KLAlert]" in out and "--alerts.kl.max_kl" not in out  # one line per alert
    # a section's help is the docstring under each field (docstrings.field_help): its first clause shows
    assert "Drop completions without EOS from the loss (DAPO)." in out
    assert "Hugging Face name or local path of the teacher" in out  # distill's, not shown before field_help


@pytest.mark.parametrize(
    "flag,suggestion",
    [("--model.num_generation", "--model.num_generations"), ("--model.num_generatons", "--model.num_generations")],
)
def test_abbreviations_and_typos_fail_short_with_a_suggestion(flag, suggestion, capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(ROOT / "templates" / "tiny_cpu.yaml"), flag, "4", "--print_config"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {flag} 4; did you mean {suggestion}?" in err
    assert len(err.splitlines()) <= 4, err[:2000]


def test_a_typo_in_a_config_file_gets_a_suggestion(tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text("model:\n  num_generation: 4\n")
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(TINY), "--config", str(tmp_path / "typo.yaml"), "--print_config"])
    assert done.value.code == 2
    assert "'num_generation'; did you mean --model.num_generations?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "where,text,moved",
    [
        ("argv", "--model.num_iterations", "--model.num_iterations moved to --model.update.num_iterations"),
        ("file", "model:\n  peft_config: {r: 4}\n", "--model.peft_config moved to --model.policy.peft_config"),
        ("file", "model:\n  on_reward_error: skip\n", "--model.on_reward_error moved to --model.reward_calls.on_error"),
    ],
)
def test_a_setting_that_moved_into_a_section_is_named_with_its_new_place(tmp_path, capsys, where, text, moved):
    args = ["fit", "--config", str(TINY), "--print_config"]
    if where == "argv":
        args += [text, "2"]
    else:
        (tmp_path / "old.yaml").write_text(text)
        args += ["--config", str(tmp_path / "old.yaml")]
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2 and moved in capsys.readouterr().err


def test_threads_section_is_configured(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(TINY), "--threads.num_threads", "1", "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["threads"] == {"num_threads": 1}


def test_system_prompt_and_few_shot_from_yaml_reach_the_model(tmp_path):
    (tmp_path / "chat.yaml").write_text(
        "data:\n"
        "  system_prompt: Answer with one digit.\n"
        "  few_shot:\n"
        "    - {role: user, content: 'max(1,2,3)='}\n"
        "    - {role: assistant, content: '3'}\n"
    )
    main(
        [
            "fit",
            "--config",
            str(ROOT / "templates" / "tiny_cpu.yaml"),
            "--config",
            str(tmp_path / "chat.yaml"),
            "--trainer.max_steps",
            "1",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--model.num_generations",
            "2",
            "--data.batch_size",
            "2",
        ]
    )
    sample = json.loads(next(tmp_path.glob("lightning_logs/version_*/samples.jsonl")).read_text().splitlines()[0])
    assert sample["prompt"].startswith("system: Answer with one digit.\nuser: max(1,2,3)=\nassistant: 3\nuser: max(")


def test_a_step_checkpoint_run_prints_no_warning_a_user_cannot_act_on(tmp_path, recwarn):
    every_step = '{"every_n_train_steps": 1}'
    checkpoint = f'{{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {every_step}}}'
    # (Python hides DeprecationWarnings raised inside libraries, e.g. jsonargparse's about Lightning's calls)
    main(
        ["fit", "--config", str(TINY), "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path)]
        + ["--trainer.callbacks", f"[{checkpoint}]", "--data.max_val_prompts", "8"]
    )
    # (and LightningCLI warns here only because pytest's own sys.argv sits beside the args given in Python)
    shown = [
        w for w in recwarn if not issubclass(w.category, DeprecationWarning) and "args parameter" not in str(w.message)
    ]
    assert not [f"{w.category.__name__}: {str(w.message)[:80]}" for w in shown]
    assert list(tmp_path.glob("lightning_logs/version_*/checkpoints/*step=2.ckpt"))


def template_checkpoints() -> list[dict]:
    """The ``ModelCheckpoint`` settings the shipped templates show."""
    found = []
    for config in CONFIGS:
        callbacks = (yaml.safe_load(config.read_text()).get("trainer") or {}).get("callbacks") or []
        found += [c.get("init_args", {}) for c in callbacks if c["class_path"].endswith("ModelCheckpoint")]
    return found


def test_the_templates_show_a_checkpoint_filename_that_makes_no_folders(tiny_model_dir, arith_jsonl, tmp_path):
    from helpers import fit, make_module
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_grpo import PromptDataModule
    from lightning_grpo.callbacks import ValidateAtEnd

    shown = [c for c in template_checkpoints() if "/" in c.get("monitor", "") and "{" in c.get("filename", "")]
    assert shown, "a template shows a ModelCheckpoint that monitors a metric and names it in the filename"
    for settings in shown:
        metrics = {"step": 250, "epoch": 0, settings["monitor"]: 0.5}
        name = ModelCheckpoint(**settings).format_checkpoint_name(metrics)
        assert "/" not in name, name
    checkpoint = ModelCheckpoint(**{**shown[0], "monitor": "val/accuracy"})
    data = PromptDataModule(arith_jsonl, batch_size=4, val_size=4)
    fit(make_module(tiny_model_dir), data, tmp_path, max_steps=2, callbacks=[checkpoint, ValidateAtEnd()],
        enable_checkpointing=True, limit_val_batches=1)  # fmt: skip
    saved = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.ckpt"))
    assert len(saved) == 2 and all(p.parent.name == "checkpoints" for p in saved), saved
    assert any(p.name.startswith("step=2-accuracy=") for p in saved), saved


def test_an_unwritable_lightning_grpo_home_names_the_variable(tmp_path, monkeypatch, capsys):
    """As root no directory is read-only: a home under a plain file cannot be made either."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("LIGHTNING_GRPO_HOME", str(tmp_path / "a-file" / "home"))
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(TINY), "--trainer.max_steps", "1"])
    err = capsys.readouterr().err
    assert f"cannot be written under {tmp_path / 'a-file' / 'home'}, chosen by LIGHTNING_GRPO_HOME" in err
    assert "set LIGHTNING_GRPO_HOME to a writable directory, e.g. `export LIGHTNING_GRPO_HOME=" in err


def mixed_prompts(tmp_path: Path) -> Path:
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(6)]
    rows[3]["prompt"] = [{"role": "user", "content": "3+3="}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("debug", ["", "1"])
def test_debug_prints_the_traceback_of_a_refused_setting(tmp_path, monkeypatch, capsys, debug):
    """Issue 59 item 3: LIGHTNING_GRPO_DEBUG=1 printed nothing more for the mixed-prompts refusal (parser.error)."""
    monkeypatch.setenv("LIGHTNING_GRPO_DEBUG", debug)
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(TINY), "--data.dataset", str(mixed_prompts(tmp_path))])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert "mixes plain-text and chat prompts" in err
    traced = "Traceback (most recent call last)" in err and "in _check_mixed" in err
    assert traced == bool(debug), err[-3000:]


@pytest.mark.parametrize("debug", ["", "1"])
def test_debug_prints_the_traceback_of_a_config_that_is_not_yaml(tmp_path, monkeypatch, capsys, debug):
    monkeypatch.setenv("LIGHTNING_GRPO_DEBUG", debug)
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  num_generations: 4\n\tseed: 1\n")
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(config)])
    assert "line 3 indents with a tab" in str(done.value.code)
    assert ("yaml.scanner.ScannerError" in capsys.readouterr().err) == bool(debug)


OOM_REWARDS = '''
import resource

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

def under_a_memory_limit(work):
    """``work`` under RLIMIT_AS = what the process maps now + 1 MiB (ulimit -v), the limit lifted after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + 2**20, hard))
    try:
        work()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

def allocates(completions, **kwargs):
    under_a_memory_limit(lambda: bytearray(2**30))
    return [0.0 for _ in completions]'''


@pytest.mark.slow
def test_out_of_memory_says_memory_and_the_settings_that_bound_it(tmp_path, monkeypatch, capsys):
    """Issue 59 item 7: under a memory limit the error read ``RuntimeError: can't start new thread``, the
    MemoryError only in a chained traceback. A real RLIMIT_AS (ulimit -v) inside a reward, a real run."""
    (tmp_path / "oom_rewards.py").write_text(OOM_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTNING_GRPO_DEBUG", "")
    args = ["--model.reward_funcs", "[oom_rewards.allocates]", "--model.accuracy_reward", "null"]
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(TINY), "--trainer.max_steps", "1", "--trainer.default_root_dir", "r", *args])
    err = capsys.readouterr().err
    assert done.value.code == 1
    assert "This is out of memory (" in err, err[-3000:]
    for setting in ("data.batch_size", "model.num_generations", "max_completion_length", "micro_batch_tokens"):
        assert setting in err


@pytest.mark.parametrize(
    "make",
    [
        lambda: RuntimeError("can't start new thread"),
        lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        lambda: MemoryError(),
    ],
)
def test_out_of_memory_is_found_anywhere_in_the_chain(make):
    try:
        try:
            raise make()
        except Exception as inner:
            raise ValueError("reward function 'f' raised on sample 0") from inner
    except ValueError as err:
        message = failure_message(err, ["fit"])
    assert "This is out of memory (" in message and "model.update.micro_batch_tokens" in message


def test_an_error_that_is_not_memory_does_not_say_memory():
    assert "memory" not in failure_message(ValueError("bad row"), ["fit"])


def test_two_runs_started_at_once_in_one_root_each_take_a_run_directory_of_their_own(tmp_path):
    """The same command twice at the same moment in one directory: two run directories, each with its own summary
    and exported model (both took ``version_0``, and one died in its export, before ``run.own_version``)."""
    from helpers import console_script

    command = [console_script(), "fit", "--config", "tiny_cpu", "--trainer.max_steps", "1"]
    command += ["--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0", "--threads.num_threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pipes = dict(stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runs = [subprocess.Popen(command, cwd=tmp_path, env=env, **pipes) for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
    versions = sorted(p.name for p in (tmp_path / "runs" / "tiny_cpu" / "lightning_logs").iterdir())
    assert versions == ["version_0", "version_1"], versions
    for version in versions:
        run_dir = tmp_path / "runs" / "tiny_cpu" / "lightning_logs" / version
        assert (run_dir / "summary.json").exists() and (run_dir / "hf_model" / "config.json").exists(), version


@pytest.mark.parametrize("off", [["--model.distill", "null"], ["--model.distill=null"], ["yaml"]], ids=str)
def test_distillation_is_turned_off_on_the_command_line_and_in_yaml(tmp_path, monkeypatch, off):
    """`--model.distill null`, the natural way to turn it off, was refused ("Unable to load config 'null'"): now it
    is `--model.distill.teacher null`, as YAML's `distill: null` is. The template's teacher does not exist here (a
    run that loaded it would fail): the run trains on its reward alone, as the GRPO arm of the comparison."""
    monkeypatch.chdir(tmp_path)
    if off == ["yaml"]:
        (tmp_path / "off.yaml").write_text("model:\n  distill: null\n")
        off = ["--config", "off.yaml"]
    main(["fit", "--config", str(ROOT / "templates" / "distill_cpu.yaml"), *off, "--trainer.max_steps", "1",
          "--data.max_val_prompts", "8", "--trainer.default_root_dir", str(tmp_path / "run")])  # fmt: skip
    run_dir = next((tmp_path / "run").glob("lightning_logs/version_*"))
    assert (yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["distill"] or {}).get("teacher") is None
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("train/reward" in r for r in rows) and not any("train/distill/reverse_kl" in r for r in rows)
