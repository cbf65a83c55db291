"""Tool calls of every model family TRL 1.16 ships a chat template and a response template for: the real template text
from TRL's package on a byte-level tokenizer built here, a reply in the family's own format, and what we read and
render compared with what TRL's own functions give (``parse_response``, ``GRPOTrainer._get_tool_suffix_ids``, its
choice of training template)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
from helpers import write_tiny_llama
from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving, parse_response

from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE, build_tokenizer
from lightning_grpo.engines import ToolCall, ToolCalling
from lightning_grpo.engines.multiturn.calls import tool_schema
from lightning_grpo.engines.multiturn.episodes import tool_suffix_ids
from lightning_grpo.engines.multiturn.families import UNRECOGNISED, template_name, tool_format, trl_templates


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


SCHEMAS = [tool_schema(add)]
PROMPT = [{"role": "user", "content": "What is 2+3?"}]
HERMES = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
XML = "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n</function>\n"
XML += "</tool_call>"
LLAMA = '{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>'
GLM = "\n<think></think>\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n"
GLM += "<arg_value>3</arg_value>\n</tool_call><|observation|>"
LFM = "<|tool_call_start|>[add(a=2, b=3)]<|tool_call_end|><|im_end|>"
# Each family: its end-of-turn token (the tokenizer's EOS, as in the model's own tokenizer) and a reply the model
# writes after the generation prompt, in the family's format.
FAMILIES = {
    "qwen2_5": ("<|im_end|>", HERMES + "<|im_end|>"),
    "qwen3": ("<|im_end|>", "<think>\nadd them\n</think>\n\n" + HERMES + "<|im_end|>"),
    "qwen3_instruct_2507": ("<|im_end|>", HERMES + "<|im_end|>"),
    "qwen3_vl": ("<|im_end|>", HERMES + "<|im_end|>"),
    "qwen3_5_nothink": ("<|im_end|>", XML + "<|im_end|>"),
    "qwen3_5_think": ("<|im_end|>", "add them\n</think>\n\n" + XML + "<|im_end|>"),
    "qwen3_6": ("<|im_end|>", "add them\n</think>\n\n" + XML + "<|im_end|>"),
    "qwen3_8": ("<|im_end|>", "add them\n</think>\n\n" + XML + "<|im_end|>"),
    "llama3_1": ("<|eot_id|>", LLAMA),
    "llama3_2": ("<|eot_id|>", LLAMA),
    "glm4moe": ("<|endoftext|>", GLM),
    "gptoss": ("<|return|>", ' to=functions.add<|channel|>commentary json<|message|>{"a": 2, "b": 3}<|call|>'),
    "lfm2_v2": ("<|im_end|>", LFM),
    "lfm2_2_5": ("<|im_end|>", LFM),
    "lfm2_2_5_v2": ("<|im_end|>", LFM),
    "nemotron_3_nano": ("<|im_end|>", "add them\n</think>\n" + XML + "\n<|im_end|>"),
    "nemotron_3_super": ("<|im_end|>", "add them\n</think>\n" + XML + "\n<|im_end|>"),
    "nemotron_3_ultra": ("<|im_end|>", "add them\n</think>\n" + XML + "\n<|im_end|>"),
    "nemotron_3_5_lightning": ("<|im_end|>", "add them\n</think>\n" + XML + "\n<|im_end|>"),
    "gemma4": ("<eos>", "<|tool_call>call:add{a:2,b:3}<tool_call|><|tool_response>"),
    "gemma4_v5": ("<eos>", "<|tool_call>call:add{a:2,b:3}<tool_call|><|tool_response>"),
}


def family_tokenizer(name: str, eos: str = "<eos>"):
    """Byte-level, so any family's text round-trips; the family's template (TRL's file) and end-of-turn token."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = trl_templates()[name]
    tokenizer.add_special_tokens({"eos_token": eos})
    return tokenizer


def trl_tool_suffix(tokenizer, chat_template, messages):
    """TRL's own ``GRPOTrainer._get_tool_suffix_ids`` on a trainer holding just what it reads."""
    trainer = SimpleNamespace(
        processing_class=tokenizer, _tokenizer=tokenizer, chat_template=chat_template, chat_template_kwargs={}
    )
    trainer._is_vlm = False
    from trl.trainer.grpo_trainer import GRPOTrainer  # here: it imports TRL's optional extras when installed

    return GRPOTrainer._get_tool_suffix_ids(trainer, messages)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_s_calls_and_next_prompt_are_trl_s(name):
    eos, reply = FAMILIES[name]
    tokenizer = family_tokenizer(name, eos)
    fmt = tool_format(tokenizer, SCHEMAS)
    assert (fmt.family, fmt.reader) == (name, "response_template")
    trl_template = None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)
    assert fmt.chat_template == trl_template  # TRL's GRPOTrainer swaps the same templates
    prompt = tokenizer.apply_chat_template(
        PROMPT, tools=SCHEMAS, add_generation_prompt=True, tokenize=True, return_dict=False, **fmt.render_kwargs()
    )
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    reading = fmt.read(tokenizer, ids, prompt, SCHEMAS)
    assert reading.calls == [ToolCall("add", {"a": 2, "b": 3})] and reading.unparsed is None
    trl_calls = parse_response(tokenizer, ids, prefix=prompt, tools=SCHEMAS)["tool_calls"]
    assert [c.message() for c in reading.calls] == trl_calls
    replies = [{"role": "tool", "name": "add", "content": "5"}]
    suffix = tool_suffix_ids(tokenizer, replies, fmt.render_kwargs())
    assert suffix == trl_tool_suffix(tokenizer, trl_template, replies) and "5" in tokenizer.decode(suffix)


