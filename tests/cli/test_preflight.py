"""Checked before compute: dataset files named with file and line, one batch per rank, a model path that does not
exist, reward signatures, and the unscored-reward alert on a real fit."""

from __future__ import annotations

import pytest
from helpers import fit, length_reward, make_module

from lightning_grpo.callbacks import UnscoredRewardAlert
from lightning_grpo.data import PromptDataModule, load_any
from lightning_grpo.engines import OpenAIAgent, RolloutFunction, ToolCalling
from lightning_grpo.model.loading import resolve_pretrained
from lightning_grpo.rewards.convention import check_signatures
from tests.engines.multiturn.test_environments import Echo


@pytest.mark.parametrize(
    "content,message",
    [
        (b'{"prompt": "a"}\n{"prompt": "\xff\xfe"}\n', "line 2 is not UTF-8 (byte 0xff at column 13)"),
        (b'{"prompt": "a"}\n\n{"prompt": "b",}\n', "line 3 is not valid JSON"),
        (b"\n  \n\n", "has no rows: its 3 lines are all blank"),
        (b'{"prompt": "a"}\n["b"]\n', "line 2 is a JSON list, not an object"),
    ],
)
def test_a_bad_dataset_file_is_named_with_its_line(tmp_path, content, message):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="rows.jsonl") as err:
        load_any(str(path), "train")
    assert message in str(err.value)


def test_a_json_array_file_still_loads(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[{"prompt": "a"}, {"prompt": "b"}]')
    assert len(load_any(str(path), "train")) == 2


def test_fewer_rows_than_one_batch_are_refused(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(5)))
    data = PromptDataModule(str(path), batch_size=8, val_split=None)
    with pytest.raises(ValueError, match="has 5 training rows, fewer than one batch: data.batch_size=8"):
        data.setup("fit")


def test_a_model_path_that_does_not_exist_is_named():
    with pytest.raises(FileNotFoundError, match="model './no/such/model' is neither an existing directory"):
        resolve_pretrained("./no/such/model")
    assert resolve_pretrained("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # left to the hub


def test_a_reward_without_kwargs_is_refused_before_compute():
    def strict(prompts, completions):
        return [0.0] * len(completions)

    with pytest.raises(TypeError, match=r"reward function 'strict' does not accept \['answer'"):
        check_signatures([strict], ["answer"])
    check_signatures([length_reward], ["answer"])


def none_reward(completions, **kwargs):
    return [None] * len(completions)


def test_a_reward_that_never_scores_is_named(tiny_model_dir, arith_jsonl, tmp_path):
    alert = UnscoredRewardAlert(patience=2)
    module = make_module(tiny_model_dir, reward_funcs=[none_reward, length_reward], accuracy_reward=None)
    data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None)
    with pytest.warns(UserWarning, match=r"reward function 'none_reward' returns NaN or None, since step 1"):
        fit(module, data, tmp_path, max_steps=3, callbacks=[alert])
    assert [f.signal for f in alert.firings] == ["unscored/none_reward"]  # length_reward scores: not named
    assert (tmp_path / "lightning_logs" / "version_0" / "alerts.jsonl").exists()


def test_prompts_over_max_prompt_length_are_named_at_start(tiny_model_dir, tmp_path):
    import lightning as L

    from lightning_grpo.cli.preflight import preflight

    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(f'{{"prompt": "{"1+" * (i % 3 * 10)}1=", "answer": "1"}}\n' for i in range(12))
    )  # 2, 22, 42 chars
    module = make_module(tiny_model_dir, sampling={"max_prompt_length": 16})
    trainer = L.Trainer(accelerator="cpu", logger=False)
    data = PromptDataModule(str(path), batch_size=4, val_split=None)
    with pytest.warns(
        UserWarning, match=r"8 of 12 training prompts are longer than model.sampling.max_prompt_length=16"
    ):
        preflight(trainer, module, data)


def wants_agent_reward(completions, agent_reward, **kwargs):
    return list(agent_reward)


def wants_environment_reward(completions, environment_reward, **kwargs):
    return list(environment_reward)


def wants_my_column(completions, my_column, **kwargs):
    return list(my_column)


ENGINES = {
    "agent": (lambda: OpenAIAgent(lambda client, row: 1.0), wants_agent_reward),
    "environment": (lambda: ToolCalling(environment_factory=Echo), wants_environment_reward),
    "rollout_func": (lambda: RolloutFunction(lambda prompts, trainer: {}), wants_my_column),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_engine_s_own_columns_pass_the_signature_check(tiny_model_dir, arith_jsonl, engine):
    """``agent_reward`` (OpenAIAgent), ``environment_reward`` (an environment_factory) and a rollout_func's own
    fields are arguments the reward functions get, though the dataset has no such column; without the engine, the
    same function is refused before compute."""
    import lightning as L

    from lightning_grpo.cli.preflight import preflight

    make_engine, reward = ENGINES[engine]
    trainer = L.Trainer(accelerator="cpu", logger=False)

    def check(**kw) -> None:
        data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None)
        preflight(trainer, make_module(tiny_model_dir, reward_funcs=[reward], accuracy_reward=None, **kw), data)

    check(rollout_engine=make_engine())
    with pytest.raises(TypeError, match=f"'{reward.__name__}' needs argument"):
        check()


