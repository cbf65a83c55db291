"""The step model (``cli/step_model.py``): hand-worked stages, the two schedules, and its error against verl's
published 7B table (fitted on the 64- and 128-GPU synchronous runs; the rest are predictions)."""

from __future__ import annotations

import json

import pytest

from lightning_grpo.cli.step_model import (
    SERVERS_CPU,
    TINY_CPU,
    VERL_7B_ASYNC,
    VERL_7B_SYNC,
    Stage,
    StepModel,
    main,
    nemo_rl_rows,
    predict,
    servers_rows,
    verl_7b,
    verl_rows,
)


def test_a_stage_fitted_through_two_sizes_passes_through_both():
    # 100 s on 1 worker and 60 s on 2: 80 s split over workers, 20 s that is not; 4 workers take 40 s
    stage = Stage.fit((1, 100.0), (2, 60.0))
    assert (stage.parallel, stage.serial) == (80.0, 20.0)
    assert stage.at(4) == 40.0


def test_synchronous_stages_add_up_and_generation_stops_at_its_tail():
    model = StepModel(generation=Stage(800.0), tail=30.0, logprobs=Stage(40.0), update=Stage(160.0), sync=2.0)
    few = model.synchronous(ranks=4, servers=4)  # generation 200 s > tail: 200 + 10 + 40 + 2
    assert few.step == 252.0 and few.trainer_idle == pytest.approx(200 / 252)
    many = model.synchronous(ranks=64, servers=64)  # 12.5 s of bulk, but the longest completion takes 30 s
    assert many.generation == 30.0 and many.step == 30.0 + 0.625 + 2.5 + 2.0


def test_overlapped_takes_the_longer_of_generation_and_training():
    model = StepModel(generation=Stage(800.0), tail=30.0, logprobs=Stage(40.0), update=Stage(160.0), sync=2.0)
    slow_servers = model.overlapped(ranks=8, servers=4)  # generation 200 s against training 25 s: servers bound
    assert slow_servers.step == 202.0 and slow_servers.trainer_idle == pytest.approx(175 / 202)
    balanced = model.overlapped(ranks=4, servers=16)  # generation 50 s, training 50 s: no one waits
    assert balanced.step == 52.0 and balanced.trainer_idle == 0.0


def test_verl_7b_table_within_the_documented_error():
    """references/scale.md states these errors: -19% at 32 GPUs (training there is slower than Amdahl's law
    through 64 and 128 allows), within 12% elsewhere."""
    errors = {run: predicted / measured - 1 for run, predicted, measured in verl_rows(verl_7b())}
    assert len(errors) == len(VERL_7B_SYNC) + len(VERL_7B_ASYNC)
    assert errors["sync, 32 GPUs"] == pytest.approx(-0.19, abs=0.01)
    assert all(abs(e) <= 0.12 for run, e in errors.items() if run != "sync, 32 GPUs"), errors


def test_nemo_rl_s_efficiencies_beside_the_model_s_as_documented():
    """references/scale.md states them: the model fitted to verl's 7B runs keeps 51-53% per doubling on-policy
    (NeMo-RL: ~60%) and 63% from 32 to 192 GPUs overlapped (NeMo-RL: ~93%): its generation, fitted on verl's
    32-GPU run, still holds the step at 16 rollout GPUs."""
    rows = {claim: (predicted, published) for claim, predicted, published in nemo_rl_rows(verl_7b())}
    assert rows["on-policy, 128 -> 256 GPUs"] == (pytest.approx(0.528, abs=0.001), 0.60)
    assert rows["on-policy, 256 -> 512 GPUs"] == (pytest.approx(0.514, abs=0.001), 0.60)
    assert rows["8 steps off, 32 -> 192 GPUs"] == (pytest.approx(0.635, abs=0.001), 0.93)


def test_the_command_prints_the_table(capsys):
    main([])
    out = capsys.readouterr().out
    assert "| fully async, 64:64 | 144.2 | 150.6 | -4% |" in out


def test_this_machine_s_model_passes_through_its_calibration_runs():
    """``tiny_cpu`` reproduces each stage of the three runs it is fitted on (1 and 2 ranks at 1666 tokens a step,
    1 rank at 3330), and puts a step of other tokens on the line between them."""
    for (ranks, tokens), measured in TINY_CPU.items():
        split = predict(ranks, tokens)
        for stage in ("generation", "logprobs", "update"):
            assert getattr(split, stage) == pytest.approx(getattr(measured, stage), rel=1e-9), (ranks, tokens, stage)
    halfway = predict(1, (1666 + 3330) / 2).update
    assert halfway == pytest.approx((TINY_CPU[1, 1666].update + TINY_CPU[1, 3330].update) / 2)


