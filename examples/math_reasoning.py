"""GRPO on a math-style task with the math rewards of the ``math_reasoning`` preset.

    python examples/math_reasoning.py                  # tiny model, CPU, ~40 s
    python examples/math_reasoning.py --max-steps 2    # a smoke test

The task is the embedded one (``lightning-grpo/tiny-max``: "max(3,8,1)=" -> "8", gold in the ``answer``
column) and the model the embedded tiny Qwen2, so it runs offline on CPU. The rewards are the ones you would
use on a real math dataset with an ``answer`` (or ``solution``) column:

    math_verify_reward         1.0  symbolic equivalence with the gold answer (math-verify), the correctness
    soft_think_format_reward   0.2  one </think> closes the reasoning
    reasoning_steps_reward     0.1  "Step 1", numbered lists, "First/Then/Finally"
    repetition_penalty_reward  0.2  negative for repeated 3-grams

The tiny model answers with one digit, so only ``math_verify_reward`` varies here; the other three score 0
for every completion and move no advantage (a reward that is equal within a group cancels out of it). On a
pretrained LLM with ``max_completion_length`` of a few hundred tokens they shape the reasoning as well.
Measured with the defaults: 200 steps, held-out accuracy 0% -> 31%.
For gsm8k, whose gold answers end in "#### 72", see templates/qwen_gsm8k_1gpu.yaml.
"""

from __future__ import annotations

import argparse

import lightning as L

from lightning_grpo import GRPOModule, LossConfig, OptimConfig, PromptDataModule, SamplingConfig
from lightning_grpo.callbacks import ModeCollapseAlert, RunSummary


def main(argv: list[str] | None = None) -> RunSummary:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--model", default="lightning-grpo/tiny-qwen2")
    parser.add_argument("--dataset", default="lightning-grpo/tiny-max")
    parser.add_argument("--max-completion-length", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    args = parser.parse_args(argv)

    L.seed_everything(0)
    module = GRPOModule(
        model=args.model,
        reward_preset="math_reasoning",  # adds the four functions above with their weights
        accuracy_reward="math_verify_reward",  # val/accuracy = share of completions math-verify accepts
        num_generations=8,
        sampling=SamplingConfig(max_completion_length=args.max_completion_length),
        optim=OptimConfig(learning_rate=args.learning_rate, warmup_ratio=0.05),
        loss=LossConfig(beta=0.1),
    )
    print("rewards:", dict(zip([f.__name__ for f in module.rewards.funcs], module.rewards.weights)))
    summary = RunSummary()
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[summary, ModeCollapseAlert(reward_ceiling=1.0, action="warn")],
        val_check_interval=min(args.max_steps, 100),  # batches, counted across epochs
        check_val_every_n_epoch=None,
        num_sanity_val_steps=-1,  # held-out accuracy before training
        default_root_dir="runs/math_reasoning",
    )
    trainer.fit(module, PromptDataModule(args.dataset, batch_size=16, max_val_prompts=200))
    return summary


if __name__ == "__main__":
    main()
