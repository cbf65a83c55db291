"""``python -m lightning_grpo.cli fit --config ...``."""

from lightning_grpo.cli import main

main()
