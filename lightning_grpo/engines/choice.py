"""A module's settings -> the engine that serves its policy: the default one, and whether a chosen one can carry
a vision-language policy's images. Knows the engines' classes; nothing of training."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_grpo.engines.base import RolloutEngine
from lightning_grpo.engines.decode import HFGenerate, LeanDecode


def default_engine(sampling: Any) -> LeanDecode | HFGenerate:
    """The engine of a module given none: ``LeanDecode``, or ``HFGenerate`` (said in one line) when the ``sampling``
    settings (a ``SamplingConfig`` or its dict) pass ``generation_kwargs``, which only ``generate`` takes."""
    kwargs = sampling.get("generation_kwargs") if isinstance(sampling, dict) else sampling.generation_kwargs
    if kwargs:
        rank_zero_info(
            f"rollout engine: HFGenerate, as sampling.generation_kwargs={kwargs!r} are generate's options "
            "(the default LeanDecode takes sampling's own settings only)"
        )
        return HFGenerate()
    return LeanDecode()


def engine_for(engine: RolloutEngine, policy: Any, chosen: bool) -> RolloutEngine:
    """The engine that serves ``policy``: a vision-language policy needs one that carries images to generation
    (``takes_images``): the default becomes ``HFGenerate`` (said in one line); a chosen engine that cannot is
    refused here, before any compute, naming it."""
    if not policy.is_multimodal or engine.takes_images:
        return engine
    if not chosen:
        rank_zero_info(
            "rollout engine: HFGenerate, as the policy is a vision-language model (LeanDecode takes no images)"
        )
        return HFGenerate()
    raise ValueError(
        f"rollout_engine {type(engine).__name__} cannot carry images to generation and to the log-prob forwards, "
        "and the policy is a vision-language model: use lightning_grpo.engines.HFGenerate, or VLLMColocate for vLLM "
        "(references/vision.md)"
    )
