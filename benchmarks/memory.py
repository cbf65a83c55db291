"""Peak memory per rank of GRPO training: FSDP2 sharding vs DDP vs one process, and LoRA vs a full reference copy.

    python benchmarks/memory.py                      # the deep model: 5 runs, ~2.5 minutes on 2 CPU cores
    python benchmarks/memory.py --model 100m         # Qwen2.5's 151936-token vocabulary: the embedding dominates
    python benchmarks/memory.py --json memory.json   # also every rank's raw figures and the ratios
    python benchmarks/memory.py --model wide --runs single meta   # meta-device init: per-rank peak, 1 vs 2 ranks
    python benchmarks/memory.py --quick              # the tiny demo architecture, 1 step: checks the plumbing

Six runs, each a fresh process (this file with ``--worker``; a 2-process run's rank 1 is started by Lightning's
launcher re-running the same command), all GRPO with beta > 0 on the same model and per-rank batch:
    idle        imports torch, transformers, lightning, peft and lightning_grpo, and stops: the floor
    1 process   full fine-tuning; the reference is a frozen copy of the policy
    DDP x2      the same on 2 ranks: every rank holds all weights, gradients, AdamW moments and the reference
    FSDP2 x2    ``ModelParallelStrategy(data_parallel_size=2)``: policy and reference sharded, half on each rank
    FSDP2 meta  the same, the module built under ``trainer.init_module(empty_init=True)``: on the meta device, then
                each rank reads only its own rows of the weights from the model's safetensors files (written
                first, by a ``save`` process), so no rank ever holds the whole model
    LoRA r16    1 process, adapters on every linear layer; the reference is the policy with its adapter off
Each rank writes its figures to a file; the tables are assembled from them.

Columns, MB of resident memory per rank:
    peak RSS    ``getrusage(RUSAGE_SELF).ru_maxrss``, the process's high-water mark. Linux carries it across
                ``exec``: a process started by a bigger one (rank 1, started by rank 0 once rank 0 has built its
                models) reports at least its parent's RSS at that moment. Here rank 1 builds as much itself.
    setup peak  this process's own high-water mark (``VmHWM``) when training starts: building or loading the
                models and sharding them. Meta-device initialisation lowers this one: no rank ever holds a whole
                model, where loading whole models peaks at the policy and its reference copy in full.
    train peak  the high-water mark since training started (``VmHWM``, reset through ``/proc/self/clear_refs``
                after the models were built, sharded and wrapped): equal to the peak when training, not model
                construction, set it.
    at start    RSS when training starts: weights (and the reference), no gradients or AdamW moments yet.
    - idle      peak RSS minus the idle process's: the model, its training state and the activations.
    expected    the model state alone by arithmetic, fp32, per rank:
                  4 bytes x params (weights) + 12 x trainable params (gradient 4, AdamW's two moments 8)
                  + 4 x params for a frozen reference copy (none under LoRA),
                all halved under FSDP2 (each rank holds half of every sharded tensor). Not counted: DDP's all-reduce
                buckets (a second copy of the gradients, + 4 x trainable), the parameters FSDP2 gathers (one layer
                at a time, but the root unit -- embedding, final norm, LM head -- from a forward to the end of its
                backward; the reference's, which has no backward, stays gathered) and their unsharded gradients,
                activations, allocator slack.
Ratios compare one figure of two runs, the largest rank of each: ``FSDP2 / DDP`` near 0.5 in ``- idle`` means
sharding halved what the model costs each rank.

Workers run with ``MALLOC_MMAP_THRESHOLD_=65536`` (``--malloc glibc`` for the defaults): blocks of 64 KiB and more
are unmapped when freed, so RSS follows the live tensors. With glibc's default threshold (rising to 32 MiB),
freed blocks below it stay in the heap; FSDP2 allocates and frees gathered layers on every forward, and on the
deep model that retained more than sharding saved: FSDP2 ranks peaked above DDP's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
MODELS = {
    "deep": "Qwen2, 24 layers x 512 (MLP 1536), the demo's 262-token byte vocabulary, tied: 76M parameters, all "
    "but 0.1M in decoder layers. FSDP2 gathers one layer at a time, so the sharded state dominates",
    "100m": "bench_assets.qwen_100m: Qwen2, 4 layers x 512, Qwen2.5's 151936-token vocabulary, tied: 90M "
    "parameters, 78M of them the embedding / LM head: FSDP2's root unit, gathered whole from a forward to the end of "
    "its backward (the reference's, which has no backward, stays gathered)",
    "wide": "Qwen2, 16 layers x 1024 (MLP 2816, 2 KV heads), the demo's 262-token byte vocabulary, tied: 176M "
    "parameters (673 MB of fp32 weights), all but 0.3M in decoder layers: sharded, one layer gathered at a time",
    "tiny": "the demo model lightning-grpo/tiny-qwen2's architecture (2 layers x 64), random weights: 0.14M",
}
DEEP = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 24}
WIDE = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 16, "num_attention_heads": 16}
RUNS = ("single", "ddp", "fsdp2", "meta", "lora")  # 1 process, 2 with DDP, 2 with FSDP2 (whole, meta), 1 with LoRA
LABELS = {"single": "1 process", "ddp": "DDP x2", "fsdp2": "FSDP2 x2", "meta": "FSDP2 meta", "lora": "LoRA r16"}
TWO_RANKS = ("ddp", "fsdp2", "meta")
RATIOS = {  # name -> (numerator run, denominator run)
    "DDP / 1 process": ("ddp", "single"),
    "FSDP2 / DDP": ("fsdp2", "ddp"),
    "FSDP2 / 1 process": ("fsdp2", "single"),
    "FSDP2 meta / 1 process": ("meta", "single"),
    "FSDP2 meta / FSDP2": ("meta", "fsdp2"),
    "LoRA / full": ("lora", "single"),
}
FIGURES = ("peak_rss_mb", "above_idle_mb", "expected_mb")
VERSIONS = ("torch", "lightning", "transformers", "peft")
MALLOC_MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}


@dataclass
class Settings:
    """What every run of one invocation shares."""

    num_generations: int  # G
    prompts_per_rank: int  # B: B * G completions per rank and step, the same in every run
    max_completion_length: int
    micro_batch_size: int
    steps: int  # optimiser steps; the AdamW moments exist from the first
    beta: float


DEFAULT = Settings(
    num_generations=4, prompts_per_rank=2, max_completion_length=16, micro_batch_size=4, steps=2, beta=0.1
)
QUICK = Settings(num_generations=4, prompts_per_rank=2, max_completion_length=4, micro_batch_size=4, steps=1, beta=0.1)


# ---- measuring, in the worker -----------------------------------------------------------------------------


def reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def memory_now() -> dict[str, float]:
    from bench_assets import own_peak_rss_mb, peak_rss_mb, rss_mb  # imports torch, which the parent does without

    return {"ru_maxrss_mb": peak_rss_mb(), "own_peak_mb": own_peak_rss_mb(), "rss_mb": rss_mb()}


def imports() -> None:
    """What every worker imports first, the idle one included, so that the idle peak is every run's floor."""
    import lightning  # noqa: F401
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401

    import lightning_grpo  # noqa: F401

    torch.set_num_threads(1)


