"""The real-model template's task (``templates/smollm2_cpu.yaml``): the largest of three two-digit numbers, asked in
words, as chat messages a pretrained instruct model answers in prose.

SmolLM2-135M-Instruct, asked "Which is the largest of 47, 82 and 15?", mostly reasons aloud and runs out of tokens,
or names a number that is not the largest. Its answer is read as the last number it writes
(``numeric_match_reward``), so GRPO has to teach both to conclude and to conclude right. The data is generated in
code and written as JSONL like any user file; the held-out rows' triples never appear in training.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

from lightning_grpo.demo.tiny import write_splits

HELD_OUT = 100  # validation prompts: held-out accuracy before and after training


def largest_rows(seed: int = 0) -> list[dict]:
    """Every triple of distinct two-digit numbers in a random order, as a chat prompt and its answer, shuffled.

    >>> row = largest_rows()[0]
    >>> row["prompt"][0]["content"], row["answer"]
    ('Which is the largest of 48, 51 and 49?', '51')
    """
    rng = random.Random(seed)
    triples = list(itertools.combinations(range(10, 100), 3))
    rng.shuffle(triples)
    rows = []
    for triple in triples[:20_000]:  # of 117,480: plenty, and a small file
        a, b, c = rng.sample(triple, 3)
        question = f"Which is the largest of {a}, {b} and {c}?"
        rows.append({"prompt": [{"role": "user", "content": question}], "answer": str(max(triple))})
    return rows


def write_largest(path: Path) -> None:
    """Train/validation JSONL of the largest-number task; the ``HELD_OUT`` validation rows come first."""
    rows = largest_rows()
    write_splits(path, {"train": rows[HELD_OUT:], "validation": rows[:HELD_OUT]})
