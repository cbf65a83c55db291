"""RewardModel on a tiny randomly initialised Qwen2 classifier saved to disk: nothing is downloaded."""

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

from lightning_grpo.demo.tiny import build_tokenizer
from lightning_grpo.rewards.model import RewardModel


def save_classifier(path, num_labels):
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("tiny-rm"), num_labels=1)


def logit_of(model_dir, text, label=0):
    """The logit for one unpadded text, loaded the way RewardModel loads (transformers 5 picks the tokenizer class
    from config.json, so this is a Qwen2Tokenizer over the demo vocabulary, not the demo tokenizer itself)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).logits[0, label].item()


def test_loads_lazily_and_is_named(model_dir):
    reward = RewardModel(model_dir, batch_size=2, device="cpu")
    assert reward.model is None and reward.__name__ == f"reward_model_{model_dir.rstrip('/').split('/')[-1]}"
    reward(prompts=["2+2="], completions=["4"])
    assert reward.model is not None and not reward.model.training
    assert RewardModel(model_dir, name="judge").__name__ == "judge"


def test_batched_scores_equal_one_at_a_time_scores(model_dir):
    # Different lengths in one batch: padding must not change any score.
    prompts = ["2+2=", "max(3,8,1)=", "hi", "a longer prompt with more characters="]
    completions = ["4", "8", "hello there", "x"]
    scores = RewardModel(model_dir, batch_size=3, device="cpu")(
        prompts=prompts, completions=completions, answer=[1] * 4
    )
    expected = [logit_of(model_dir, p + c) for p, c in zip(prompts, completions)]
    assert scores == pytest.approx(expected, abs=1e-4)
    assert len(set(scores)) == 4


def test_chat_format_goes_through_the_chat_template(model_dir):
    reward = RewardModel(model_dir, device="cpu")
    prompt = [{"role": "user", "content": "2+2="}]
    scores = reward(prompts=[prompt, "2+2="], completions=[[{"role": "assistant", "content": "4"}]] * 2)
    templated = "<|user|>2+2=<eos><|assistant|>4<eos>"  # demo CHAT_TEMPLATE
    assert reward.text(prompt, [{"role": "assistant", "content": "4"}]) == templated
    assert scores == pytest.approx([logit_of(model_dir, templated)] * 2, abs=1e-4)


def test_empty_and_malformed_completions_get_empty_score(model_dir):
    reward = RewardModel(model_dir, device="cpu", empty_score=-5.0)
    scores = reward(prompts=["p"] * 4, completions=["", [{"role": "assistant", "content": None}], None, "ok"])
    assert scores[:3] == [-5.0, -5.0, -5.0] and scores[3] == pytest.approx(logit_of(model_dir, "pok"), abs=1e-4)


def test_truncation_keeps_the_end_of_the_completion(model_dir):
    reward = RewardModel(model_dir, device="cpu", max_length=8)
    assert reward(prompts=["x" * 50], completions=["12345678"]) == pytest.approx([logit_of(model_dir, "12345678")])


def test_label_index_picks_the_logit(tmp_path):
    two_labels = save_classifier(tmp_path / "two", num_labels=2)
    first = RewardModel(two_labels, device="cpu", label_index=0)(prompts=["a"], completions=["b"])
    second = RewardModel(two_labels, device="cpu", label_index=1)(prompts=["a"], completions=["b"])
    assert first == pytest.approx([logit_of(two_labels, "ab", 0)]) and second == pytest.approx(
        [logit_of(two_labels, "ab", 1)]
    )
    with pytest.raises(ValueError, match=r"label_index must be in \[0, 2\) for this model, got 2"):
        RewardModel(two_labels, device="cpu", label_index=2)(prompts=["a"], completions=["b"])


def test_to_moves_the_model_and_settings_are_checked(model_dir):
    reward = RewardModel(model_dir, device="cpu").to("cpu")
    reward(prompts=["a"], completions=["b"])
    assert reward.to(torch.device("cpu")) is reward and next(reward.model.parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="batch_size and max_length must be >= 1, got 0 and 8"):
        RewardModel(model_dir, batch_size=0, max_length=8)
    with pytest.raises(ValueError, match="got 1 prompts for 2 completions"):
        reward(prompts=["a"], completions=["b", "c"])