def build_model(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) built in code with a fixed seed: every rank builds the same weights, and no file is
    memory-mapped (pages of a mapped checkpoint would count in RSS)."""
    from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer

    if name == "100m":
        from bench_assets import qwen_100m, qwen_vocab_tokenizer

        tokenizer = qwen_vocab_tokenizer()
        return qwen_100m(tokenizer), tokenizer
    tokenizer = build_tokenizer()
    return build_tiny_qwen2(tokenizer, **{"deep": DEEP, "wide": WIDE}.get(name, {})), tokenizer


def save_model(job: dict[str, Any]) -> dict[str, Any]:
    """The model written in Hugging Face format to ``model_dir``, for the meta run to read its shards from."""
    model, tokenizer = build_model(job["model"])
    model.save_pretrained(job["model_dir"])
    tokenizer.save_pretrained(job["model_dir"])
    return {"rank": 0, "world_size": 1, **memory_now()}


def write_prompts(out_dir: Path) -> str:
    """64 random 32-character prompts as JSONL; rank 0 writes them before Lightning starts rank 1."""
    from bench_assets import synthetic_rows

    path = out_dir / "train.jsonl"
    if not path.exists():
        scratch = out_dir / "train.jsonl.partial"
        scratch.write_text("".join(json.dumps(row) + "\n" for row in synthetic_rows(64)))
        scratch.rename(path)
    return str(path)


def train(job: dict[str, Any]) -> dict[str, Any]:
    """One GRPO run on this rank; the figures this rank measured."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lightning_grpo import PromptDataModule

    s, run = Settings(**job["settings"]), job["run"]
    L.seed_everything(0, verbose=False)
    # meta: nothing built here; each rank reads its own shard of the saved model in configure_model
    model, tokenizer = (job["model_dir"], job["model_dir"]) if run == "meta" else build_model(job["model"])
    strategy = {
        "ddp": "ddp",
        **dict.fromkeys(("fsdp2", "meta"), ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)),
    }
    probe = peak_probe()
    trainer = L.Trainer(
        max_steps=s.steps,
        accelerator="cpu",
        devices=2 if run in strategy else 1,
        strategy=strategy.get(run, "auto"),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[probe],
        default_root_dir=job["out_dir"],
    )
    with trainer.init_module(empty_init=True) if run == "meta" else contextlib.nullcontext():
        module = grpo_module(model, tokenizer, s, lora=run == "lora")
    params = sum(p.numel() for p in module.policy.model.parameters())
    trainable = sum(p.numel() for p in module.policy.model.parameters() if p.requires_grad)
    data = PromptDataModule(write_prompts(Path(job["out_dir"])), batch_size=s.prompts_per_rank, val_split=None)
    trainer.fit(module, data)
    return {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "params": params,
        "trainable": trainable,
        "reference_copy": module.policy.reference is not None,
        "steps": trainer.global_step,
        **probe.figures(),
    }