def test_the_refusal_names_the_engine_s_columns_apart_from_the_dataset_s(tiny_model_dir, arith_jsonl):
    import lightning as L

    from lightning_grpo.cli.preflight import preflight

    module = make_module(
        tiny_model_dir,
        reward_funcs=[wants_my_column],
        accuracy_reward=None,
        rollout_engine=OpenAIAgent(lambda client, row: 1.0),
    )
    data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None)
    with pytest.raises(TypeError) as err:
        preflight(L.Trainer(accelerator="cpu", logger=False), module, data)
    assert str(err.value).endswith(
        "the dataset columns ['answer'] and the rollout engine's ['agent_reward', 'episode_id']"
    )


def test_every_problem_of_a_dataset_file_is_listed_at_once(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [
        '{"prompt": "1+1=", "answer": "2"}',
        '{"prompt": "2+2=", "answer": "4",}',  # 2: not JSON
        '{"prompt": 42, "answer": "4"}',  # 3: a number
        '{"prompt": [{"content": "3+3="}], "answer": "6"}',  # 4: a message without a role
        '{"prompt": [{"role": "user", "content": "4+4="}], "answer": "8"}',
        '{"answer": "10"}',  # 6: no prompt
        '{"prompt": "5+5=", "answer": "\xff"}',  # 7: not UTF-8 once written as latin-1
    ]
    path.write_bytes("\n".join(lines).encode("latin-1"))
    with pytest.raises(ValueError) as err:
        PromptDataModule(str(path), batch_size=1, val_split=None).setup("fit")
    message = str(err.value)
    assert f"dataset file '{path}' has 5 problems; all of them, by line:" in message
    for expected in [
        "line 2 is not valid JSON",
        "line 3: 'prompt' is 42 (int)",
        "line 4: 'prompt' message 0 has no 'role': {'content': '3+3='}",
        "line 6: 'prompt' is missing",
        "line 7 is not UTF-8 (byte 0xff",
    ]:
        assert expected in message, expected
    assert message.endswith(
        "A prompt is a string, or a list of chat messages, each a dict with 'role' and 'content' "
        '(e.g. [{"role": "user", "content": "2+2="}])'
    )


def test_a_long_list_of_problems_is_cut_and_counted(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"prompt": {i}}}\n' for i in range(25)))
    with pytest.raises(ValueError, match="has 25 problems") as err:
        load_any(str(path), "train", prompt_column="prompt")
    assert "line 10: 'prompt' is 9 (int)" in str(err.value) and "line 11:" not in str(err.value)
    assert "  - ... and 15 more\nA prompt is a string" in str(err.value)


def test_prompts_of_a_loaded_dataset_are_checked_by_column_and_row(tmp_path):
    from datasets import Dataset

    rows = [{"question": "1+1="}, {"question": None}, {"question": "2+2="}]
    Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    with pytest.raises(ValueError) as err:
        PromptDataModule(str(tmp_path / "rows.parquet"), batch_size=1, prompt_column="question").setup("fit")
    assert "(train split) has 1 rows whose data.prompt_column 'question' is not a prompt" in str(err.value)
    assert "row 1: 'question' is None (null)" in str(err.value)


def test_bad_data_is_refused_before_the_model_loads(tmp_path, capsys):
    """The model path does not exist: loading it first would name the model, not the data."""
    from lightning_grpo.cli.main import main

    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": 1}\n{"prompt": "2+2="}\n{"prompt": [{"role": "user"}]}\n')
    with pytest.raises(SystemExit):
        main(["fit", "--data.dataset", str(path), "--model.model", str(tmp_path / "no-model"), "--trainer.max_steps=1"])
    err = capsys.readouterr().err
    assert "line 1: 'prompt' is 1 (int)" in err and "line 3: 'prompt' message 0 has no 'content'" in err
    assert "no-model" not in err


def test_a_row_that_costs_more_memory_than_the_run_is_named_at_start(tiny_model_dir, tmp_path):
    """Cut to 16 tokens, but tokenized whole first: 30,000 characters cost ~10 MB, the model's state ~2 MB."""
    import lightning as L

    from lightning_grpo.cli.preflight import preflight

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"prompt": "{"1+" * (15_000 if i == 5 else 1)}1=", "answer": "2"}}\n' for i in range(8)))
    module = make_module(tiny_model_dir, sampling={"max_prompt_length": 16})
    data = PromptDataModule(str(path), batch_size=4, val_split=None)
    with pytest.warns(UserWarning, match=r"1 training row\(s\) are so long that tokenizing one costs more memory") as w:
        preflight(L.Trainer(accelerator="cpu", logger=False), module, data)
    message = next(str(m.message) for m in w if "so long" in str(m.message))
    assert "row 5 of" in message and "holds 30,002 characters: up to 9 MB" in message
    assert "max_prompt_length=16 cuts it after tokenizing" in message
