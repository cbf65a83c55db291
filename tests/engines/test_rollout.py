import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_grpo.engines import HFGenerate, Sampled
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.prompts import tokenize_prompts
from lightning_grpo.engines.rollout import mask_after_eos
from lightning_grpo.model.loading import load_tokenizer
from lightning_grpo.model.logprobs import LinearLogps, auto_chunk_size, completion_logps
from lightning_grpo.model.policy import Policy
from lightning_grpo.types import PromptBatch


def test_mask_covers_up_to_and_including_first_eos():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8]])  # eos = 1
    mask, truncated = mask_after_eos(ids, [1])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, True]


def test_long_prompts_keep_their_last_tokens(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    ids, mask, truncated = tokenize_prompts(tok, ["1234567", "12"], SamplingConfig(max_prompt_length=4))
    assert truncated == 1
    assert tok.decode(ids[0]) == "4567"
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]  # left padding


def test_rollout_groups_masks_and_chat_completions(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    tok = policy.tokenizer
    prompts = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+2="}]]
    torch.manual_seed(0)
    r = HFGenerate().generate(policy, prompts, 3, SamplingConfig(max_completion_length=6), greedy=False)
    assert policy.model.training  # generation ran in eval mode and restored training mode
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
    ids, mask, _ = tokenize_prompts(tok, ["3+4=", "12+345=", "9="], SamplingConfig(max_prompt_length=None))
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
    for chunk in (3, 1024, None):
        model.zero_grad()
        completion_logps(model, ids, attn, 4, chunk_size=chunk).logps.sum().backward()
        grads.append(model.model.embed_tokens.weight.grad.clone())
    # A head with a (zero) bias takes the generic path: log_softmax under activation checkpointing
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.lm_head.out_features))
    model.zero_grad()
    completion_logps(model, ids, attn, 4, chunk_size=3).logps.sum().backward()
    grads.append(model.model.embed_tokens.weight.grad.clone())
    for other in grads[1:]:  # fp32 sums in another order (gradients up to ~4): float64 exactness is pinned below
        assert torch.allclose(grads[0], other, atol=1e-5)
    assert grads[0].abs().sum() > 0


def test_linear_logps_matches_autograd_through_log_softmax():
    """The fused head's values and gradients (h and W) equal autograd through log_softmax, in float64."""
    torch.manual_seed(0)
    h = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (5,))
    upstream = torch.randn(5, dtype=torch.float64)  # a weighted sum, not just .sum(): per-row gradients differ
    logp, entropy = LinearLogps.apply(h, w, y, 0.7)
    (logp * upstream).sum().backward()
    got = (logp.detach(), entropy, h.grad.clone(), w.grad.clone())
    h.grad, w.grad = None, None
    full = (h @ w.T / 0.7).log_softmax(-1)  # [5, 11]
    expected_logp = full.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    (expected_logp * upstream).sum().backward()
    torch.testing.assert_close(got[0], expected_logp.detach())
    torch.testing.assert_close(got[1], -(full.exp() * full).sum(-1).detach())
    torch.testing.assert_close(got[2], h.grad)
    torch.testing.assert_close(got[3], w.grad)
    assert not entropy.requires_grad


def test_auto_chunk_size():
    assert auto_chunk_size(151_936) == 220 and auto_chunk_size(300) == 111_848


def test_saved_tokenizer_round_trips_through_auto_tokenizer(tiny_model_dir):
    """transformers 5 loads a Qwen2 checkpoint's tokenizer as Qwen2Tokenizer: ids must not change."""
    from lightning_grpo.demo.tiny import build_tokenizer

    text = "max(3, 8, 1)= é <think>ok</think>"
    loaded = load_tokenizer(tiny_model_dir)
    assert loaded(text)["input_ids"] == build_tokenizer()(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text


def test_an_in_process_engine_hands_back_its_batch_unscored_and_sampled_by_the_current_weights(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    batch = PromptBatch(["1+1=", "2+2="], {"answer": ["2", "4"]})
    torch.manual_seed(0)
    sampled = HFGenerate().rollout(policy, batch, 3, SamplingConfig(max_completion_length=4))
    assert sampled.batch is batch and len(sampled.rollout) == 6  # B * G rows, grouped
    assert sampled.scores is None and sampled.staleness() is None  # the module scores it; nothing is stale


def test_staleness_counts_updates_since_each_rows_weights(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    torch.manual_seed(0)
    rollout = HFGenerate().generate(policy, ["1+1=", "2+2="], 2, SamplingConfig(max_completion_length=4), False)
    rollout.versions = torch.tensor([3, 3, 5, 5])  # sampled after 3 and after 5 published updates
    sampled = Sampled(rollout, PromptBatch(["1+1=", "2+2="]), version=5)
    assert sampled.staleness().tolist() == [2, 2, 0, 0]
    kept = rollout.select(torch.tensor([0, 1]))  # rows kept from it for a later update, counted the same way
    assert sampled.staleness(kept).tolist() == [2, 2]
    assert Sampled(rollout, sampled.batch).staleness() is None  # no version: the current weights sampled it
