"""A stateful environment (TRL's ``environment_factory``) trained with GRPO: guess the hidden number.

    python examples/stateful_environment.py                  # tiny model, CPU, a minute or two
    python examples/stateful_environment.py --max-steps 2    # a smoke test

An environment is a class. The engine makes one instance per rollout (reused across steps) and calls
``reset(**row)`` with the dataset row before the episode; what it returns is appended to the last user message.
Its public methods are the model's tools (type hints and a docstring each, as for any tool); they read and change
the instance's state. ``get_reward()`` scores the finished episode from that state: it reaches the reward functions
as the ``environment_reward`` column (``lightning_grpo.engines.environment_reward`` passes it through) and is logged
as ``train/rewards/GuessTheNumber/mean``. A dict ``{name: class}`` picks an environment per row by an
``environment`` column. The same class runs unchanged under TRL's ``GRPOTrainer(environment_factory=...)``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import lightning as L

from lightning_grpo import GRPOModule, OptimConfig, PolicyConfig, PromptDataModule, SamplingConfig
from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE, build_tokenizer
from lightning_grpo.engines import ToolCalling, environment_reward


class GuessTheNumber:
    """A hidden digit; the model guesses with the ``guess`` tool and is told higher or lower."""

    def reset(self, target: int, **kwargs) -> str:
        self.target, self.guesses, self.solved = target, 0, False
        return " I hide a digit: find it with the guess tool."

    def guess(self, n: int) -> str:
        """Guess the hidden digit.

        Args:
            n: the guess, 0 to 9
        """
        self.guesses += 1
        self.solved = self.solved or n == self.target
        return "correct" if n == self.target else ("higher" if n < self.target else "lower")

    def get_reward(self) -> float:
        """1 for a first-guess hit, 1/k for a hit at the k-th guess, 0 when never found."""
        return 1.0 / self.guesses if self.solved else 0.0


def write_data(path: Path, n: int = 64) -> str:
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": "Play."}], "target": rng.randint(0, 9)} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=40)
    args = parser.parse_args()

    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE  # a chat template that renders tools, calls and tool replies
    engine = ToolCalling(environment_factory=GuessTheNumber, max_tool_calling_iterations=3)
    module = GRPOModule(
        model="lightning-grpo/tiny-qwen2",
        policy=PolicyConfig(tokenizer=tokenizer),
        reward_funcs=[environment_reward],
        num_generations=4,
        rollout_engine=engine,
        sampling=SamplingConfig(max_completion_length=48),
        optim=OptimConfig(learning_rate=2e-3),
    )
    data = PromptDataModule(write_data(Path(tempfile.mkdtemp()) / "guess.jsonl"), batch_size=4, val_split=None)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)
    episode = trainer.callback_metrics
    print({k: round(float(v), 3) for k, v in episode.items() if "tools/" in k or "turns/" in k or "Guess" in k})


if __name__ == "__main__":
    main()
