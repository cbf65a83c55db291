"""Peak memory of each side's imports, stage by stage: what a run costs before any model is built. Imported only
by an "imports" worker of ``trl_vs_lightning_grpo.py``, one process per side.

The worker has torch imported already (the benchmark's own module imports it), so torch is the first stage.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from bench_assets import own_peak_rss_mb

STAGES = {
    "ours": [
        ("torch", "torch"),
        ("transformers' model classes", "transformers.modeling_utils"),
        ("lightning (imports torchmetrics)", "lightning.pytorch"),
        ("lightning_grpo", "lightning_grpo"),
        ("datasets (loads the prompts)", "datasets"),
    ],
    "trl": [
        ("torch", "torch"),
        ("transformers' model classes", "transformers.modeling_utils"),
        ("trl's GRPOTrainer", "trl.trainer.grpo_trainer"),
    ],
}
# Optional libraries others import when they are installed: the reason one venv's figures differ from another's.
WATCHED = ("torchmetrics", "matplotlib", "scipy", "pandas", "pyarrow", "mlflow", "wandb")


@dataclass
class ImportSpec:
    side: str


def run(spec: ImportSpec) -> dict[str, Any]:
    stages = []
    for label, module in STAGES[spec.side]:
        importlib.import_module(module)
        stages.append({"stage": label, "module": module, "peak_rss_mb": own_peak_rss_mb()})
    loaded = sorted(name for name in WATCHED if name in sys.modules)
    return {"side": spec.side, "stages": stages, "loaded": loaded}
