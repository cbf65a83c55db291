import pickle

import pytest

from lightning_grpo.rewards.format import (
    json_schema_reward,
    json_valid_reward,
    partial_format_reward,
    python_syntax_reward,
    soft_reasoning_format_reward,
    soft_think_format_reward,
    strict_reasoning_format_reward,
    strict_think_format_reward,
)

GOOD_REASONING = "<reasoning>\n3 + 4 = 7\n</reasoning>\n<answer>\n7\n</answer>\n"
MALFORMED = ["", [{"role": "assistant", "content": None}], [], None, 42]


def chat(text):
    return [{"role": "assistant", "content": text}]


def test_strict_reasoning_format():
    completions = [
        GOOD_REASONING,
        chat(GOOD_REASONING.rstrip("\n")),
        "<reasoning>3+4</reasoning><answer>7</answer>",  # no newlines
        "Sure!\n" + GOOD_REASONING,  # text before
        GOOD_REASONING + "extra",  # text after
        GOOD_REASONING + "<answer>\n8\n</answer>",  # two answers
        "<reasoning>\n\n</reasoning>\n<answer>\n7\n</answer>",  # empty reasoning
    ]
    assert strict_reasoning_format_reward(completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_soft_reasoning_format():
    completions = [
        "Let me see. <reasoning>3+4</reasoning>\n\n<answer>7</answer> done",
        chat(GOOD_REASONING),
        "<answer>7</answer><reasoning>3+4</reasoning>",  # wrong order
        "<reasoning>3+4</reasoning>",
    ]
    assert soft_reasoning_format_reward(completions) == [1.0, 1.0, 0.0, 0.0]


def test_strict_think_format():
    completions = [
        "<think>\nadd them\n</think>\n7",
        chat("<think>\nadd them\n</think>\n\n7"),
        "<think>add them</think>7",  # no newlines
        "<think>\n \n</think>\n7",  # empty thinking
        "<think>\nadd\n</think>\n<think>\nagain\n</think>\n7",  # two blocks
        "7 <think>\nadd\n</think>\n7",  # not first
    ]
    assert strict_think_format_reward(completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_soft_think_format_accepts_template_opened_block():
    completions = ["<think>a</think>7", chat("a</think>7"), "<think>a", "</think>a<think>", "a</think>b</think>", "7"]
    assert soft_think_format_reward(completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_partial_format_credit_per_tag_and_trailing_penalty():
    reward = partial_format_reward()
    completions = [
        GOOD_REASONING,  # trailing newline is not penalised
        "<reasoning>a</reasoning>",
        "<reasoning>a</reasoning><reasoning>b</reasoning><answer>7</answer>",  # duplicated tags earn nothing
        "<answer>7</answer>" + "x" * 600,
        chat("<answer>7</answer>"),
    ]
    assert reward(completions) == [1.0, 0.5, 0.5, -0.1, 0.5]  # 2 of 4 tags, 600 chars x 0.001
    assert reward.__name__ == "partial_format_reward"


def test_partial_format_custom_tags_and_validation():
    assert partial_format_reward(tags=["think"], trailing_penalty=0.0)(["<think>a</think>7"]) == [1.0]
    with pytest.raises(ValueError, match="trailing_penalty must be >= 0, got -1"):
        partial_format_reward(trailing_penalty=-1)
    with pytest.raises(ValueError, match=r"tags must name at least one tag, got \(\)"):
        partial_format_reward(tags=())


def test_json_valid():
    completions = ['{"a": [1, 2]}', 'Here:\n```json\n{"a": 1}\n```', "<answer>[1]</answer>", "{'a': 1}", "{", "null"]
    assert json_valid_reward(completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]


SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}


def test_json_schema_fixed_schema():
    reward = json_schema_reward(SCHEMA)
    completions = ['{"age": 3}', '{"age": "3"}', "{}", "not json", chat('```json\n{"age": 1}\n```')]
    assert reward(completions, schema=["ignored"] * 5) == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert pickle.loads(pickle.dumps(reward))(['{"age": 3}']) == [1.0]


def test_json_schema_from_column():
    reward = json_schema_reward()
    scores = reward(['{"age": 3}', "[1]", "[1]"], schema=[SCHEMA, '{"type": "array"}', None])
    assert scores == [1.0, 1.0, None]
    with pytest.raises(ValueError, match="needs a 'schema' column"):
        reward(["{}"])


def test_json_schema_rejects_invalid_schema_early():
    with pytest.raises(ValueError, match="schema is not a valid JSON schema"):
        json_schema_reward({"type": "not-a-type"})
    with pytest.raises(ValueError, match="schema must be a dict or a JSON string"):
        json_schema_reward()(["{}"], schema=["{oops"])


def test_python_syntax():
    completions = ["```python\ndef f():\n    return 1\n```", "x = (", "Sure, I can help.", "\0", "```python\n```"]
    assert python_syntax_reward(completions) == [1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "fn",
    [
        strict_reasoning_format_reward,
        soft_reasoning_format_reward,
        strict_think_format_reward,
        soft_think_format_reward,
        partial_format_reward(),
        json_valid_reward,
        json_schema_reward(SCHEMA),
        python_syntax_reward,
    ],
)
def test_malformed_completions_score_zero(fn):
    assert fn(MALFORMED, unknown_column=[1] * len(MALFORMED)) == [0.0] * len(MALFORMED)
