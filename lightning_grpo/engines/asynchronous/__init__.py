"""Asynchronous engines: prompt batches -> Rollouts sampled ahead of the trainer, at most ``max_staleness`` updates
old. ``AsyncRollouts`` (``async_rollouts``) runs any in-process engine in a producer process (``producer``), which
receives the weights after each update and may score the rollouts itself. (``async`` is a keyword, hence the name.)
"""

from lightning_grpo.engines.asynchronous.async_rollouts import AsyncRollouts

__all__ = ["AsyncRollouts"]