def test_qwen3_is_swapped_for_its_training_template_and_keeps_its_reasoning():
    tokenizer = family_tokenizer("qwen3", "<|im_end|>")
    fmt = tool_format(tokenizer, SCHEMAS)
    assert fmt.chat_template == trl_templates()["qwen3_training"]
    assert tokenizer.chat_template == trl_templates()["qwen3"]  # the tokenizer (and the exported model) keep theirs
    _, reply = FAMILIES["qwen3"]
    reading = fmt.read(tokenizer, tokenizer(reply)["input_ids"], [], SCHEMAS)
    assert reading.fields == {"reasoning_content": "add them"}


@pytest.mark.parametrize(
    "name, eos, reply",
    [
        ("llama3_2", "<|eot_id|>", '{"name": "add", "parameters": {"a": 2,}<|eot_id|>'),  # malformed JSON
        ("qwen2_5", "<|im_end|>", LLAMA),  # another family's format
        ("qwen3_5_nothink", "<|im_end|>", HERMES + "<|im_end|>"),  # Qwen2.5's JSON to a Qwen3.5 template
    ],
)
def test_a_reply_that_looks_like_a_call_but_reads_as_none_is_an_unparsed_error(name, eos, reply):
    tokenizer = family_tokenizer(name, eos)
    fmt = tool_format(tokenizer, SCHEMAS)
    reading = fmt.read(tokenizer, tokenizer(reply)["input_ids"], [], SCHEMAS)
    assert reading.unparsed is not None
    assert [c.name for c in reading.calls] == ["unknown"]
    assert f"cannot be read as a {name} tool call" in reading.calls[0].error
    plain = fmt.read(tokenizer, tokenizer("The answer is 5." + eos)["input_ids"], [], SCHEMAS)
    assert (plain.calls, plain.unparsed) == ([], None)


@pytest.mark.parametrize("name", ["deepseekv3", "muse_glimmer", "diffusion_gemma"])
def test_a_family_that_renders_calls_no_reader_knows_is_refused_by_tool_engines_and_warned_by_the_endpoint(name):
    tokenizer = family_tokenizer(name)
    with pytest.raises(ValueError, match=rf"\({name}\) (has no tool support|writes tool calls in a format no reader)"):
        tool_format(tokenizer, SCHEMAS)
    with pytest.warns(UserWarning, match=rf"\({name}\).*answers requests that carry tools with text only"):
        fmt = tool_format(tokenizer, SCHEMAS, refuse=False)
    assert fmt.reader == "none"
    call = fmt.read(tokenizer, tokenizer(HERMES)["input_ids"], [], SCHEMAS)
    assert call.calls == [] and call.unparsed is not None  # counted, never answered as a call


@pytest.mark.parametrize("name", ["llama3", "gemma3", "phi3", "cohere2"])
def test_a_template_without_tool_support_is_refused_naming_it(name):
    policy = SimpleNamespace(tokenizer=family_tokenizer(name))
    with pytest.raises(ValueError, match=rf"chat_template \({name}\) has no tool support"):
        ToolCalling(tools=[add]).setup(policy, None, 0)


