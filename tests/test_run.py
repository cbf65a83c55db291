"""Every run owns its directory, whatever the logger: two runs in a row never share summary, samples, metrics or
the exported model, and ``lightning-grpo report`` reads each of them."""

from __future__ import annotations

import json
import warnings

import lightning as L
import pytest
from helpers import fit, make_module
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import CompletionSampleLogger, HFExport, MetricsFile, RunSummary, ValidateAtEnd
from lightning_grpo.cli.report import write_report
from lightning_grpo.run import run_dir


def mlflow_logger(tmp_path):
    pytest.importorskip("mlflow", reason="MLflow is not installed (pip install -e '.[loggers]')")
    from lightning.pytorch.loggers import MLFlowLogger

    return MLFlowLogger(experiment_name="grpo", tracking_uri=f"file:{tmp_path / 'mlruns'}")


def wandb_logger(tmp_path):
    pytest.importorskip("wandb", reason="W&B is not installed (pip install -e '.[loggers]')")
    from lightning.pytorch.loggers import WandbLogger

    return WandbLogger(project="grpo", save_dir=str(tmp_path), offline=True)


LOGGERS = {
    "csv": lambda tmp_path: CSVLogger(tmp_path),
    "tensorboard": lambda tmp_path: TensorBoardLogger(tmp_path),
    "mlflow": mlflow_logger,
    "wandb": wandb_logger,
}


def run(tiny_model_dir, arith_jsonl, tmp_path, logger):
    samples, export = CompletionSampleLogger(every_n_steps=1, max_rows=2), HFExport()
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=logger,
        default_root_dir=tmp_path,
        callbacks=[RunSummary(), samples, export, MetricsFile(), ValidateAtEnd()],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    trainer.fit(make_module(tiny_model_dir), PromptDataModule(arith_jsonl, batch_size=4, val_size=4))
    if type(logger).__name__ == "WandbLogger":
        logger.experiment.finish()  # as a second process would: a new W&B run, not the first one reused
    return trainer, export


@pytest.mark.parametrize("name", sorted(LOGGERS))
def test_two_runs_in_a_row_own_their_directories(tiny_model_dir, arith_jsonl, tmp_path, monkeypatch, name):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store only on request
    first, first_export = run(tiny_model_dir, arith_jsonl, tmp_path, LOGGERS[name](tmp_path))
    exported = (first_export.path / "model.safetensors").read_bytes()
    second, second_export = run(tiny_model_dir, arith_jsonl, tmp_path, LOGGERS[name](tmp_path))
    dirs = [run_dir(first), run_dir(second)]
    assert dirs[0] != dirs[1] and all(d.is_dir() for d in dirs), dirs
    assert first_export.path == dirs[0] / "hf_model" and second_export.path == dirs[1] / "hf_model"
    assert (first_export.path / "model.safetensors").read_bytes() == exported  # the second run wrote elsewhere
    for directory in dirs:
        assert json.loads((directory / "summary.json").read_text())["steps"] == 2
        rows = [json.loads(line) for line in (directory / "samples.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 1, 2, 2]  # this run's rows only
        report = write_report(directory)
        assert [s for s, _ in report.series["train/reward"]] == [1, 2] and "val/reward" in report.series
        assert report.png.exists()
    assert dirs[1] / "checkpoints" in {p.parent for p in dirs[1].rglob("*.ckpt")}  # Lightning's checkpoints too


def test_without_a_logger_a_second_export_goes_beside_the_first(tiny_model_dir, arith_jsonl, tmp_path):
    _, first = run(tiny_model_dir, arith_jsonl, tmp_path, False)
    with pytest.warns(UserWarning, match="already holds an exported model .* goes to .*hf_model-2"):
        _, second = run(tiny_model_dir, arith_jsonl, tmp_path, False)
    assert first.path == tmp_path / "hf_model" and second.path == tmp_path / "hf_model-2"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (second.path / "config.json").exists()


def test_metrics_jsonl_comes_from_the_metrics_file_callback_not_the_module(tiny_model_dir, arith_jsonl, tmp_path):
    """The CLI adds ``MetricsFile``; through the Python API the module writes no file of its own, and
    ``callbacks=[MetricsFile()]`` gives the run the same ``metrics.jsonl``, one row a step, for ``report``."""
    data = PromptDataModule(arith_jsonl, batch_size=4)
    bare = fit(make_module(tiny_model_dir), data, tmp_path / "bare")
    assert not (run_dir(bare) / "metrics.jsonl").exists()
    with_file = fit(make_module(tiny_model_dir), data, tmp_path / "with", callbacks=[MetricsFile()])
    rows = [json.loads(line) for line in (run_dir(with_file) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("train/reward" in r for r in rows)
    assert [s for s, _ in write_report(run_dir(with_file)).series["train/reward"]] == [1, 2]
