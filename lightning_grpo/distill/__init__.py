"""On-policy distillation from a frozen teacher: its settings (``config.py``: the ``distill:`` section), its math
(``loss.py``: the reverse-KL advantage, GKD's generalised JSD, the mix with the rewards' advantages; pure functions)
and what a step trains against (``targets.py``: the teacher's log-probs once per generation batch, GKD's
off-policy steps). Two pieces live with their kind: the teacher model is held by the Policy like the frozen
reference (``model/teacher.py``, ``model/served_teacher.py``: moved, sharded and left out of checkpoints with the
policy, so below every stage), and ``DistillAlert`` is a callback like every alert (``callbacks/distill.py``,
``alerts: {distill: ...}``)."""

from lightning_grpo.distill.config import DistillConfig

__all__ = ["DistillConfig"]