def test_a_template_trl_does_not_know_that_renders_hermes_calls_is_read_by_the_hermes_parser():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    fmt = tool_format(tokenizer, SCHEMAS)
    assert (fmt.family, fmt.reader, fmt.chat_template) == (UNRECOGNISED, "hermes", None)
    assert template_name({"default": trl_templates()["llama3_2"]}) == "llama3_2"


def test_a_user_parser_replaces_the_family_s_reader():
    class Upper:
        def parse(self, text):
            return text.upper(), []

    tokenizer = family_tokenizer("llama3_2", "<|eot_id|>")
    fmt = tool_format(tokenizer, SCHEMAS, parser=Upper())
    assert fmt.reader == "parser"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fmt.read(tokenizer, tokenizer(LLAMA)["input_ids"], [], SCHEMAS).content.startswith('{"NAME"')


# ---- a whole engine on a tiny model with Llama 3.2's template ---------------------------------------------------


@pytest.fixture(scope="module")
def llama_policy(tmp_path_factory):
    from lightning_grpo.model.policy import Policy

    return Policy(write_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


class ScriptedLlama(ToolCalling):
    """The model's turns as a Llama 3.2 checkpoint writes them: a call, then the answer."""

    TURNS = ['{"name": "add", "parameters": {"a": 2, "b": 3}}', "The sum is 5."]

    def _generate_turn(self, policy, episodes, sampling, greedy, dummy):
        eos = policy.tokenizer.eos_token_id
        return [policy.tokenizer(self.TURNS[e.turns], add_special_tokens=False)["input_ids"] + [eos] for e in episodes]


def test_tool_calling_plays_a_llama_episode_in_llama_s_format(llama_policy):
    from lightning_grpo.engines.config import SamplingConfig

    tokenizer = llama_policy.tokenizer
    engine = ScriptedLlama(tools=[add])
    engine.setup(llama_policy, None, 0)
    rollout = engine.generate(
        llama_policy, [PROMPT], 2, SamplingConfig(max_prompt_length=None, max_completion_length=200), False
    )
    assert rollout.completions[0] == [
        {"role": "assistant", "content": "", "tool_calls": [ToolCall("add", {"a": 2, "b": 3}).message()]},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "The sum is 5."},
    ]
    prompt = tokenizer.apply_chat_template(PROMPT, tools=SCHEMAS, add_generation_prompt=True, return_dict=False)
    assert rollout.prompt_ids[0][rollout.prompt_mask[0].bool()].tolist() == prompt
    ids, mask, written = rollout.completion_ids[0], rollout.completion_mask[0].bool(), rollout.tool_mask[0].bool()
    shown = ids[mask & ~written].tolist()
    assert shown == trl_tool_suffix(tokenizer, None, [{"role": "tool", "name": "add", "content": "5"}])
    assert "<|start_header_id|>ipython<|end_header_id|>" in tokenizer.decode(shown)  # Llama's own tool turn
    m = rollout.metrics
    assert m["tools/call_frequency"] == 1.0 and m["tools/failure_frequency"] == 0.0
    assert m["tools/unparsed_frequency"] == 0.0 and m["turns/mean"] == 2.0


class Adder:
    """An environment whose one tool is typed by its schema: Llama writes ``"a": 2``, the method gets an int."""

    def reset(self, **row) -> None:
        self.total = None

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        self.total = a + b
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total == 5)


def test_an_environment_s_tools_are_called_in_llama_s_format(llama_policy):
    from lightning_grpo.engines.config import SamplingConfig

    engine = ScriptedLlama(environment_factory=Adder)
    engine.setup(llama_policy, None, 0)
    sampling = SamplingConfig(max_prompt_length=None, max_completion_length=200)
    rollout = engine.generate(llama_policy, [PROMPT], 1, sampling, False)
    assert rollout.completions[0][1] == {"role": "tool", "name": "add", "content": "5"}
    assert rollout.columns["environment_reward"] == [1.0]


def test_a_real_generate_on_the_llama_model_runs_and_counts_unparsed_turns(llama_policy):
    """The tiny model's own sampling (random weights: no call expected), every stage real."""
    from lightning_grpo.engines.config import SamplingConfig

    engine = ToolCalling(tools=[add])
    engine.setup(llama_policy, None, 0)
    rollout = engine.generate(llama_policy, [PROMPT], 2, SamplingConfig(max_completion_length=8), False)
    assert rollout.completion_ids.shape[0] == 2 and 0.0 <= rollout.metrics["tools/unparsed_frequency"] <= 1.0
    assert engine.format.family == "llama3_2" and engine.format.reader == "response_template"


