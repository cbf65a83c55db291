"""A model someone else trained through the package's parts (issue 57 item 5): Hugging Face's SmolLM2-135M-Instruct
(``lightning-grpo/smollm2-135m-instruct``), with its own tokenizer, chat template (a default system message), EOS
``<|im_end|>`` and tied embeddings. Where the test only generates, the real model (30 layers: seconds); where it
trains, its first 2 layers (``helpers.write_short_smollm2``: the same tokenizer, template and config). Its template
run is ``tests/demo/test_numbers.py``, its GGUF loading ``tests/model/test_gguf.py``, the 2-process run
``tests/test_ranks_ddp.py`` and real vLLM ``tests/engines/vllm/test_real_smollm2.py``.
"""

from __future__ import annotations

import pytest
import torch
from helpers import KeepRollouts, answer_length, fit, make_module
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import HFExport
from lightning_grpo.cli import main
from lightning_grpo.engines import HFGenerate, LeanDecode, OpenAIAgent
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy

openai = pytest.importorskip("openai")

PROMPTS = [
    [{"role": "user", "content": "Is 7 larger than 3? Answer yes or no."}],  # answered in a few tokens, then EOS
    [{"role": "user", "content": "Say hello."}],  # answered at length: cut at the limit
]
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "lora_dropout": 0.0}
TRAIN = dict(reward_funcs=[answer_length], accuracy_reward=None, num_generations=2)  # 2 prompts x 2 x 8 tokens


def test_both_decoders_answer_in_its_template_and_stop_at_its_eos(smollm2_dir):
    policy = Policy(smollm2_dir)
    tokenizer, sampling = policy.tokenizer, SamplingConfig(max_completion_length=8)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    hf = HFGenerate().generate(policy, PROMPTS, 2, sampling, greedy=True)
    lean = LeanDecode().generate(policy, PROMPTS, 2, sampling, greedy=True)
    assert torch.equal(lean.completion_ids, hf.completion_ids) and torch.equal(lean.completion_mask, hf.completion_mask)
    prompt = tokenizer.decode(hf.prompt_ids[0][hf.prompt_mask[0].bool()])
    assert prompt == tokenizer.apply_chat_template(PROMPTS[0], tokenize=False, add_generation_prompt=True)
    assert prompt.startswith(SYSTEM)  # the template's own system message, which the user never wrote
    length = int(hf.completion_mask[0].sum())
    assert 1 < length < 8 and hf.completion_ids[0, length - 1] == tokenizer.eos_token_id  # EOS ends it, in the mask
    assert not hf.is_truncated[0] and hf.is_truncated[2] and hf.completion_mask[2].sum() == 8
    answer = hf.completions[0][0]["content"]
    assert answer and "<|im_end|>" not in answer and tokenizer.decode(hf.completion_ids[0, : length - 1]) == answer


MESSAGES: dict[str, list[dict]] = {}  # episode base URL -> the conversation the agent had
SERVED: dict[str, list[list[int]]] = {}  # episode base URL -> the token ids of each reply, as the agent got them


def follow_up_agent(client, row: dict) -> float:
    """Asks, then asks a follow-up in a new user message: the second turn renders with the model's template."""
    messages, url = list(row["prompt"]), str(client.base_url).rstrip("/")
    for follow_up in ("Why?", None):
        choice = client.chat.completions.create(model="policy", messages=messages).choices[0]
        SERVED.setdefault(url, []).append(choice.model_extra["token_ids"])
        messages.append(choice.message.model_dump(exclude_none=True))
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    MESSAGES[url] = messages
    return 1.0


def test_the_agent_endpoint_serves_a_conversation_in_its_template(smollm2_dir):
    """What is trained is what was served, and is the conversation as SmolLM2's template renders it: the model's
    first turn ended at its EOS, the follow-up rendered after it, then the second turn."""
    policy, engine = Policy(smollm2_dir), OpenAIAgent(follow_up_agent, timeout=120)
    rollout = engine.generate(policy, PROMPTS[:1], 1, SamplingConfig(max_completion_length=16), greedy=True)
    url = engine.endpoint.base_url(rollout.columns["episode_id"][0])
    trained = rollout.completion_ids[0][rollout.tool_mask[0].bool()].tolist()
    assert trained == sum(SERVED[url], []) and rollout.metrics["agents/requests"] == 2
    assert SERVED[url][0][-1] == policy.tokenizer.eos_token_id  # its first answer ended itself
    conversation = policy.tokenizer.apply_chat_template(MESSAGES[url], tokenize=False)
    prompt, completion = rollout.prompt_ids[0][rollout.prompt_mask[0].bool()], rollout.completion_ids[0]
    shown = policy.tokenizer.decode(torch.cat([prompt, completion[rollout.completion_mask[0].bool()]]))
    assert conversation.startswith(SYSTEM) and conversation.startswith(shown)
    assert shown.removesuffix(policy.tokenizer.eos_token).endswith(MESSAGES[url][-1]["content"])


