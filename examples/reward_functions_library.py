"""The reward catalogue in use: functions of ``lightning_grpo.rewards`` on the same five completions, as a table.

    python examples/reward_functions_library.py

Every reward function takes ``(prompts, completions, completion_ids, **columns)`` by keyword, where ``columns``
are the dataset's other columns (``answer``, ``test_cases`` ...), and returns one float per completion, or
``None`` for "not applicable" (left out of the total, not counted as 0). Completions are plain strings when the
prompts are, and chat messages ``[{"role": "assistant", "content": ...}]`` when the prompts are chat messages;
every function here reads both, which the last column checks. No model is loaded: this runs in seconds.
"""

from __future__ import annotations

import argparse

from lightning_grpo.rewards import (
    code_execution_reward,
    combine,
    exact_match_reward,
    fuzzy_match_reward,
    ideal_length_reward,
    json_schema_reward,
    json_valid_reward,
    length_bounds_reward,
    math_verify_reward,
    multiple_choice_reward,
    normalized_match_reward,
    numeric_match_reward,
    partial_format_reward,
    preset,
    python_syntax_reward,
    reasoning_steps_reward,
    repetition_penalty,
    reward_name,
    rouge_l_reward,
    soft_overlong_punishment,
    soft_think_format_reward,
    strict_reasoning_format_reward,
    strict_think_format_reward,
)

COMPLETIONS = [
    "<think>\n48 / 2 = 24 clips in May, 48 + 24 = 72 in all.\n</think>\n72",
    "<reasoning>\nStep 1: 48 / 2 = 24.\nStep 2: 48 + 24 = 72.\n</reasoning>\n<answer>\n72\n</answer>",
    "The answer is 72 72 72 72 72 72 72",
    "```python\ndef add(a, b):\n    return a + b\n```",
    '{"answer": 72}',
]
# Dataset columns, one value per completion. gsm8k-style gold: a worked solution ending in "#### 72".
COLUMNS = {
    "answer": ["Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"] * 3 + [None, "72"],
    "test_cases": [None, None, None, ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], None],
}
SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "number"}}}

REWARDS = [
    exact_match_reward,  # stripped final answer == gold
    normalized_match_reward,  # ignoring case, punctuation, spaces
    numeric_match_reward,  # last number of the final answer == last number of the gold
    math_verify_reward,  # symbolic equivalence (math-verify), in a worker process with a timeout
    fuzzy_match_reward(threshold=0.8),  # graded string similarity
    rouge_l_reward,  # ROUGE-L F1 against the gold text
    multiple_choice_reward,  # option letters: every gold here is a number, so every row is None
    strict_think_format_reward,
    soft_think_format_reward,
    strict_reasoning_format_reward,
    partial_format_reward(tags=("reasoning", "answer")),  # 0.25 per tag present once
    json_valid_reward,
    json_schema_reward(SCHEMA),
    python_syntax_reward,
    code_execution_reward,  # runs the code against test_cases in a sandboxed process
    ideal_length_reward(target=8, width=8, unit="words"),
    length_bounds_reward(min_length=1, max_length=12, unit="words"),
    soft_overlong_punishment(max_completion_len=24, soft_punish_cache=8),  # counts completion_ids
    repetition_penalty(n=2),
    reasoning_steps_reward,
]


def as_chat(completion: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": completion}]


def score_table(rewards: list, completions: list[str], columns: dict[str, list]) -> list[tuple[str, list, bool]]:
    """(name, scores of the plain completions, whether the chat versions score the same) per function."""
    # The trainer passes the real token ids of each completion; one id per word stands in for them here.
    completion_ids = [list(range(len(c.split()))) for c in completions]
    prompts = ["How many clips did Natalia sell?"] * len(completions)
    rows = []
    for fn in rewards:
        plain = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        chat = fn(
            prompts=[[{"role": "user", "content": p}] for p in prompts],
            completions=[as_chat(c) for c in completions],
            completion_ids=completion_ids,
            **columns,
        )
        rows.append((reward_name(fn), plain, plain == chat))
    return rows


def cell(value: float | None) -> str:
    return "None" if value is None else f"{value:.2f}"


def print_table(rows: list[tuple[str, list, bool]], n: int) -> None:
    header = f"{'reward function':34}" + "".join(f"{'#' + str(i + 1):>7}" for i in range(n)) + "  chat same"
    print(header)
    print("-" * len(header))
    for name, scores, same in rows:
        print(f"{name:34}" + "".join(f"{cell(s):>7}" for s in scores) + f"  {'yes' if same else 'NO'}")


def main(argv: list[str] | None = None) -> list[tuple[str, list, bool]]:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    for i, completion in enumerate(COMPLETIONS):
        print(f"#{i + 1}: {completion!r}")
    print()
    rows = score_table(REWARDS, COMPLETIONS, COLUMNS)
    print_table(rows, len(COMPLETIONS))

    # Several functions as one weighted function (one metric instead of one per function) ...
    graded = combine([(numeric_match_reward, 1.0), (soft_think_format_reward, 0.2)], name="graded_math")
    print(
        f"\n{graded.__name__} = 1.0 x numeric_match + 0.2 x soft_think_format:",
        [cell(s) for s in graded(completions=COMPLETIONS, answer=COLUMNS["answer"])],
    )
    # ... and the presets behind `model.reward_preset` (functions and weights to pass to GRPOModule).
    funcs, weights = preset("math_reasoning")
    print("preset('math_reasoning'):", ", ".join(f"{reward_name(f)} x {w}" for f, w in zip(funcs, weights)))
    return rows


if __name__ == "__main__":
    main()
