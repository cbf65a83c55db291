"""A dataset source -> a Hugging Face ``Dataset``: a file (JSON, JSON Lines, CSV, Parquet), a saved dataset, a hub
name or an embedded demo, and the checks of a text file that name its bad line before anything loads. Knows files
and ``datasets``; nothing about prompts' shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from lightning_grpo import demo
from lightning_grpo.checks import listing
from lightning_grpo.data.rows import PROMPT_TYPES, prompt_problem

if TYPE_CHECKING:
    from datasets import Dataset


FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_any(source: str, split: str, name: str | None = None, prompt_column: str | None = None) -> Dataset:
    """A split from a hub name, a ``save_to_disk`` directory, a JSON/JSONL/CSV/Parquet file, or a directory
    of ``<split>.<ext>`` files; a JSON/JSONL/CSV file is checked first, line by line (``check_text_file``), with
    ``prompt_column`` held to what a prompt is."""
    from datasets import DatasetDict, load_dataset, load_from_disk  # pandas and pyarrow: only when data loads

    source = demo.resolve(source)
    path = Path(source)
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()):
        loaded = load_from_disk(str(path))
        if isinstance(loaded, DatasetDict):
            return loaded[split]
        if split != "train":  # a plain Dataset is one split: serving it as validation too would reuse its rows
            raise FileNotFoundError(f"dataset {source!r} is one Dataset, the 'train' split, not {split!r}")
        return loaded
    if path.is_dir():
        files = sorted(p for p in path.glob(f"{split}.*") if p.suffix in FILE_FORMATS)
        if not files:
            raise FileNotFoundError(f"dataset directory {source!r} has no {split}.(json|jsonl|csv|parquet) file")
        if files[0].suffix in TEXT_FORMATS:
            check_text_file(files[0], prompt_column)
        return load_dataset(FILE_FORMATS[files[0].suffix], data_files=str(files[0]), split="train")
    if path.suffix in FILE_FORMATS:
        if not path.exists():
            raise FileNotFoundError(f"dataset file {source!r} does not exist")
        if path.stat().st_size == 0:
            raise ValueError(f"dataset {source!r} has no rows: the file is empty")
        if path.suffix in TEXT_FORMATS:
            check_text_file(path, prompt_column)
        if split != "train":  # a single file is one split, which the datasets library names "train"
            raise FileNotFoundError(f"dataset file {source!r} holds only the 'train' split, not {split!r}")
        return load_dataset(FILE_FORMATS[path.suffix], data_files=str(path), split="train")
    return load_dataset(source, name, split=split)


TEXT_FORMATS = (".json", ".jsonl", ".csv")


def check_text_file(path: Path, prompt_column: str | None = None) -> None:
    """A JSON/JSONL/CSV dataset file read before any compute: UTF-8 throughout, at least one non-blank line, and
    for JSON lines one object a line whose ``prompt_column`` is a prompt (``prompt_problem``). Every problem of
    the file is named in one error, with its line (the datasets library names neither, or fails only when the
    bad row is drawn), so one run shows all there is to fix."""
    lines = path.read_bytes().splitlines()
    problems = {number: problem for number, raw in enumerate(lines, 1) if (problem := _not_utf8(number, raw))}
    if not any(line.strip() for line in lines):
        raise ValueError(f"dataset {str(path)!r} has no rows: its {len(lines)} lines are all blank")
    if path.suffix != ".csv" and not _one_json_document(path):
        problems |= _json_line_problems(lines, set(problems), prompt_column)
    about_prompts = any(p.startswith(f"line {n}: {prompt_column!r}") for n, p in problems.items())
    what = f"\nA prompt is {PROMPT_TYPES}" if about_prompts else ""
    if len(problems) == 1:
        raise ValueError(f"dataset file {str(path)!r} {next(iter(problems.values()))}{what}")
    if problems:
        listed = [problems[number] for number in sorted(problems)]
        raise ValueError(
            f"dataset file {str(path)!r} has {len(problems)} problems; all of them, by line:\n{listing(listed)}{what}"
        )


def _not_utf8(number: int, raw: bytes) -> str | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return (
            f"line {number} is not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1}): save the file as UTF-8"
        )
    return None


def _one_json_document(path: Path) -> bool:
    """A ``.json`` file holding one document (an array of rows, or ``{"data": [...]}``), not JSON lines."""
    if path.suffix != ".json":
        return False
    try:
        json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError:
        return False
    return True


def _json_line_problems(lines: list[bytes], skip: set[int], prompt_column: str | None) -> dict[int, str]:
    """Line number -> what is wrong with it: not JSON, not an object, or a prompt that is not one. A column no
    row has is left to ``PromptDataModule``, which lists the columns there are."""
    problems, rows = {}, {}
    for number, raw in enumerate(lines, 1):
        if not raw.strip() or number in skip:
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            problems[number] = (
                f"line {number} is not valid JSON ({err.msg} at column {err.colno}): each line must be one JSON object"
            )
            continue
        if isinstance(row, dict):
            rows[number] = row
        else:
            problems[number] = (
                f"line {number} is a JSON {type(row).__name__}, not an object: each line must be one row, e.g. "
                '{"prompt": "...", "answer": "..."}'
            )
    if prompt_column is None or not any(prompt_column in row for row in rows.values()):
        return problems
    for number, row in rows.items():
        problem = prompt_problem(row[prompt_column]) if prompt_column in row else "is missing"
        if problem:
            problems[number] = f"line {number}: {prompt_column!r} {problem}"
    return problems
