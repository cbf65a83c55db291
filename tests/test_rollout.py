import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_grpo.logprobs import completion_logps
from lightning_grpo.models import load_tokenizer
from lightning_grpo.rollout import SamplingConfig, generate_rollout, mask_after_eos, tokenize_prompts


def test_mask_covers_up_to_and_including_first_eos():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8]])  # eos = 1
    mask, truncated = mask_after_eos(ids, [1])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, True]


def test_long_prompts_keep_their_last_tokens(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    ids, mask, truncated = tokenize_prompts(tok, ["1234567", "12"], max_prompt_length=4)
    assert truncated == 1
    assert tok.decode(ids[0]) == "4567"
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]  # left padding


def test_rollout_groups_masks_and_chat_completions(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    prompts = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+2="}]]
    model.train()
    torch.manual_seed(0)
    r = generate_rollout(model, tok, prompts, 3, SamplingConfig(max_completion_length=6))
    assert model.training  # generation ran in eval mode and restored training mode
    assert r.completion_ids.shape[0] == 6 and r.completion_ids.shape[1] <= 6
    assert r.prompts[:3] == [prompts[0]] * 3 and r.prompts[3:] == [prompts[1]] * 3
    assert r.completions[0][0]["role"] == "assistant" and isinstance(r.completions[0][0]["content"], str)
    lengths = r.completion_mask.sum(1)
    assert ((lengths == r.completion_ids.shape[1]) | ~r.is_truncated).all()
    assert (r.completion_ids[r.completion_mask == 0] == tok.pad_token_id).all()


def test_logps_match_the_samplers_scores(tiny_model_dir):
    """Our chunked, left-padding-aware log-probs equal generate's own scores for the sampled tokens."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.5)  # a peaked distribution, so a mismatch would show
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask, _ = tokenize_prompts(tok, ["3+4=", "12+345=", "9="], None)
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        max_new_tokens=5,
        top_k=0,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        eos_token_id=1,
        temperature=0.7,
    )
    completion = out.sequences[:, ids.shape[1] :]
    expected = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    cmask, _ = mask_after_eos(completion, [1])
    for chunk in (1, 4, 1024):
        got = completion_logps(
            model,
            torch.cat([ids, completion], 1),
            torch.cat([mask, cmask], 1),
            completion.shape[1],
            temperature=0.7,
            chunk_size=chunk,
        ).logps
        assert ((got - expected).abs() * cmask).max() < 1e-4


def test_chunked_logps_gradient_equals_full(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(6, 100, (2, 7))
    attn = torch.ones_like(ids)
    grads = []
    for chunk in (3, 1024):
        model.zero_grad()
        completion_logps(model, ids, attn, 4, chunk_size=chunk).logps.sum().backward()
        grads.append(model.model.embed_tokens.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_saved_tokenizer_round_trips_through_auto_tokenizer(tiny_model_dir):
    """transformers 5 loads a Qwen2 checkpoint's tokenizer as Qwen2Tokenizer: ids must not change."""
    from lightning_grpo.demo import build_tokenizer

    text = "max(3, 8, 1)= é <think>ok</think>"
    loaded = load_tokenizer(tiny_model_dir)
    assert loaded(text)["input_ids"] == build_tokenizer()(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
