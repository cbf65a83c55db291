"""Vision-language GRPO: image columns checked before compute, images carried to generation and to every log-prob
forward, log-probs equal to the model's own forward, one GRPO step equal to TRL 1.16's on the same tiny VLM,
the settings that choose what trains, and the refusals of what cannot carry images."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import random

import pytest
import torch

from lightning_grpo.demo.vision import COLOURS, QUESTION, build_processor, build_tiny_llava, square_image
from lightning_grpo.engines import HFGenerate, LeanDecode
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.images import image_problem
from lightning_grpo.loss import LossConfig, grpo_loss
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy


@pytest.fixture(scope="module")
def processor():
    return build_processor()


def tiny_policy(processor, **settings) -> Policy:
    return Policy(build_tiny_llava(processor, seed=1), PolicyConfig(tokenizer=processor, **settings))


def image_prompts(n: int, seed: int = 0) -> tuple[list, dict]:
    """n chat prompts with an image part (one shorter, so the batch is left-padded) and their columns."""
    rng = random.Random(seed)
    letters = [list(COLOURS)[i % 4] for i in range(n)]
    prompts = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}] for _ in letters]
    prompts[0] = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    return prompts, {"image": [square_image(c, rng) for c in letters], "answer": letters}


def sampled(policy: Policy, n: int = 3, g: int = 2, length: int = 4):
    prompts, columns = image_prompts(n)
    torch.manual_seed(0)
    sampling = SamplingConfig(max_completion_length=length)
    return HFGenerate().generate(policy, prompts, g, sampling, greedy=False, columns=columns)


# ---- data ---------------------------------------------------------------------------------------------------


def test_image_problems_name_the_file_and_the_bytes(tmp_path):
    good = tmp_path / "ok.png"
    square_image("r", random.Random(0)).save(good)
    assert image_problem(str(good)) is None
    assert image_problem(good.read_bytes()) is None
    assert image_problem({"bytes": None, "path": str(good)}) is None
    assert "missing file" in image_problem(str(tmp_path / "gone.png"))
    assert "does not decode" in image_problem(b"\x89PNG broken")
    assert "must be" in image_problem(42)


def test_data_module_names_each_bad_image_with_its_row_before_compute(tmp_path):
    from lightning_grpo.data import PromptDataModule

    good = tmp_path / "ok.png"
    square_image("g", random.Random(0)).save(good)
    (tmp_path / "bad.png").write_bytes(b"not an image")
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    rows = [{"prompt": prompt, "image": str(good), "answer": "g"} for _ in range(6)]
    rows[2]["image"] = str(tmp_path / "missing.png")
    rows[4]["image"] = str(tmp_path / "bad.png")
    rows[5]["prompt"] = [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "?"}]}
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = PromptDataModule(str(path), batch_size=2, val_size=0)
    with pytest.raises(ValueError) as err:
        data.setup("fit")
    message = str(err.value)
    assert "3 image problems" in message
    assert "row 2: image[0] is a path to a missing file" in message
    assert "row 4: image[0] does not decode as an image" in message
    assert "row 5: its prompt has 2 {'type': 'image'} parts but the row has 1 images" in message


def test_image_datasets_load_lazily_and_batch_their_images(tmp_path):
    from datasets import Dataset, DatasetDict, Image

    from lightning_grpo.data import PromptDataModule

    prompts, columns = image_prompts(4)
    rows = [{"prompt": p, "image": i, "answer": a} for p, i, a in zip(prompts, columns["image"], columns["answer"])]
    DatasetDict({"train": Dataset.from_list(rows).cast_column("image", Image())}).save_to_disk(str(tmp_path / "d"))
    data = PromptDataModule(str(tmp_path / "d"), batch_size=2, val_size=0)
    data.setup("fit")
    batch = data.collate([data.train_data[0], data.train_data[1]])
    assert [im.size for im in batch.columns["image"]] == [(28, 28), (28, 28)]


# ---- the policy and its log-probs ---------------------------------------------------------------------------


def test_rollout_carries_pixel_values_and_logps_equal_the_models_own_forward(processor):
    policy = tiny_policy(processor)
    rollout = sampled(policy)
    assert set(rollout.vision) == {"pixel_values"} and len(rollout.vision["pixel_values"]) == len(rollout) == 6
    assert (rollout.prompt_mask == 0).any()  # the short prompt is left-padded: positions must still agree
    ours = policy.logps(rollout, [slice(0, 3), slice(3, 6)])  # [N, T], two micro-batches
    model = policy.model.eval()
    for i in range(len(rollout)):  # each row alone, unpadded, through model(**inputs)
        keep = rollout.attention_mask[i].bool()
        ids = rollout.input_ids[i][keep][None]
        with torch.no_grad():
            logits = model(input_ids=ids, pixel_values=rollout.vision["pixel_values"][i]).logits[0]
        width = int(rollout.completion_mask[i].sum())
        targets = ids[0, -width:] if width else ids[0, :0]
        plain = logits[-width - 1 : -1].log_softmax(-1).gather(-1, targets[:, None])[:, 0]
        torch.testing.assert_close(ours[i, :width], plain, rtol=0, atol=1e-5)


def test_several_images_a_row_and_plain_text_prompts(processor):
    """An ``images`` column with two images a row and plain-text prompts: the image parts go in front of the text
    (TRL's convention), each row's two images travel together, and the log-probs still equal the plain forward."""
    policy = tiny_policy(processor)
    rng = random.Random(3)
    images = [[square_image("r", rng), square_image("b", rng)], [square_image("g", rng), square_image("y", rng)]]
    rollout = HFGenerate().generate(
        policy, ["two squares?", "which?"], 2, SamplingConfig(max_completion_length=3), False, {"images": images}
    )
    assert [tuple(t.shape) for t in rollout.vision["pixel_values"]] == [(2, 3, 28, 28)] * 4
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert ((rollout.prompt_ids == image_token).sum(1) == 8).all()  # 2 images x 4 patches, before the text
    ours = policy.logps(rollout, [slice(0, 4)])
    for i in range(len(rollout)):
        keep = rollout.attention_mask[i].bool()
        ids = rollout.input_ids[i][keep][None]
        with torch.no_grad():
            logits = policy.model.eval()(input_ids=ids, pixel_values=rollout.vision["pixel_values"][i]).logits[0]
        width = int(rollout.completion_mask[i].sum())
        plain = logits[-width - 1 : -1].log_softmax(-1).gather(-1, ids[0, -width:, None])[:, 0]
        torch.testing.assert_close(ours[i, :width], plain, rtol=0, atol=1e-5)


def test_the_images_change_the_logps(processor):
    """Not a text forward in disguise: other images, other log-probs of the same tokens."""
    policy = tiny_policy(processor, freeze_vision_tower=False)
    rollout = sampled(policy)
    before = policy.logps(rollout, [slice(0, 6)])
    flipped = {"pixel_values": [t.flip(-1) * -1 for t in rollout.vision["pixel_values"]]}
    after = policy.logps(dataclasses.replace(rollout, vision=flipped), [slice(0, 6)])
    assert (before - after).abs().max() > 1e-4


def test_reference_and_old_logps_take_the_images_too(processor):
    """beta > 0 keeps a frozen copy; its forward (and the no-grad one of the old policy) gets the same images."""
    policy = Policy(build_tiny_llava(processor, seed=1), PolicyConfig(tokenizer=processor), reference=True)
    rollout = sampled(policy)
    rows = [slice(0, 6)]
    torch.testing.assert_close(policy.reference_logps(rollout, rows), policy.logps(rollout, rows))


def test_vision_tower_frozen_by_default_and_trained_when_asked(processor):
    frozen = tiny_policy(processor)
    tower = {n for n, p in frozen.model.named_parameters() if ".vision_tower." in f".{n}"}
    assert tower and not any(p.requires_grad for n, p in frozen.model.named_parameters() if n in tower)
    assert any(p.requires_grad for n, p in frozen.model.named_parameters() if "multi_modal_projector" in n)
    trained = tiny_policy(processor, freeze_vision_tower=False)
    assert all(p.requires_grad for n, p in trained.model.named_parameters() if n in tower)


def test_image_tokens_are_never_sampled(processor):
    """A completion holding an image token has no image to fill it: the next forward would fail."""
    policy = tiny_policy(processor)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert policy.unsampled_token_ids == [image_token]
    prompts, columns = image_prompts(2)
    rollout = HFGenerate().generate(policy, prompts, 1, SamplingConfig(max_completion_length=1), True, columns)
    model = policy.model.eval()
    with torch.no_grad():  # point the image token's head row along the prompts' last hidden state: it wins greedily
        hidden = model.model(
            input_ids=rollout.prompt_ids, attention_mask=rollout.prompt_mask, **rollout.vision_inputs(slice(0, 2))
        ).last_hidden_state[:, -1]
        model.lm_head.weight[image_token] = 1000 * hidden.mean(0) / hidden.mean(0).norm()
        logits = model(
            input_ids=rollout.prompt_ids, attention_mask=rollout.prompt_mask, **rollout.vision_inputs(slice(0, 2))
        ).logits
    assert (logits[:, -1].argmax(-1) == image_token).all()  # what generate would draw without the suppression
    again = HFGenerate().generate(policy, prompts, 1, SamplingConfig(max_completion_length=3), True, columns)
    assert not (again.completion_ids == image_token).any()


# ---- refusals -----------------------------------------------------------------------------------------------


def test_engines_without_images_are_refused_naming_the_engine(processor):
    from lightning_grpo import GRPOModule

    model = build_tiny_llava(processor, seed=1)
    with pytest.raises(ValueError, match="rollout_engine LeanDecode cannot carry images"):
        GRPOModule(
            model,
            reward_funcs=[lambda **k: [0.0]],
            policy=PolicyConfig(tokenizer=processor),
            rollout_engine=LeanDecode(),
        )
    module = GRPOModule(model, reward_funcs=[lambda **k: [0.0]], policy=PolicyConfig(tokenizer=processor))
    assert type(module.engine) is HFGenerate  # the default for a vision-language policy


@pytest.mark.parametrize(
    "settings, named",
    [({"share_prompt_prefix": True}, "share_prompt_prefix"), ({"padding_free": True}, "padding_free")],
)
def test_forwards_that_take_no_images_are_refused(processor, settings, named):
    with pytest.raises(ValueError, match=f"vision-language policy cannot run with policy.{named}"):
        tiny_policy(processor, **settings)


def test_images_for_a_text_policy_are_refused(tiny_model_dir):
    prompts, columns = image_prompts(2)
    with pytest.raises(ValueError, match="the policy is a text model"):
        HFGenerate().generate(
            Policy(tiny_model_dir), prompts, 2, SamplingConfig(max_completion_length=2), False, columns
        )


def test_images_for_a_text_model_are_refused_before_compute(tiny_model_dir, tmp_path):
    import lightning as L
    from helpers import make_module

    from lightning_grpo.cli.preflight import preflight
    from lightning_grpo.data import PromptDataModule

    square_image("b", random.Random(0)).save(tmp_path / "b.png")
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    row = json.dumps({"prompt": prompt, "image": str(tmp_path / "b.png"), "answer": "b"})
    (tmp_path / "train.jsonl").write_text((row + "\n") * 4)
    data = PromptDataModule(str(tmp_path / "train.jsonl"), batch_size=2, val_split=None)
    with pytest.raises(ValueError, match="the dataset has an 'image' column, but model.model .* is a text model"):
        preflight(L.Trainer(accelerator="cpu", logger=False), make_module(tiny_model_dir), data)


def test_building_a_vision_language_policy_on_the_meta_device_is_refused(processor, tmp_path):
    build_tiny_llava(processor).save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    with torch.device("meta"), pytest.raises(ValueError, match="is a vision-language model: building it on the meta"):
        Policy(str(tmp_path))


# ---- images opened as TRL and transformers open them -----------------------------------------------------------

IMAGE_KINDS = ("rgb", "rgba", "la", "palette", "palette_png", "exif_path", "png_bytes")


def kinds_of_image(tmp_path) -> dict:
    """name -> (the column value a user gives, what TRL's processor gets for it): a plain RGB square, transparent
    RGBA and LA, a palette with a transparent colour (as a PIL image and as the PNG bytes ``datasets`` stores), an
    EXIF-rotated phone photo by path (two colours side by side: its rotation changes the pixels, not only the size),
    an RGBA PNG as bytes."""
    from datasets import Image as ImageFeature
    from PIL import Image

    rgba = Image.new("RGBA", (20, 12), (200, 30, 30, 0))
    rgba.paste((30, 200, 30, 255), (0, 0, 10, 12))
    la = Image.new("LA", (12, 20), (90, 0))
    palette = rgba.convert("P")
    palette.info["transparency"] = 0
    photo = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 (a phone photo taken upright)
    upright = Image.new("RGB", (44, 28), (10, 120, 240))
    upright.paste((240, 200, 10), (0, 0, 22, 28))
    upright.save(photo, exif=exif)
    stored = {name: {"bytes": png_bytes(im), "path": None} for name, im in (("rgba", rgba), ("palette", palette))}
    rgb = square_image("r", random.Random(0))
    kinds = {
        "rgb": (rgb, rgb),
        "rgba": (rgba, rgba),
        "la": (la, la),
        "palette": (palette, palette),
        "palette_png": (stored["palette"], ImageFeature().decode_example(stored["palette"])),  # mode P, transparent
        "exif_path": (str(photo), str(photo)),  # TRL's processor loads a path itself (load_image)
        "png_bytes": (stored["rgba"], ImageFeature().decode_example(stored["rgba"])),  # a datasets Image column's
    }
    assert tuple(kinds) == IMAGE_KINDS
    return kinds


def png_bytes(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_every_kind_of_image_gives_the_pixel_values_trls_processor_call_gives(processor, tmp_path):
    """Issue 58: RGBA/LA were converted to RGB first (transparent pixels on black, TRL's processor puts them on
    white: pixel values 3.8 apart) and a path's EXIF rotation was ignored (a 44x28 photo tagged 'rotate 90' stayed
    44x28)."""
    from trl.data_utils import prepare_multimodal_messages

    from lightning_grpo.engines.prompts import tokenize_image_prompts

    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    for name, (given, theirs) in kinds_of_image(tmp_path).items():
        _, _, vision = tokenize_image_prompts(processor, [prompt], [[given]], SamplingConfig())
        messages = prepare_multimodal_messages(copy.deepcopy(prompt), images=[theirs])
        expected = processor.apply_chat_template(
            [messages], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        torch.testing.assert_close(vision["pixel_values"][0], expected["pixel_values"], rtol=0, atol=0, msg=name)


# ---- one GRPO step against TRL 1.16 -------------------------------------------------------------------------


def trl_trainer(model, processor, dataset, tmp_path, n: int):
    """TRL 1.16's ``GRPOTrainer`` of ``model`` on ``dataset`` (a ``datasets.Dataset``), n completions a step,
    groups of 2, DAPO's loss without KL."""
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=n,
        num_generations=2,
        max_completion_length=4,
        beta=0.0,
        loss_type="dapo",
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    return GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
        args=args,
        train_dataset=dataset,
        processing_class=processor,
    )


