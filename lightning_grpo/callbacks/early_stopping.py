"""StepEarlyStopping: Lightning's ``EarlyStopping`` checked after every training step, for ``train/*`` metrics.

``EarlyStopping(monitor="train/reward")`` checks at the end of each validation pass (or, with
``check_on_train_epoch_end=True``, of each epoch), so in a GRPO run that validates once, or whose 50 steps are
one epoch, it never acts. This subclass runs the same check, with the same settings and ranks' agreement, on
``on_train_batch_end`` instead; ``patience`` then counts training steps.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping
from typing_extensions import override


class StepEarlyStopping(EarlyStopping):
    """``EarlyStopping`` that checks its ``monitor`` after every training step, not at validation or epoch ends.

    Takes ``EarlyStopping``'s arguments (``monitor``, ``mode``, ``patience``, ``min_delta``, ``stopping_threshold``
    ...) except ``check_on_train_epoch_end``. The run's ``train/*`` metrics are logged on every step for a callback
    that monitors them.

    Example::

        trainer = L.Trainer(callbacks=[StepEarlyStopping(monitor="train/reward", mode="max", patience=20)])
    """

    def __init__(self, **kwargs: Any) -> None:
        if "check_on_train_epoch_end" in kwargs:
            raise ValueError("StepEarlyStopping checks after every training step: drop check_on_train_epoch_end")
        super().__init__(check_on_train_epoch_end=True, **kwargs)  # True: never at the end of validation

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Nothing: the step that ended the epoch was checked already (a second check would count it twice)."""

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_epoch_end(trainer, pl_module)