def test_a_tokenizer_loaded_again_reads_with_the_format_s_response_template():
    """An engine set up in one process reads in another (AsyncRollouts' producer) whose tokenizer has none set."""
    tokenizer = family_tokenizer("llama3_2", "<|eot_id|>")
    fmt = tool_format(tokenizer, SCHEMAS)
    fresh = family_tokenizer("llama3_2", "<|eot_id|>")
    assert getattr(fresh, "response_template", None) is None
    assert fmt.read(fresh, fresh(LLAMA)["input_ids"], [], SCHEMAS).calls == [ToolCall("add", {"a": 2, "b": 3})]


# ---- a real Trainer.fit on the Llama model, its calls in Llama's format ------------------------------------------


def teach_llama_calls(model, tokenizer, steps: int = 200) -> None:
    """Next-token training on whole episodes as Llama 3.2's template renders them (the call as
    ``{"name": "add", "parameters": {...}}<|eot_id|>``, the reply in an ``ipython`` turn, the sum), the loss on what
    follows the prompt, so that the random model writes Llama's calls; nothing of ours parses during this."""
    import torch

    texts, prompts = [], []
    for a in range(4):
        for b in range(4):
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
            episode = [
                {"role": "user", "content": f"{a}+{b}="},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "add", "content": str(a + b)},
                {"role": "assistant", "content": str(a + b)},
            ]
            texts.append(tokenizer.apply_chat_template(episode, tools=SCHEMAS, tokenize=False))
            prompt = tokenizer.apply_chat_template(
                episode[:1], tools=SCHEMAS, add_generation_prompt=True, return_dict=False
            )
            prompts.append(len(prompt))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        rows = list(range(step % 4, 16, 4))
        batch = tokenizer([texts[i] for i in rows], return_tensors="pt", padding=True, padding_side="right",
                          add_special_tokens=False)  # fmt: skip
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        for j, i in enumerate(rows):  # the prompt is not learned: the call, the reply's turn and the sum are
            labels[j, : prompts[i]] = -100
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def sum_reward(completions, answer, **_):
    return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]


@pytest.mark.slow
def test_a_fit_on_a_llama_model_executes_the_calls_it_writes_in_llama_s_format(tmp_path):
    """Every stage real: the tiny model (taught Llama's episodes) samples, its calls are read by TRL's response
    template for ``llama3_2`` (no parser given), ``add`` runs, the reply is rendered as Llama's ``ipython`` turn."""
    import json
    from pathlib import Path

    from helpers import fit, logged, make_module
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo import PromptDataModule
    from lightning_grpo.callbacks import CompletionSampleLogger

    path = write_tiny_llama(tmp_path / "llama")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    teach_llama_calls(model, tokenizer)
    model.save_pretrained(path)
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a in range(4) for b in range(4)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    engine = ToolCalling(tools=[add], max_tool_calling_iterations=2)
    sampling = {"max_completion_length": 64, "max_prompt_length": None}  # Llama's prompt with the tools: ~1030 tokens
    module = make_module(
        path,
        reward_funcs=[sum_reward],
        accuracy_reward=None,
        rollout_engine=engine,
        num_generations=2,
        sampling=sampling,
        optim={"learning_rate": 1e-4},  # the tests' 1e-2 unlearns the calls in one step (0.75 -> 0.0 measured)
    )
    samples = CompletionSampleLogger(every_n_steps=1, max_rows=8)
    data = PromptDataModule(str(tmp_path / "train.jsonl"), batch_size=2, val_split=None)
    trainer = fit(module, data, tmp_path, 2, callbacks=[samples])
    metrics = logged(trainer)
    assert engine.format.family == "llama3_2" and engine.format.reader == "response_template"
    assert min(metrics["train/tools/call_frequency"]) > 0.25, metrics["train/tools/call_frequency"]  # 0.75 measured
    assert max(metrics["train/tools/failure_frequency"]) == 0.0, metrics["train/tools/failure_frequency"]
    episodes = [
        json.loads(line)["completion"] for line in (Path(trainer.log_dir) / "samples.jsonl").read_text().splitlines()
    ]
    called = [e.splitlines() for e in episodes if "tool add: " in e]
    assert called and all('add({"a": ' in e[0] and e[1].startswith("tool add: ") for e in called)