def trl_prompt_inputs(trainer, rows: list[dict]) -> tuple[list[list[int]], dict, list[int]]:
    """What TRL 1.16's ``_generate_and_score_completions`` makes of a step's dataset ``rows`` (each prompt once per
    completion, as its sampler hands them): each row's prompt ids (``_tokenize_prompts``, what it generates from),
    its forward's vision inputs (the processor's one call on the rows' chat texts and images) and each row's image
    count (``num_images``)."""
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    images = [[row["image"]] if row["image"] is not None else None for row in rows]
    prompts = [prepare_multimodal_messages(copy.deepcopy(r["prompt"]), images=im) for r, im in zip(rows, images)]
    ids, _, _ = trainer._tokenize_prompts(prompts)
    texts = [apply_chat_template({"prompt": p}, trainer.processing_class)["prompt"] for p in prompts]
    # TRL gives a text row's images as None, which transformers 5.24's processors refuse (``only a single or a list
    # of entries is supported``); [] is the same batch
    vision = trainer.processing_class(images=[im or [] for im in images], text=texts, padding=True, return_tensors="pt")
    return [list(i) for i in ids], vision, [len(im or []) for im in images]


def trl_loss(trainer, rollout, advantages, pixel_values, num_images: list[int], **vision):
    """TRL's ``_compute_loss`` on our rollout's rows, ``advantages``, ``pixel_values``, per-row image counts and
    any other ``vision`` inputs its forward takes (``image_grid_thw``, ``mm_token_type_ids``), its gradients taken
    (``backward``): the loss returned."""
    inputs = {
        "prompt_ids": rollout.prompt_ids,
        "prompt_mask": rollout.prompt_mask,
        "completion_ids": rollout.completion_ids,
        "completion_mask": rollout.completion_mask,
        "advantages": advantages,
        "old_per_token_logps": None,
        "ref_per_token_logps": None,
        "pixel_values": pixel_values,
        "num_images": num_images,
        "num_items_in_batch": rollout.completion_mask.sum(),
        **vision,
    }
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what its training loop sets: one micro-batch, no accumulation
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()
    return theirs