@pytest.mark.parametrize("sgd", [True, False], ids=["sgd", "adamw-schedule-kl"])
def test_a_chat_step_on_smollm2_moves_every_parameter_as_trl_s(smollm2_short_dir, monkeypatch, tmp_path, sgd):
    """``tests/test_module_trl.py``'s step on SmolLM2 with chat prompts: its template (the default system message),
    its EOS and tied head, on both sides the same scripted completions: each parameter's change is TRL's."""
    from tests.test_module_trl import Run, assert_moved_alike, both_steps, norm, script_generate

    calls = script_generate(smollm2_short_dir, monkeypatch)
    run = Run(clip=True, chat=True) if sgd else Run(beta=0.04, sgd=False, clip=True, chat=True)
    ours, theirs = both_steps(smollm2_short_dir, tmp_path, run, calls)
    assert norm(ours) > 0.1 * run.lr
    assert_moved_alike(ours, theirs)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_group_s_prompt_encoded_once_gives_the_plain_forward_s_update(smollm2_short_dir, attention):
    """The shared-prefix forward (the default where exact) on a Llama with tied embeddings and a real vocabulary, at
    the template's shape (a 47-token prompt, 8 completions of up to 24 tokens) and with two prompts of other lengths:
    log-probs, and every parameter's gradient to fp32 rounding of its largest entry, as the plain forward's."""
    from tests.model.test_prefix import grouped_rows, logps_and_grads

    model = AutoModelForCausalLM.from_pretrained(smollm2_short_dir, attn_implementation=attention).train()
    for prompt_lengths, group_size, completion_length in [([47], 8, 24), ([40, 47], 4, 10)]:
        ids, mask = grouped_rows(prompt_lengths, group_size, completion_length)
        plain = logps_and_grads(model, ids, mask, completion_length, shared=False)
        shared = logps_and_grads(model, ids, mask, completion_length, shared=True)
        torch.testing.assert_close(shared[0], plain[0], rtol=1e-5, atol=1e-4)
        assert shared[2].keys() == plain[2].keys() and len(plain[2]) == 20  # the tied head: the embedding's
        for name, grad in plain[2].items():  # gradients of norms reach ~800: rounding is relative to the largest
            torch.testing.assert_close(shared[2][name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max(), msg=name)


def test_lora_trains_the_adapter_against_the_adapter_off_reference(smollm2_short_dir, chat_jsonl, tmp_path):
    """One step with beta > 0: the reference is the policy with its adapter off, which is SmolLM2 as loaded (no
    second copy), while the policy's own log-probs have moved; the merged export reloads as the trained policy."""
    module = make_module(smollm2_short_dir, **TRAIN, policy={"peft_config": LORA}, loss={"beta": 0.1})
    assert module.policy.reference is None
    rollouts, export = KeepRollouts(), HFExport(merged=True)
    data = PromptDataModule(chat_jsonl, batch_size=2, val_split=None)
    fit(module, data, tmp_path, 1, callbacks=[rollouts, export])
    (rollout,) = rollouts.rollouts
    rows, mask = [slice(0, len(rollout))], rollout.completion_mask.bool()
    loaded = Policy(smollm2_short_dir).logps(rollout, rows)
    torch.testing.assert_close(module.policy.reference_logps(rollout, rows)[mask], loaded[mask], rtol=0, atol=1e-5)
    assert (module.policy.logps(rollout, rows)[mask] - loaded[mask]).abs().max() > 1e-3  # the adapter trained
    merged, ids = AutoModelForCausalLM.from_pretrained(export.path / "merged"), rollout.completion_ids[:1]
    with torch.no_grad():  # the adapter merged into the attention and MLP weights; the tied head is the embedding
        torch.testing.assert_close(merged(ids).logits, module.policy.model.eval()(ids).logits, rtol=0, atol=1e-4)


def test_a_run_exports_what_transformers_reloads_and_reports(smollm2_short_dir, chat_jsonl, tmp_path, capsys):
    """Full fine-tuning, one step: ``hf_model/`` reloads with transformers as the trained policy (the same logits,
    the LM head still tied to the trained embeddings, the same chat template), and ``lightning-grpo report`` draws
    the run's directory."""
    module = make_module(smollm2_short_dir, **TRAIN)
    data = PromptDataModule(chat_jsonl, batch_size=2, val_split=None)
    trainer = fit(module, data, tmp_path, 1, callbacks=[HFExport()])
    run_dir = tmp_path / "lightning_logs" / "version_0"
    model, tokenizer = (cls.from_pretrained(run_dir / "hf_model") for cls in (AutoModelForCausalLM, AutoTokenizer))
    ids = tokenizer.apply_chat_template(PROMPTS[0], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert torch.equal(ids["input_ids"], module.policy.tokenizer.apply_chat_template(
        PROMPTS[0], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"])  # fmt: skip
    trained = module.policy.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, trained(**ids).logits, rtol=0, atol=1e-5)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    start = AutoModelForCausalLM.from_pretrained(smollm2_short_dir).model.embed_tokens.weight
    assert not torch.equal(model.model.embed_tokens.weight, start)  # the trained weights, not the start's
    assert trainer.global_step == 1
    main(["report", str(run_dir)])
    assert "report.png" in capsys.readouterr().out and (run_dir / "report.png").stat().st_size > 10_000
