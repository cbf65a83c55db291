"""Where the paths meet (issue 43): engine x sampling filter x sampling_correction x adv_estimator x turns, sampled
so that every pair of settings a user can write appears in at least one cell (a greedy pairwise covering array).
Each cell is one real optimiser step of the tiny model, and checks what must hold whatever the combination: the
on-policy importance ratios are 1 to float precision (the sampler is the current policy on every engine here), the
loss is finite, the weights move, and no warning is raised that the cell did not ask for. A combination that
cannot be right is refused when the module is built, naming both settings (VLLMServer: vLLM's processed
log-probs with a filter; no vLLM here, so its cells stop at construction; the vLLM row runs for real in the vLLM
venv: tests/engines/vllm/test_real_seams.py)."""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import fit, logged

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.advantages import ADV_ESTIMATORS
from lightning_grpo.engines import (
    AsyncRollouts,
    HFGenerate,
    LeanDecode,
    OpenAIAgent,
    ToolCalling,
    VLLMServer,
)
from lightning_grpo.targets.correction import SAMPLING_CORRECTIONS

ENGINES: dict[str, Callable[[str], Any]] = {  # turns -> the engine
    "LeanDecode": lambda turns: LeanDecode(),
    "HFGenerate": lambda turns: HFGenerate(),
    "ToolCalling": lambda turns: ToolCalling(tools=[add]),
    "OpenAIAgent": lambda turns: OpenAIAgent(two_turn_agent if turns == "multi" else one_turn_agent, timeout=60),
    "AsyncRollouts k1": lambda turns: AsyncRollouts(max_staleness=1),
    "AsyncRollouts k2": lambda turns: AsyncRollouts(max_staleness=2),
    "VLLMServer": lambda turns: VLLMServer(weight_transfer="disk"),  # built, never run: no vLLM here
}
SAMPLINGS = {
    "defaults": {},
    "top_p 0.9": {"top_p": 0.9},
    "top_k 20": {"top_k": 20},
    "min_p 0.1": {"min_p": 0.1},
    "repetition_penalty 1.1": {"repetition_penalty": 1.1},
}
CORRECTIONS = {str(c): c for c in (*SAMPLING_CORRECTIONS, "auto", None)}
FACTORS = {
    "engine": list(ENGINES),
    "sampling": list(SAMPLINGS),
    "correction": list(CORRECTIONS),
    "estimator": sorted(ADV_ESTIMATORS),
    "turns": ["single", "multi"],
}
MULTI_TURN = {"OpenAIAgent"}  # engines whose episodes here have tool turns (mask 0 inside the completion)
# What the environment says on every fit, whatever the cell: not ours to answer. And one of ours, left for its
# owner: the agent endpoint's thread never closes its event loop after run_forever returns (engines/agents/
# endpoint.py _serve), so a later cell's garbage collection warns "unclosed event loop" (issue 43, reported).
KNOWN_WARNINGS = (
    "isinstance(treespec, LeafSpec)",
    "does not have many workers",
    "GPU available but not used",
    "unclosed event loop <_UnixSelectorEventLoop",
)


def allowed(cell: dict[str, str]) -> bool:
    """Whether a (partial) cell can be written: multi-turn needs an engine that plays several turns."""
    return not (cell.get("turns") == "multi" and "engine" in cell and cell["engine"] not in MULTI_TURN)


