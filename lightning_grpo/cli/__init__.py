"""The ``lightning-grpo`` program: ``fit`` (LightningCLI), ``report`` and ``selfcheck``."""

from lightning_grpo.cli.main import main

__all__ = ["main"]