def assert_same_gradients(model, theirs) -> None:
    """Every weight of ``model`` has ``theirs``'s gradient (one without a gradient has none or 0 there), to 1e-4
    of each entry and 1e-6 of the weight's largest entry (at least 1e-6), and the weights compared span the vision
    tower, the projector and the language model."""
    their_params = dict(theirs.named_parameters())
    compared = 0
    for name, param in model.named_parameters():
        other = their_params[name].grad
        if param.grad is None:
            assert other is None or other.abs().max() == 0, name
            continue
        scale = float(param.grad.abs().max())  # float32 summation order differs by a share of the largest entry
        torch.testing.assert_close(
            param.grad,
            other,
            rtol=1e-4,
            atol=max(1e-6, 1e-6 * scale),
            msg=lambda m, n=name, g=scale: f"{n} ({g:.3g}): {m}",
        )
        compared += 1
    assert compared > 30  # vision tower, projector and language model


def image_dataset(tmp_path, image) -> str:
    """A saved dataset of two colour questions with ``image`` in their ``image`` column, as a user's data holds it:
    a path as a string (what a JSON Lines file of paths loads to), anything else as ``datasets``' ``Image``
    feature (stored as PNG or, for a palette PIL image, TIFF bytes; decoded when a row is read)."""
    from datasets import Dataset, Image

    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    data = Dataset.from_list([{"prompt": prompt, "image": image, "answer": "r"}] * 2)
    if not isinstance(image, str):
        data = data.cast_column("image", Image())
    data.save_to_disk(str(tmp_path / "data"))
    return str(tmp_path / "data")


