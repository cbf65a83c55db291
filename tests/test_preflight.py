"""Checked before compute: dataset files named with file and line, one batch per rank, a model path that does not
exist, reward signatures, and the unscored-reward alert on a real fit."""

from __future__ import annotations

import pytest

from lightning_grpo.callbacks import UnscoredRewardAlert
from lightning_grpo.data import PromptDataModule, load_any
from lightning_grpo.engines import OpenAIAgent, RolloutFunction, ToolCalling
from lightning_grpo.model.loading import resolve_pretrained
from lightning_grpo.rewards.convention import check_signatures
from tests.helpers import fit, length_reward, make_module
from tests.test_environments import Echo


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