def grpo_module(model: Any, tokenizer: Any, s: Settings, lora: bool) -> Any:
    from bench_assets import char_length_reward

    from lightning_grpo import GRPOModule

    return GRPOModule(
        model=model,
        reward_funcs=[char_length_reward],
        num_generations=s.num_generations,
        update={"micro_batch_size": s.micro_batch_size},
        policy={"tokenizer": tokenizer, "peft_config": LORA if lora else None},
        sampling={"max_completion_length": s.max_completion_length},
        loss={"beta": s.beta},
        optim={"learning_rate": 1e-6},
    )


def peak_probe() -> Any:
    """A callback recording memory when training starts (models built, sharded, wrapped), then resetting the
    high-water mark so that the end of training reads the training's own peak. Defined here because lightning
    is imported by workers only: the parent stays small, and its children's ``ru_maxrss`` inherit its peak."""
    import lightning as L

    class PeakProbe(L.Callback):
        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.start = memory_now()
            self.reset = reset_peak()

        def figures(self) -> dict[str, Any]:
            end = memory_now()
            return {
                "ru_maxrss_mb": max(self.start["ru_maxrss_mb"], end["ru_maxrss_mb"]),
                "own_peak_mb": max(self.start["own_peak_mb"], end["own_peak_mb"]),
                "train_peak_mb": end["own_peak_mb"] if self.reset else None,
                "rss_at_train_start_mb": self.start["rss_mb"],
                "setup_peak_mb": self.start["own_peak_mb"],  # building, loading and sharding the models
            }

    return PeakProbe()


def worker(payload: str) -> None:
    """One run in this process (and, for 2-process runs, in the rank Lightning starts); each rank writes
    ``rank<k>.json`` into the job's ``out_dir``."""
    job = json.loads(payload)
    imports()
    if job["run"] == "idle":
        figures = {"rank": 0, "world_size": 1, **memory_now()}
        figures["train_peak_mb"] = figures["own_peak_mb"]
    elif job["run"] == "save":
        figures = save_model(job)
    else:
        figures = train(job)
    Path(job["out_dir"], f"rank{figures['rank']}.json").write_text(json.dumps(figures))


# ---- running, in the parent -------------------------------------------------------------------------------


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_command(command: list[str], env: dict[str, str], timeout: float) -> str | None:
    """Run ``command`` in a new process group (rank 1, which its rank 0 starts, joins it); the failure, if any."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)  # until every rank has closed the pipe
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group holds this run's ranks only
        proc.communicate()
        return f"timed out after {timeout:.0f} s"
    return f"exit code {proc.returncode}:\n{tail(output)}" if proc.returncode != 0 else None


def launch(
    run: str, model: str, settings: Settings, env: dict[str, str], timeout: float, model_dir: str
) -> dict[str, Any]:
    """One run in fresh processes: its ranks' figures, or the error that stopped it."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        job = {"run": run, "model": model, "settings": asdict(settings), "out_dir": out, "model_dir": model_dir}
        error = run_command([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)], env, timeout)
        ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    expected_ranks = 2 if run in TWO_RANKS else 1
    if error is None and len(ranks) != expected_ranks:
        error = f"{len(ranks)} of {expected_ranks} ranks reported"
    return {"run": run, "model": model, "ranks": ranks, "error": error, "seconds": time.perf_counter() - start}


def expected_mb(rank: dict[str, Any], run: str) -> float:
    """Model state per rank by arithmetic, fp32: weights, gradients, AdamW's two moments, the reference copy."""
    params, trainable = rank["params"], rank["trainable"]
    total = 4 * params + (4 + 8) * trainable + (4 * params if rank["reference_copy"] else 0)
    return total / (rank["world_size"] if run in ("fsdp2", "meta") else 1) / 2**20