def pairs_of(cell: dict[str, str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return set(itertools.combinations(sorted(cell.items()), 2))


def pairwise(factors: dict[str, list[str]], allowed: Callable[[dict[str, str]], bool]) -> list[dict[str, str]]:
    """A greedy covering array: cells until every allowed pair of values of two factors is in one. Each cell
    starts from the first pair not yet covered and takes, factor by factor, the value that covers most new pairs
    (ties: the first listed). Deterministic."""
    uncovered = {
        pair
        for a, b in itertools.combinations(sorted(factors), 2)
        for pair in itertools.product([(a, v) for v in factors[a]], [(b, v) for v in factors[b]])
        if allowed(dict(pair))
    }
    cells = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered)
        cell = {a: va, b: vb}
        for name in factors:
            if name not in cell:
                options = [v for v in factors[name] if allowed({**cell, name: v})]
                cell[name] = max(options, key=lambda v: len(pairs_of({**cell, name: v}) & uncovered))
        cells.append(cell)
        uncovered -= pairs_of(cell)
    return cells


CELLS = pairwise(FACTORS, allowed)
ASYNC = ("AsyncRollouts k1", "AsyncRollouts k2")


def params(cells: list[dict[str, str]]) -> list[Any]:
    """The cells as test parameters. A cell of AsyncRollouts starts a producer process (~7 s on a busy 2-core
    machine): the first of each k runs in the default suite, the rest with ``-m slow``."""
    first = {engine: next(c for c in cells if c["engine"] == engine) for engine in ASYNC}
    return [
        pytest.param(c, marks=[pytest.mark.slow] if c["engine"] in ASYNC and c is not first[c["engine"]] else [])
        for c in cells
    ]


def test_the_grid_covers_every_pair():
    covered = set().union(*(pairs_of(c) for c in CELLS))
    for a, b in itertools.combinations(sorted(FACTORS), 2):
        for va, vb in itertools.product(FACTORS[a], FACTORS[b]):
            if allowed({a: va, b: vb}):
                assert ((a, va), (b, vb)) in covered, (a, va, b, vb)
    assert all(allowed(c) for c in CELLS) and len(CELLS) <= 80, len(CELLS)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def one_turn_agent(client, row: dict) -> float:
    reply = client.chat.completions.create(model="policy", messages=row["prompt"])
    return spread(reply.choices[0].message.content or "")


def two_turn_agent(client, row: dict) -> float:
    """Asks, sends a tool reply, asks again: the reply's tokens are out of the loss inside the episode."""
    messages = list(row["prompt"])
    for turn in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": f"r{turn}"}]
    return spread(reply.choices[0].message.content or "")


def spread(text: str) -> float:
    """A reward that differs between most completions (so groups have a spread and the step a gradient)."""
    return sum(map(ord, text)) % 7 / 6


def spread_reward(completions, completion_ids, **kwargs) -> list[float]:
    """The same from the completion's token ids (every turn's, tool replies included)."""
    return [sum(ids) % 7 / 6 for ids in completion_ids]


@pytest.fixture(scope="module")
def chat_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with a tool-calling chat template, loaded once; every cell trains a copy of it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE

    path = tmp_path_factory.mktemp("tiny-chat")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.save_pretrained(path)  # AsyncRollouts' producer and the endpoint need no path; the tokenizer does
    return model, str(path)


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("seams") / "rows.jsonl"
    path.write_text(
        "".join(f'{{"prompt": [{{"role": "user", "content": "{c * (i + 1)}?"}}]}}\n' for i, c in enumerate("abcdefgh"))
    )
    return str(path)


def refusal(cell: dict[str, str]) -> str | None:
    """The settings a cell is refused for, as the message must name them; ``None``: it must build."""
    sampling, correction = SAMPLINGS[cell["sampling"]], CORRECTIONS[cell["correction"]]
    if cell["engine"] == "VLLMServer" and correction is not None and sampling:
        ((name, value),) = sampling.items()
        resolved = "sequence_mask" if correction == "auto" else correction  # auto for an engine not ahead
        return rf"update.sampling_correction={resolved!r} with .* sampling.{name}={value!r}: VLLMServer"
    return None


def build(cell: dict[str, str], chat_model) -> GRPOModule:
    model, path = chat_model
    return GRPOModule(
        model=copy.deepcopy(model),
        policy={"tokenizer": path},
        reward_funcs=[spread_reward],
        num_generations=4,
        sampling={"max_completion_length": 6, **SAMPLINGS[cell["sampling"]]},
        advantages={"adv_estimator": cell["estimator"]},
        update={"sampling_correction": CORRECTIONS[cell["correction"]]},
        optim={"learning_rate": 1e-2},
        rollout_engine=ENGINES[cell["engine"]](cell["turns"]),
    )


@pytest.mark.parametrize("cell", params(CELLS), ids=[" | ".join(c.values()) for c in CELLS])
def test_cell(cell, chat_model, chat_data, tmp_path):
    expected_refusal = refusal(cell)
    if cell["engine"] == "VLLMServer":
        if expected_refusal is None:
            build(cell, chat_model)  # builds; it would need a server to run
        else:
            with pytest.raises(ValueError, match=expected_refusal):
                build(cell, chat_model)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = build(cell, chat_model)
        before = [p.detach().clone() for p in module.policy.model.parameters()]
        trainer = fit(module, PromptDataModule(chat_data, batch_size=2, val_split=None), tmp_path, max_steps=1)
    unexpected = [str(w.message) for w in caught if not any(k in str(w.message) for k in KNOWN_WARNINGS)]
    assert not unexpected, unexpected
    metrics = logged(trainer)
    assert trainer.global_step == 1 and math.isfinite(metrics["train/loss"][0])
    moved = [not torch.equal(a, b.detach()) for a, b in zip(before, module.policy.model.parameters())]
    assert any(moved), "the step left every weight as it was"
    for bound in ("min", "max"):  # a weighted correction: every weight 1 (the sampler is the current policy)
        if f"train/sampling/importance_sampling_ratio/{bound}" in metrics:
            assert metrics[f"train/sampling/importance_sampling_ratio/{bound}"][0] == pytest.approx(1.0, abs=1e-4)
    if "train/sampling/sampling_logp_difference/max" in metrics:  # sampler log-probs recorded: they are ours
        assert metrics["train/sampling/sampling_logp_difference/max"][0] == pytest.approx(0.0, abs=1e-4)
    if cell["turns"] == "multi":
        assert metrics["train/completions/mean_length"][0] > 0
