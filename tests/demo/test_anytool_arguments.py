"""demo.anytool sizes its model and warm start by the tools' argument count: a tool with several arguments
(``shift(text, n)``) gets the 8 heads and 2000 steps it needs (0% of calls exact with the one-argument recipe, 100%
with these: references/agents.md), a one-argument tool keeps the recipe its cached models were built with."""

from __future__ import annotations

from helpers import ROOT


def text_of(words: str) -> str:
    """A tool with no argument named like the others', to count arguments by the schema, not by name.

    Args:
        words: any text
    """
    return words


def three(a: int, b: int, c: str) -> str:
    """Three arguments.

    Args:
        a: one
        b: two
        c: three
    """
    return f"{a}{b}{c}"


def test_a_tool_with_several_arguments_gets_more_heads_and_steps():
    from lightning_grpo.demo import anytool as a

    assert a.STEPS_SEVERAL > a.STEPS
    assert [a.arguments([t]) for t in (a.reverse, a.shift, three, text_of)] == [1, 2, 3, 1]
    assert a.default_steps([a.reverse]) == a.default_steps([a.word_count]) == a.default_steps([text_of]) == a.STEPS
    assert a.default_steps([a.shift]) == a.default_steps([three]) == a.STEPS_SEVERAL
    assert a.default_steps([a.reverse, a.shift]) == a.STEPS_SEVERAL  # one tool with several arguments decides
    assert a.model_size([a.reverse]) == a.MODEL_SIZE  # the cached tiny-qwen2-reverse is still what this recipe builds
    assert a.model_size([a.shift])["num_attention_heads"] > a.MODEL_SIZE.get("num_attention_heads", 4)


def test_a_two_argument_model_has_the_heads_it_is_built_with(tmp_path):
    """write_tool_model for ``shift`` writes a model of ``model_size``'s heads (2 steps: the shape, not the skill)."""
    import json

    from lightning_grpo.demo.anytool import model_size, shift, write_tool_model

    write_tool_model(tmp_path, [shift], steps=2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_attention_heads"] == model_size([shift])["num_attention_heads"] == 8
    assert config["num_key_value_heads"] == 4 and config["num_hidden_layers"] == 2


def test_the_docs_quote_both_warm_start_lengths():
    """The ``--steps`` row of references/agents.md gives the code's two defaults, one argument's first."""
    import re

    from lightning_grpo.demo.anytool import STEPS, STEPS_SEVERAL

    text = (ROOT / "references" / "agents.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| `--steps")]
    assert re.findall(r"\b\d{4}\b", row.split("|")[2]) == [str(STEPS), str(STEPS_SEVERAL)], row
