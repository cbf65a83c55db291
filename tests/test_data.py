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
    assert all(
        str(int(p.split("+")[0]) + 1) == str(a) for p, a in zip(batch.prompts, batch.columns["answer"])
    )


def test_save_to_disk_directory_with_validation_split(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:2])}).save_to_disk(
        tmp_path / "d"
    )
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
    with pytest.raises(
        ValueError, match=r"prompt_column 'question' is not a column .* \['prompt', 'answer'\]"
    ):
        PromptDataModule(arith_jsonl, prompt_column="question").setup("fit")


def test_empty_dataset_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    Dataset.from_list([{"prompt": "x"}]).select([]).to_json(path)
    with pytest.raises(ValueError, match="has no rows"):
        PromptDataModule(str(path), val_split=None).setup("fit")


def test_bad_batch_size_is_named():
    with pytest.raises(ValueError, match="batch_size \\(prompts per step\\) must be >= 1, got 0"):
        PromptDataModule("x", batch_size=0)