@pytest.mark.parametrize("kind", [k for k in IMAGE_KINDS if k != "png_bytes"])  # png_bytes is rgba's PNG, stored
def test_one_grpo_step_equals_trls_vlm_step_in_value_and_gradient(processor, tmp_path, kind):
    """Issue 58 item 2: one dataset of each kind of image, read by our data module and sampled by our rollout, and
    its rows as TRL's loader hands them to TRL 1.16 (its tokenization, its processor call, its ``_compute_loss``
    with ``pixel_values``): with the same completions and advantages, the same prompt ids, pixel values, loss and
    gradient on every weight."""
    from lightning_grpo.data import PromptDataModule

    policy = tiny_policy(processor, freeze_vision_tower=False)  # TRL trains the vision tower: compare them all
    theirs_model = copy.deepcopy(policy.model)
    data = PromptDataModule(image_dataset(tmp_path, kinds_of_image(tmp_path)[kind][0]), 2, val_split=None)
    data.setup("fit")
    batch = data.collate([data.train_data[0], data.train_data[1]])
    torch.manual_seed(0)
    sampling = SamplingConfig(max_completion_length=4)
    rollout = HFGenerate().generate(policy, batch.prompts, 2, sampling, False, batch.columns)
    # prompts of one length: TRL's forward counts positions from the padding, ours from the first real token
    assert bool(rollout.prompt_mask.all())
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    token = policy.train_logps(rollout, slice(0, 4))
    ours = grpo_loss(token.logps, None, advantages, rollout.completion_mask, LossConfig(beta=0.0, loss_type="dapo"))
    ours.loss.backward()

    trainer = trl_trainer(theirs_model, processor, data.train_data, tmp_path, 4)
    rows = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]  # each prompt once per completion, decoded on reading
    their_ids, their_vision, num_images = trl_prompt_inputs(trainer, rows)
    assert their_ids == rollout.prompt_ids.tolist()  # same processing
    ours_pixels = rollout.vision_inputs(slice(0, 4))["pixel_values"]
    torch.testing.assert_close(ours_pixels, their_vision["pixel_values"], rtol=0, atol=0)
    theirs = trl_loss(trainer, rollout, advantages, their_vision["pixel_values"], num_images)
    torch.testing.assert_close(ours.loss.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
    assert_same_gradients(policy.model, trainer.model)