def test_the_servers_model_passes_through_its_runs_and_predicts_the_held_out_one_as_documented():
    """``servers_cpu``, fitted on 1 rank x 1 and 2 servers and 2 ranks x 1 server (``SERVERS_CPU``), reproduces
    each fitted stage (log-probs and update of the 1 x 2 run within 2%: the model gives them no dependence on the
    servers), and predicts the held-out 2 x 2 run with the errors references/scale.md states: generation -22% (two
    ranks' requests on 2 cores wait for each other: the model gives generation no dependence on the ranks), log-probs
    -2%, update +4%, sync -6%."""
    errors = {}
    for run, measured, predicted in servers_rows():
        for stage in ("generation", "logprobs", "update", "sync"):
            errors[run, stage] = getattr(predicted, stage) / getattr(measured, stage) - 1
    assert len(errors) == 4 * len(SERVERS_CPU)
    fitted = {
        key: e
        for key, e in errors.items()
        if "2 rank(s) x 2" not in key[0] and key != ("2 rank(s) x 1 server(s)", "generation")
    }
    assert all(abs(e) <= 0.02 for e in fitted.values()), fitted
    held_out = [errors["2 rank(s) x 2 server(s)", s] for s in ("generation", "logprobs", "update", "sync")]
    assert held_out == [pytest.approx(e, abs=0.01) for e in (-0.22, -0.02, 0.04, -0.06)]


def test_the_command_answers_one_shape_and_says_where_a_fit_does_not_hold(capsys):
    """Issue 59: the step model took no options, and nothing said that a CPU-fitted model must not be read at GPU
    counts."""
    main(["--fit", "cpu", "--ranks", "2", "--servers", "2", "--tokens", "3332"])
    out = capsys.readouterr().out
    assert out.startswith("cpu, 2 rank(s), 2 vLLM-CPU server(s), 3332 tokens: ") and "warning" not in out
    main(["--fit", "cpu", "--ranks", "64"])
    assert "warning: the cpu fit is read beyond the 2 ranks and servers" in capsys.readouterr().out
    main(["--fit", "verl-7b", "--ranks", "64"])
    out = capsys.readouterr().out
    assert "synchronous on 64 GPUs" in out and "overlapped at 32:32" in out and "warning" not in out
    main(["--fit", "verl-7b", "--ranks", "512"])
    assert "beyond the 128 GPUs it was fitted to" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--ranks", "4"])
    assert "--fit and --ranks go together" in capsys.readouterr().err


def test_a_calibration_file_of_your_own_runs_is_fitted_and_asked(tmp_path, capsys):
    """Issue 59 item 5: the step model took no calibration of one's own. A file of this machine's two tiny_cpu runs
    (1 and 2 ranks) predicts both back (a stage fitted through two sizes passes through both), warns beyond them,
    and a file it cannot read is refused naming it and the format."""
    from dataclasses import asdict

    from lightning_grpo.cli.step_model import TINY_CPU

    runs = {str(ranks): asdict(TINY_CPU[ranks, 1666]) for ranks in (1, 2)}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(runs))
    main(["--calibration", str(path), "--ranks", "2"])
    out = capsys.readouterr().out
    two = runs["2"]  # its stages back (the sync is the runs' mean: a fixed cost)
    stages = f"generation {two['generation']:.4g}, log-probs {two['logprobs']:.4g}, update {two['update']:.4g}"
    assert out.startswith(f"{path}, 2 rank(s), in-process generation: ") and stages in out and "warning" not in out
    main(["--calibration", str(path), "--ranks", "8"])
    assert f"warning: {path} is read beyond the 2 ranks it measured" in capsys.readouterr().out
    path.write_text(json.dumps({"1": runs["1"]}))
    for argv in (["--calibration", str(path), "--ranks", "2"], ["--calibration", "nowhere.json", "--ranks", "2"],
                 ["--calibration", str(path), "--ranks", "2", "--servers", "2"]):  # fmt: skip
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert "--calibration" in err and ("generation" in err or "--ranks N alone" in err), err