def figures(result: dict[str, Any], idle_mb: float | None) -> dict[str, float | None] | None:
    """A run's figures, of its largest rank: peak RSS, that minus the idle process's, and the expected state."""
    if result["error"] is not None:
        return None
    peak = max(r["ru_maxrss_mb"] for r in result["ranks"])
    return {
        "peak_rss_mb": peak,
        "above_idle_mb": None if idle_mb is None else peak - idle_mb,
        "expected_mb": max(expected_mb(r, result["run"]) for r in result["ranks"]),
    }


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> the two runs compared and the ratio of each of their figures (``None`` if either failed)."""
    out = {}
    for name, (a, b) in RATIOS.items():
        if a not in runs or b not in runs:
            continue
        fa, fb = runs[a]["figures"], runs[b]["figures"]
        both = fa is not None and fb is not None
        out[name] = {"of": [a, b], **{k: fa[k] / fb[k] if both and fb[k] else None for k in FIGURES}}
    return out


# ---- the report -------------------------------------------------------------------------------------------


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_runs(runs: dict[str, dict[str, Any]], idle_mb: float | None) -> None:
    """One row per rank of each run, under its label."""
    print(
        f"{'run':11s}{'rank':>5s}{'peak RSS':>10s}{'setup peak':>12s}{'train peak':>12s}{'at start':>10s}{'- idle':>8s}"
        f"{'expected':>10s}{'params':>9s}{'trainable':>11s}{'seconds':>9s}"
    )
    for label, result in runs.items():
        if result["error"] is not None:
            print(f"{label:11s} FAILED: {result['error']}")
            continue
        for r in result["ranks"]:
            above = None if idle_mb is None else r["ru_maxrss_mb"] - idle_mb
            print(
                f"{label:11s}{r['rank']:5d}{r['ru_maxrss_mb']:10.0f}{mb(r.get('setup_peak_mb')):>12s}"
                f"{mb(r['train_peak_mb']):>12s}"
                f"{r['rss_at_train_start_mb']:10.0f}{mb(above):>8s}{expected_mb(r, result['run']):10.0f}"
                f"{r['params'] / 1e6:8.2f}M{r['trainable'] / 1e6:10.2f}M{result['seconds']:9.0f}"
            )


def print_lora_arithmetic(full: dict[str, Any], lora: dict[str, Any]) -> None:
    """What LoRA should save against full fine-tuning (16 bytes per base parameter less 16 per adapter one),
    and what it saved."""
    if full["error"] is not None or lora["error"] is not None:
        return
    (f,), (a,) = full["ranks"], lora["ranks"]
    base, adapter = f["params"], a["trainable"]
    print(
        f"LoRA saves {16 * (base - adapter) / 2**20:.0f} MB by arithmetic: the reference copy {4 * base / 2**20:.0f} "
        f"+ the base's gradients and AdamW moments {12 * base / 2**20:.0f}\n"
        f"  - the adapter's weights, gradients and moments {16 * adapter / 2**20:.0f}; "
        f"measured: {f['ru_maxrss_mb'] - a['ru_maxrss_mb']:.0f} MB less peak RSS"
    )
    print(
        f"at start (weights only): the reference copy less the adapter, {4 * (base - adapter) / 2**20:.0f} MB "
        f"by arithmetic; measured: {f['rss_at_train_start_mb'] - a['rss_at_train_start_mb']:.0f} MB less"
    )


def print_ratios(table: dict[str, dict[str, Any]]) -> None:
    print(f"{'ratio (largest rank)':22s}{'peak RSS':>10s}{'- idle':>8s}{'expected':>10s}")
    for name, r in table.items():
        cells = "".join(f"{'-' if r[k] is None else format(r[k], '.2f'):>{w}s}" for k, w in zip(FIGURES, (10, 8, 10)))
        print(f"{name:22s}{cells}")


# ---- command line -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", choices=sorted(MODELS), default="deep", help="; ".join(f"{k}: {v}" for k, v in MODELS.items())
    )
    p.add_argument("--quick", action="store_true", help="the tiny model, completions of <= 4 tokens, 1 step (~1 min)")
    p.add_argument("--steps", type=int, help="optimiser steps per run (2; --quick 1)")
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS), help="which runs (all of them)")
    p.add_argument(
        "--malloc",
        choices=["mmap", "glibc"],
        default="mmap",
        help="mmap (default): MALLOC_MMAP_THRESHOLD_=65536 in every worker, freed blocks go back to the OS and RSS "
        "follows live tensors; glibc: the allocator's defaults, which keep freed blocks in the heap",
    )
    p.add_argument("--json", type=Path, help="write the settings, every rank's figures and the ratios here")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take (900)")
    p.add_argument("--worker", metavar="JSON", help="internal: run one measurement described by JSON in this process")
    return p.parse_args(argv)


def worker_env(malloc: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_MMAP}
    return {
        **env,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(MALLOC_MMAP if malloc == "mmap" else {}),
    }


def print_header(command: str, model: str, s: Settings, malloc: str) -> None:
    print(f"$ {command}")
    print(f"model {model}: {MODELS[model]}")
    print(
        f"per rank and step: {s.prompts_per_rank} prompts x {s.num_generations} = "
        f"{s.prompts_per_rank * s.num_generations} completions of <= {s.max_completion_length} tokens after 32-token "
        f"prompts, micro-batches of {s.micro_batch_size}; beta {s.beta}; AdamW, fp32; {s.steps} optimiser step(s)"
    )
    allocator = "MALLOC_MMAP_THRESHOLD_=65536 (RSS follows live tensors)" if malloc == "mmap" else "glibc defaults"
    versions = ", ".join(f"{name} {version(name)}" for name in VERSIONS)
    print(f"every process: 1 torch thread, malloc {allocator}; {versions}", flush=True)


def measure(
    model: str, settings: Settings, env: dict[str, str], timeout: float, selected: list[str]
) -> tuple[dict, dict]:
    """The idle run, then every selected run of RUNS with its figures; progress printed as each one ends. The meta
    run reads the model from files that a ``save`` process writes first."""
    with tempfile.TemporaryDirectory() as model_dir:
        idle = launch("idle", model, settings, env, timeout, model_dir)
        idle_mb = None if idle["error"] is not None else idle["ranks"][0]["ru_maxrss_mb"]
        saved = launch("save", model, settings, env, timeout, model_dir) if "meta" in selected else None
        runs = {}
        for run in (r for r in RUNS if r in selected):
            if run == "meta" and saved["error"] is not None:
                runs[run] = result = {**saved, "run": run, "ranks": [], "error": f"saving the model: {saved['error']}"}
            else:
                runs[run] = result = launch(run, model, settings, env, timeout, model_dir)
            result["figures"] = figures(result, idle_mb)
            status = result["error"] or f"{result['figures']['peak_rss_mb']:.0f} MB peak RSS, largest rank"
            print(f"  {LABELS[run]}: {status} ({result['seconds']:.0f} s)", flush=True)
    return idle, runs


def print_report(idle: dict[str, Any], runs: dict[str, dict[str, Any]], settings: Settings) -> None:
    idle_mb = None if idle["error"] is not None else idle["ranks"][0]["ru_maxrss_mb"]
    print(f"\n== 1. FSDP2 sharding, MB per rank: full fine-tuning, beta {settings.beta} (policy and reference) ==")
    print(
        f"idle process, libraries imported: {mb(idle_mb)} MB" + (f" FAILED: {idle['error']}" if idle["error"] else "")
    )
    print_runs({LABELS[run]: runs[run] for run in ("single", "ddp", "fsdp2", "meta") if run in runs}, idle_mb)
    if "single" in runs and "lora" in runs:
        print("\n== 2. LoRA (reference = the policy, adapter off) vs full fine-tuning (a reference copy), 1 process")
        print_runs({"full, copy": runs["single"], "LoRA r16": runs["lora"]}, idle_mb)
        print_lora_arithmetic(runs["single"], runs["lora"])
    print()
    print_ratios(ratios(runs))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    start = time.perf_counter()
    model, settings = ("tiny", QUICK) if args.quick else (args.model, DEFAULT)
    if args.steps:
        settings = replace(settings, steps=args.steps)
    command = shlex.join(sys.orig_argv)
    print_header(command, model, settings, args.malloc)
    idle, runs = measure(model, settings, worker_env(args.malloc), args.timeout, args.runs)
    print_report(idle, runs, settings)
    seconds = time.perf_counter() - start
    print(f"\n{seconds:.0f} s in all")
    if args.json:
        report = {
            "command": command,
            "model": model,
            "model_description": MODELS[model],
            "settings": asdict(settings),
            "malloc": args.malloc,
            "versions": {name: version(name) for name in VERSIONS},
            "idle": idle,
            "runs": runs,
            "ratios": ratios(runs),
            "seconds": seconds,
        }
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
