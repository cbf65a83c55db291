import pickle

import pytest
from trl.rewards import get_repetition_penalty_reward

from lightning_grpo.rewards.style import citation_reward, reasoning_steps_reward, repetition_penalty

MALFORMED = ["", [{"role": "assistant", "content": None}], [], None, 3]


def chat(text):
    return [{"role": "assistant", "content": text}]


def test_repetition_penalty_hand_worked():
    penalty = repetition_penalty(n=2, max_penalty=0.5)
    # "a b a b a": bigrams ab ba ab ba -> 2 distinct of 4 -> -0.5 * (1 - 2/4) = -0.25
    scores = penalty(["a b a b a", chat("A B a b"), "one two three", "solo"])
    assert scores == pytest.approx([-0.25, -0.5 * (1 - 2 / 3), 0.0, 0.0], abs=1e-4)  # rounded to 4 places
    assert penalty.__name__ == "repetition_penalty_reward"
    assert pickle.loads(pickle.dumps(penalty))(["x x x"]) == [-0.25]


def test_repetition_penalty_on_tokens_matches_trl():
    completion_ids = [[1, 2, 3, 4], [5, 5, 5, 5, 5], [1, 2, 1, 2, 1, 2, 3], [7], []]
    ours = repetition_penalty(n=2, max_penalty=1.0, unit="tokens")
    theirs = get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)  # TRL's penalty is signed
    assert ours(["x"] * 5, completion_ids=completion_ids) == pytest.approx(theirs(completion_ids), abs=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "n must be >= 1, got 0"),
        ({"max_penalty": -1.0}, "max_penalty must be >= 0"),
        ({"unit": "chars"}, r"unit must be one of \['words', 'tokens'\], got 'chars'"),
    ],
)
def test_repetition_penalty_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        repetition_penalty(**kwargs)


def test_reasoning_steps_counts_markers_and_caps():
    completions = [
        "Step 1: read. Step 2: add. Step 3: check. Step 4: done.",  # capped at 1
        "1. add\n2. halve",  # 2 of 3
        "First, add. Then halve.",  # 2 of 3
        "first, then finally",  # lower case mid-sentence words are not markers
        chat("step 1 and step 2 and Finally"),
        "It is 4.",
    ]
    assert reasoning_steps_reward(completions) == [1.0, 0.6667, 0.6667, 0.0, 1.0, 0.0]


def test_citation_forms():
    completions = [
        "Transformers [1, 2] changed NLP.",
        "See [3-5].",
        "(Smith, 2020) showed it.",
        "(Smith and Jones, 2019a)",
        "(Li et al., 2021)",
        chat("source: https://example.org/paper"),
        "In 2020 (a big year) nothing [was] cited.",
    ]
    assert citation_reward(completions) == [1.0] * 6 + [0.0]


@pytest.mark.parametrize("fn", [repetition_penalty(), reasoning_steps_reward, citation_reward])
def test_malformed_completions_score_zero(fn):
    assert fn(MALFORMED, answer=[None] * len(MALFORMED)) == [0.0] * len(MALFORMED)
