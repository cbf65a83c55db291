import json

import pytest
from datasets import Dataset, DatasetDict

from lightning_grpo import PromptDataModule

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]


def batches(dm):
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_files_of_each_format(tmp_path, fmt):
    path = tmp_path / f"train.{fmt}"
    ds = Dataset.from_list(ROWS)
    {
        "jsonl": lambda: ds.to_json(path),
        "csv": lambda: ds.to_csv(path),
        "parquet": lambda: ds.to_parquet(path),
    }[fmt]()
    batch = batches(PromptDataModule(str(path), batch_size=4, val_split=None))
    assert len(batch.prompts) == 4 and set(batch.columns) == {"answer"}
    assert all(str(int(p.split("+")[0]) + 1) == str(a) for p, a in zip(batch.prompts, batch.columns["answer"]))


def test_save_to_disk_directory_with_validation_split(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:2])}).save_to_disk(tmp_path / "d")
    dm = PromptDataModule(str(tmp_path / "d"), batch_size=2, val_split="test")
    dm.setup("fit")
    assert len(dm.train_data) == 6 and len(dm.val_data) == 2


def test_chat_prompts_get_the_system_prompt(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "solution": "x"}) + "\n")
    batch = batches(PromptDataModule(str(path), batch_size=1, system_prompt="Be brief.", val_split=None))
    assert batch.prompts[0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert batch.columns == {"solution": ["x"]}


def test_held_out_rows_when_there_is_no_validation_split(arith_jsonl):
    dm = PromptDataModule(arith_jsonl, batch_size=2, val_size=4)
    dm.setup("fit")
    assert len(dm.train_data) == 12 and len(dm.val_data) == 4


def test_missing_prompt_column_lists_the_columns(arith_jsonl):
    with pytest.raises(ValueError, match=r"prompt_column 'question' is not a column .* \['prompt', 'answer'\]"):
        PromptDataModule(arith_jsonl, prompt_column="question").setup("fit")


def test_empty_dataset_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    Dataset.from_list([{"prompt": "x"}]).select([]).to_json(path)
    with pytest.raises(ValueError, match="has no rows"):
        PromptDataModule(str(path), val_split=None).setup("fit")


def test_bad_batch_size_is_named():
    with pytest.raises(ValueError, match="batch_size \\(prompts per step\\) must be >= 1, got 0"):
        PromptDataModule("x", batch_size=0)


def held_out(dm) -> tuple[set, set]:
    dm.setup("fit")
    return set(dm.train_data["prompt"]), set(dm.val_data["prompt"]) if dm.val_data is not None else set()


def test_null_val_split_with_val_size_holds_rows_out(arith_jsonl):  # it used to turn validation off silently
    train, val = held_out(PromptDataModule(arith_jsonl, val_split=None, val_size=4))
    assert len(train) == 12 and len(val) == 4 and not train & val


def test_plain_saved_dataset_is_not_validated_on_its_training_rows(tmp_path, caplog):
    Dataset.from_list([{"prompt": f"{i}+1="} for i in range(40)]).save_to_disk(tmp_path / "d")
    with caplog.at_level("INFO"):
        train, val = held_out(PromptDataModule(str(tmp_path / "d")))
    assert len(val) == 2 and len(train) == 38 and not train & val  # 5% by default
    assert "has no 'validation' split, so 2 of its 40 training rows are held out" in caplog.text


def test_single_file_holds_out_rows_by_default_and_says_so(arith_jsonl, caplog):
    with caplog.at_level("INFO"):
        train, val = held_out(PromptDataModule(arith_jsonl, val_size=0.25))
    assert len(val) == 4 and not train & val
    assert caplog.text.count("held out for validation") == 1


def test_no_validation_is_said_out_loud(arith_jsonl):
    with pytest.warns(UserWarning, match="No validation: dataset .* has no 'validation' split and no rows are held"):
        assert held_out(PromptDataModule(arith_jsonl, val_size=0))[1] == set()


def test_validating_on_the_training_split_is_refused():
    with pytest.raises(ValueError, match="val_split and train_split are both 'train'"):
        PromptDataModule("x", val_split="train")


def test_system_prompt_and_few_shot_apply_to_plain_text_prompts(arith_jsonl):
    shots = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    dm = PromptDataModule(arith_jsonl, batch_size=1, system_prompt="Add.", few_shot=shots, val_split=None)
    prompt = batches(dm).prompts[0]
    assert prompt[:3] == [{"role": "system", "content": "Add."}, *shots]
    assert prompt[3]["role"] == "user" and prompt[3]["content"].endswith("=") and len(prompt) == 4


def test_few_shot_goes_after_a_chat_prompts_own_system_message(tmp_path):
    path = tmp_path / "chat.jsonl"
    chat = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "hi"}]
    path.write_text(json.dumps({"prompt": chat}) + "\n")
    shot = [{"role": "user", "content": "yo"}, {"role": "assistant", "content": "hey"}]
    dm = PromptDataModule(str(path), batch_size=1, system_prompt="Theirs.", few_shot=shot, val_split=None)
    assert batches(dm).prompts[0] == [chat[0], *shot, chat[1]]


def test_bad_few_shot_turn_is_named():
    with pytest.raises(ValueError, match=r"few_shot\[1\] must be \{role: user\|assistant, content: ...\}"):
        PromptDataModule("x", few_shot=[{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}])


def test_a_validation_split_without_the_prompt_column_is_an_error_not_a_fallback(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS), "validation": Dataset.from_list([{"question": "x"}])}).save_to_disk(
        tmp_path / "d"
    )
    with pytest.raises(ValueError, match=r"prompt_column 'prompt' is not a column .* \(validation split\)"):
        PromptDataModule(str(tmp_path / "d")).setup("fit")


def test_a_split_that_mixes_text_and_chat_prompts_is_refused_naming_its_rows(tmp_path):
    """Issue 59: one row turned into chat messages (as the row check advises) beside plain-text rows passed the
    start-up checks and failed after the model loaded (``TextEncodeInput must be Union[...]``), naming no row."""
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(6)]
    rows[3]["prompt"] = [{"role": "user", "content": "3+3="}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = r"mixes plain-text and chat prompts .* row 3 is chat messages and rows 0, 1, 2, 4, 5 are plain text"
    with pytest.raises(ValueError, match=message):
        PromptDataModule(str(path), batch_size=2, val_size=0).setup("fit")
