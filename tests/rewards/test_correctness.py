import pickle

import pytest

from lightning_grpo.rewards.correctness import (
    choice_letter,
    completion_text,
    exact_match_reward,
    fuzzy_match_reward,
    multiple_choice_reward,
    normalize,
    normalized_match_reward,
    numeric_match_reward,
    rouge_l_reward,
)
from lightning_grpo.rewards.text import answer_text, extract_code


def chat(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize(
    ("completion", "text"),
    [
        ("plain", "plain"),
        (chat("in chat"), "in chat"),
        ({"role": "assistant", "content": "bare message"}, "bare message"),
        (chat([{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]), "ab"),
        (chat(None), ""),
        (chat(42), ""),
        ([], ""),
        ([None], ""),
        (None, ""),
        (3.5, ""),
    ],
)
def test_completion_text_reads_both_formats_and_never_raises(completion, text):
    assert completion_text(completion) == text


def test_answer_text_prefers_answer_tag_then_text_after_think():
    assert answer_text("<answer>1</answer> then <answer>2</answer>") == "2"
    assert answer_text("<think>7?</think>8") == "8"
    assert answer_text("<think>a</think>b</think>c") == "c"
    assert answer_text("no tags") == "no tags"
    assert answer_text("") == ""


def test_extract_code_takes_the_last_python_block_else_everything():
    text = "```python\ndraft()\n```\nbetter:\n```py\nfinal()\n```"
    assert extract_code(text) == "final()\n"
    assert extract_code("```\nnot python tagged\n```") == "```\nnot python tagged\n```"
    assert extract_code("x = 1") == "x = 1"


def test_exact_match_reads_answer_tags_and_chat():
    scores = exact_match_reward(
        ["<reasoning>..</reasoning><answer> 12 </answer>", chat("12"), chat(None), "", "12"],
        answer=["12", "12", "12", "12", None],
    )
    assert scores == [1.0, 1.0, 0.0, 0.0, None]


def test_exact_match_ignores_unknown_columns_and_needs_one_answer_per_completion():
    assert exact_match_reward(completions=["a"], answer=["a"], prompts=["p"], completion_ids=[[1]], extra=[1]) == [1.0]
    with pytest.raises(ValueError):
        exact_match_reward(["a", "b"], answer=["a"])


def test_normalize_drops_case_punctuation_and_extra_space():
    assert normalize("  The  Eiffel-Tower!\n") == "the eiffeltower"


def test_normalized_match():
    scores = normalized_match_reward(
        ["PARIS.", chat("  paris "), "Paris, France", "", chat(None), "x"],
        answer=["Paris", "paris", "Paris", "", "a", None],
    )
    # An empty completion never matches, even an empty gold answer.
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0, None]


def test_fuzzy_match_is_graded_above_threshold_and_named():
    reward = fuzzy_match_reward(threshold=0.9)
    scores = reward(["Eifel Tower", "Eiffel", "", chat("EIFFEL TOWER"), "x"], answer=["Eiffel Tower"] * 4 + [None])
    assert scores[0] == pytest.approx(2 * 11 / 23, abs=1e-4)  # 11 matching chars of 11 + 12
    assert scores[1:] == [0.0, 0.0, 1.0, None]
    assert reward.__name__ == "fuzzy_match_reward"
    assert pickle.loads(pickle.dumps(reward))(["Eiffel Tower"], answer=["Eiffel Tower"]) == [1.0]


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_fuzzy_match_rejects_threshold_outside_unit_interval(threshold):
    with pytest.raises(ValueError, match=f"threshold must be in \\[0, 1\\], got {threshold}"):
        fuzzy_match_reward(threshold)


def test_numeric_match_tolerances_and_number_formats():
    completions = ["total: 1,234.5", "-3", "7.0000001", "I think 41 or 42", "", chat("x = 3"), "100"]
    answer = [1234.5, "-3", 7, "42", 0, "3", "about 101"]
    assert numeric_match_reward(completions, answer=answer) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert numeric_match_reward(["100"], answer=["101"], rel_tolerance=0.01) == [1.0]
    assert numeric_match_reward(["100"], answer=["101"], tolerance=0.5) == [0.0]


def test_numeric_match_gold_without_a_number_is_not_applicable():
    assert numeric_match_reward(["1", "2", "3"], answer=[None, "n/a", True]) == [None, None, None]


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Answer: B", "B"),
        ("the answer is (D).", "D"),
        ("The answer is **C**", "C"),
        ("**E**", "E"),
        ("I rule out (A) and pick (C)", "C"),
        ("(A) is wrong. Answer: D", "D"),
        ("\\boxed{B}", "B"),
        ("  A. ", "A"),
        ("Both are fine", None),
        ("answer: because", None),
        ("", None),
        ("F", None),
    ],
)
def test_choice_letter_forms(text, letter):
    assert choice_letter(text) == letter


def test_multiple_choice_gold_forms_and_none():
    scores = multiple_choice_reward(
        ["Answer: B", chat("(c)"), chat("(C)"), "", "Answer: A", "Answer: A"], answer=["b", "C", "(C)", "A", None, 3]
    )
    # "(c)" is lower case: not read as a choice, so it cannot match by accident in prose.
    assert scores == [1.0, 0.0, 1.0, 0.0, None, None]


def test_rouge_l_hand_worked():
    # LCS("the cat sat on the mat", "the cat is on the mat") = the cat on the mat = 5; P = R = 5/6
    assert rouge_l_reward(["The cat sat on the mat."], answer=["the cat is on the mat"]) == [0.8333]
    assert rouge_l_reward(["", chat(None), "dog", "a"], answer=["a b", "a", "cat", None]) == [0.0, 0.0, 0.0, None]
