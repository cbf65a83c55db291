"""``lightning-grpo report`` sets the run's own step split (``train/time/<stage>_s``, logged every step by
``metrics.StageClock``) beside the step model's prediction for the run's shape (``cli/step_model.py``
``predict``: the model calibrated on this machine, scaled by the run's tokens a step), with the error of each."""

from __future__ import annotations

import statistics

import yaml
from helpers import fit, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import MetricsFile
from lightning_grpo.cli.main import main
from lightning_grpo.cli.report import run_servers, step_split, write_report
from lightning_grpo.cli.step_model import predict
from lightning_grpo.metrics import STAGES
from lightning_grpo.run import run_dir


def test_a_real_run_s_report_holds_its_split_beside_the_prediction(tiny_model_dir, arith_jsonl, tmp_path, capsys):
    trainer = fit(make_module(tiny_model_dir), PromptDataModule(arith_jsonl, batch_size=4), tmp_path, max_steps=4,
                  callbacks=[MetricsFile()])  # fmt: skip
    report = write_report(run_dir(trainer))
    rows = {row.stage: row for row in report.split}
    assert list(rows) == [*STAGES, "rest of the step", "step"] and report.ranks == 1
    assert rows["generation"].measured > 0 and rows["update"].measured > 0 and rows["step"].measured > 0
    # the stages and the rest add up to the step (medians of the steps after the first: close, not equal)
    assert abs(sum(r.measured for s, r in rows.items() if s != "step") - rows["step"].measured) < 1e-9
    tokens = [v for _, v in report.series["train/num_tokens"]]  # cumulative, one a step: the median step's
    expected = predict(1, statistics.median(b - a for a, b in zip(tokens, tokens[1:])))
    assert rows["update"].predicted == expected.update and rows["step"].predicted == expected.step
    assert rows["scoring"].predicted is None and rows["generation"].error().endswith("%")
    assert "Step split" in report.html.read_text() and "| generation |" in report.split_table()
    main(["report", str(run_dir(trainer))])
    assert "measured (median s) against the step model" in capsys.readouterr().out


def test_a_run_over_vllm_servers_is_set_beside_the_servers_model(tmp_path):
    """The servers a run generated from are read from its config.yaml (a ``VLLMServer``'s ``base_url``, also inside
    ``AsyncRollouts``), and its split is predicted by ``servers_cpu`` for them; any other engine: in process."""
    engines = {
        "two": {"class_path": "lightning_grpo.engines.VLLMServer", "init_args": {"base_url": "http://a:1,http://b:1"}},
        "async": {"class_path": "lightning_grpo.engines.AsyncRollouts",
                  "init_args": {"engine": {"class_path": "lightning_grpo.engines.VLLMServer"}}},
        "lean": {"class_path": "lightning_grpo.engines.LeanDecode"},
    }  # fmt: skip
    for name, engine in engines.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump({"model": {"rollout_engine": engine}}))
    assert [run_servers(tmp_path / name) for name in engines] == [2, 1, 0] and run_servers(tmp_path) == 0
    series = {f"train/time/{stage}_s": [(0, 1.0), (1, 0.05)] for stage in STAGES}
    series |= {"train/step_time": [(0, 1.0), (1, 0.2)], "train/num_tokens": [(0, 1664), (1, 3328)]}
    rows = {row.stage: row for row in step_split(series, ranks=1, servers=2)}
    assert rows["step"].predicted == predict(1, 1664, servers=2).step != predict(1, 1664).step
