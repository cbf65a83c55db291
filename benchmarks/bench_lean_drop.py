"""LeanDecode's loop with ended rows dropped from the decode batch (``drop_finished_rows``) against keeping every row
until all have ended, side by side in one run, on completions of uneven lengths.

The gen model (Qwen2, 4 layers of width 256, vocabulary 32,000; ``bench_assets.gen_model``) with random weights and
an LM-head bias on EOS set so that P(EOS) is about ``--eos-prob`` a step: completion lengths are then roughly
geometric (mean ~1 / p, cut at ``--max-tokens``), as uneven as a reasoning group's. Both loops run with the same
seed per repeat, so they sample the same tokens (checked) and take the same number of steps; only the rows each
step computes differ. Times one ``Decoder`` call (prefill and decode loop), the weights packed once beforehand as a
``generate`` call does::

    OMP_NUM_THREADS=1 python benchmarks/bench_lean_drop.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_assets import GEN_VOCAB, gen_model, qwen_vocab_tokenizer
from torch import Tensor, nn

from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode.lean import Decoder, NextTokenLogits, decode_weights


def eos_biased(model: nn.Module, prompts: Tensor, eos: int, p: float) -> None:
    """Give the LM head a bias that is 0 except on ``eos``, set so that P(eos) ~ ``p`` at the prompts' last
    positions (median over rows): log(p / (1 - p)) above the other ids' logsumexp. The weight stays the (tied)
    embedding's."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        logits = model(input_ids=prompts).logits[:, -1].float()  # [b, V]
        others = torch.cat([logits[:, :eos], logits[:, eos + 1 :]], dim=1).logsumexp(dim=1)  # [b]
        gap = (others - logits[:, eos]).median()  # the bias that makes eos as likely as all others together
        biased = nn.Linear(head.in_features, head.out_features, bias=True)
        biased.weight = head.weight
        biased.bias.zero_()[eos] = gap + torch.tensor(p / (1 - p)).log()
    model.set_output_embeddings(biased)


def one_call(decoder: Decoder, prompts: Tensor, group_size: int, seed: int) -> tuple[float, Tensor]:
    """Seconds for one call and its [N, t] completion ids."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    ids = decoder(prompts, torch.ones_like(prompts), group_size, greedy=False, share_prompt=True)
    return time.perf_counter() - start, ids


def measure(args: argparse.Namespace) -> dict[bool, list[tuple[float, Tensor]]]:
    """Per ``drop_finished``: (seconds, ids) of every repeat, the two loops alternating; one warm-up call each."""
    tokenizer = qwen_vocab_tokenizer(GEN_VOCAB)
    model = gen_model(tokenizer, args.seed).eval()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    generator = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(3, GEN_VOCAB, (args.rows // args.group_size, args.prompt_length), generator=generator)
    eos_biased(model, prompts, eos, args.eos_prob)
    sampling = SamplingConfig(max_completion_length=args.max_tokens)
    runs: dict[bool, list[tuple[float, Tensor]]] = {False: [], True: []}
    with torch.no_grad(), decode_weights(model, args.rows) as step:
        decoders = {drop: Decoder(NextTokenLogits(model), sampling, [eos], pad, False, step, drop) for drop in runs}
        for decoder in decoders.values():
            one_call(decoder, prompts, args.group_size, args.seed)  # warm-up: allocator, thread pool
        for repeat in range(args.repeats):
            for drop, decoder in decoders.items():
                runs[drop].append(one_call(decoder, prompts, args.group_size, args.seed + 1 + repeat))
    return runs


def lengths(ids: Tensor, eos: int) -> list[int]:
    """Each row's completion length: tokens up to and including its first EOS, or all t."""
    ended = ids == eos  # [N, t]
    return torch.where(ended.any(dim=1), ended.int().argmax(dim=1) + 1, ids.shape[1]).tolist()


def report(runs: dict[bool, list[tuple[float, Tensor]]], eos: int) -> str:
    """One line per repeat (lengths, decode steps, both times), then the medians and their ratio."""
    lines = [f"{'repeat':>6} {'mean/min/max length':>20} {'steps':>6} {'keep s':>8} {'drop s':>8} {'speed-up':>8}"]
    for i, ((keep_s, keep_ids), (drop_s, drop_ids)) in enumerate(zip(runs[False], runs[True])):
        assert torch.equal(keep_ids, drop_ids), "the two loops sampled different tokens"
        n, steps = lengths(keep_ids, eos), keep_ids.shape[1]
        shape = f"{statistics.mean(n):.0f}/{min(n)}/{max(n)}"
        lines.append(f"{i:>6} {shape:>20} {steps:>6} {keep_s:>8.2f} {drop_s:>8.2f} {keep_s / drop_s:>7.2f}x")
    steps = sum(ids.shape[1] for _, ids in runs[False])
    medians = {drop: statistics.median(s for s, _ in runs[drop]) for drop in runs}
    for drop, name in ((False, "keep every row"), (True, "drop ended rows")):
        rate = steps / sum(s for s, _ in runs[drop])
        lines.append(f"{name:>16}: {medians[drop]:.2f} s/call (median), {rate:.1f} decode steps/s")
    lines.append(f"{'speed-up':>16}: {medians[False] / medians[True]:.2f}x (median s/call, keep / drop)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=16, help="rows decoded together (16)")
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt (8: 2 prompts x 8)")
    p.add_argument("--prompt-length", type=int, default=32, help="prompt tokens (32)")
    p.add_argument("--max-tokens", type=int, default=512, help="max_completion_length (512)")
    p.add_argument("--eos-prob", type=float, default=0.01, help="P(EOS) per step the bias aims at (0.01)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per loop, each with its own seed (3)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    threads = torch.get_num_threads()
    print(f"{args.rows} rows, max {args.max_tokens} tokens, P(EOS) ~ {args.eos_prob} a step, {threads} threads")
    print(report(measure(args), qwen_vocab_tokenizer(GEN_VOCAB).eos_token_id))


if __name__ == "__main__":
    main()
