"""`lightning-grpo fit` then `lightning-grpo report` on the tiny model."""

from __future__ import annotations

from lightning_grpo.cli import main


def test_cli_run_then_report(tmp_path, capsys):
    root = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            "templates/tiny_cpu.yaml",
            "--trainer.max_steps",
            "12",
            "--trainer.log_every_n_steps",
            "4",
            "--trainer.val_check_interval",
            "6",
            "--trainer.default_root_dir",
            str(root),
            "--data.max_val_prompts",
            "16",
            "--samples.every_n_steps",
            "4",
        ]
    )
    run_dir = next(root.glob("lightning_logs/version_*"))
    assert (run_dir / "samples.jsonl").exists()
    main(["report", str(run_dir)])
    assert "report.png" in capsys.readouterr().out
    import matplotlib.image

    image = matplotlib.image.imread(run_dir / "report.png")
    assert image.shape[0] > 500 and image.shape[1] > 500
    page = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in page and "train/reward" in page

    from lightning_grpo.cli.report import write_report

    report = write_report(run_dir)
    assert len(report.series["train/reward"]) == 3  # log_every_n_steps: 4
    assert len(report.series["val/accuracy"]) >= 2
