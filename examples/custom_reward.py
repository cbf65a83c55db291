"""Writing your own reward functions, then training with them.

    python examples/custom_reward.py                  # tiny model, CPU, ~20 s
    python examples/custom_reward.py --max-steps 2    # a smoke test

A reward function is any callable ``fn(prompts, completions, completion_ids, **columns)`` that returns one float
per completion, or ``None`` where it does not apply. It receives everything by keyword: take the arguments you
need and end with ``**kwargs`` for the rest: the convention of TRL and open-r1, whose functions load by import
path (TRL's expect chat completions). ``columns`` are the dataset's other columns, one value per completion
(the task's ``answer`` here). Its ``__name__`` names its metrics: ``train/rewards/<name>/mean``.

Three kinds are shown on the embedded task (``lightning-grpo/tiny-max``: "max(3,8,1)=" -> "8"):
    digit_in_prompt_reward  plain and fast: partial credit for answering with one of the prompt's digits
    tie_reward              returns None ("not applicable") for rows it has no opinion on
    judge_reward            ``async def``: for I/O (an API, a remote judge); async ones run concurrently
A blocking function that waits on I/O can instead be marked ``@slow_reward`` (``lightning_grpo.rewards``) to get
its own thread.
"""

from __future__ import annotations

import argparse
import asyncio
import re

import lightning as L

from lightning_grpo import GRPOModule, LossConfig, OptimConfig, PromptDataModule, SamplingConfig
from lightning_grpo.callbacks import RewardMonitor
from lightning_grpo.rewards import completion_text


def digit_in_prompt_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the completion is one of the digits in its prompt: shaping towards the answer's form."""
    return [float(completion_text(c).strip() in re.findall(r"\d", p)) for p, c in zip(prompts, completions)]


def tie_reward(prompts, completions, answer, **kwargs) -> list[float | None]:
    """Correctness on prompts whose largest digit appears twice ("max(7,2,7)="), None on all others.

    None is "not applicable": the row is left out of this function's mean and, when every function says None,
    of the advantages. It is not a 0, which would punish completions for a rule that does not concern them.
    """
    scores: list[float | None] = []
    for prompt, completion, gold in zip(prompts, completions, answer):
        digits = re.findall(r"\d", prompt)
        tied = digits.count(max(digits)) > 1
        scores.append(float(completion_text(completion).strip() == gold) if tied else None)
    return scores


async def judge_reward(completions, answer, **kwargs) -> list[float]:
    """An async reward: here a stand-in for a remote judge (each call waits 1 ms, all of them concurrently)."""

    async def judge(completion, gold) -> float:
        await asyncio.sleep(0.001)  # the network round trip of a real judge
        return 1.0 if completion_text(completion).strip() == gold else 0.0

    return list(await asyncio.gather(*(judge(c, g) for c, g in zip(completions, answer))))


def main(argv: list[str] | None = None) -> GRPOModule:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-steps", type=int, default=150)
    args = parser.parse_args(argv)

    # Call them directly first: a reward function is a plain function, so test it like one.
    prompts, completions, answer = ["max(7,2,7)=", "max(1,2,3)="], ["7", "9"], ["7", "3"]
    print("digit_in_prompt_reward", digit_in_prompt_reward(prompts=prompts, completions=completions))
    print("tie_reward            ", tie_reward(prompts=prompts, completions=completions, answer=answer))
    print("judge_reward          ", asyncio.run(judge_reward(completions=completions, answer=answer)))

    L.seed_everything(0)
    module = GRPOModule(
        model="lightning-grpo/tiny-qwen2",
        reward_funcs=[judge_reward, digit_in_prompt_reward, tie_reward],
        reward_weights=[1.0, 0.1, 0.5],  # the total is the weighted sum of the functions that apply
        accuracy_reward="judge_reward",
        num_generations=8,
        sampling=SamplingConfig(max_completion_length=3),
        optim=OptimConfig(learning_rate=1e-3),
        loss=LossConfig(beta=0.1),
    )
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        callbacks=[RewardMonitor(window=20)],
    )
    trainer.fit(module, PromptDataModule("lightning-grpo/tiny-max", batch_size=16))
    window = {
        k.split("/")[2]: round(float(v), 3)
        for k, v in trainer.callback_metrics.items()
        if k.startswith("train/rewards_window/")
    }
    print("mean reward per function over the last 20 steps:", window)
    return module


if __name__ == "__main__":
    main()
