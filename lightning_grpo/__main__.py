"""``python -m lightning_grpo fit --config ...``: the CLI without the console script on PATH."""

from lightning_grpo.cli import main

main()
