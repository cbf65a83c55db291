"""A vision-language model's parts: whether a model is one, its processor, its vision tower (frozen by default),
the LoRA exclusions that keep an adapter on the language model, and the forward that takes images.

Knows transformers' image-text-to-text models (``AutoModelForImageTextToText``: LLaVA-style, Qwen2/2.5/3-VL,
Gemma 3, SmolVLM ...): each holds its multimodal body at ``.model`` (vision tower, projector, language model),
whose forward takes ``input_ids`` with the processor's image tokens and the vision inputs (``pixel_values``,
``image_grid_thw`` ...) and returns the language model's hidden states. Nothing about rewards or rollouts.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import torch
from torch import Tensor, nn

from lightning_grpo.model.loading import resolve_pretrained

VISION_TOWERS = ("vision_tower", "visual", "vision_model")  # LLaVA / Gemma 3, Qwen-VL, SmolVLM / Idefics3
PROJECTORS = ("multi_modal_projector", "connector")  # LLaVA / Gemma 3, SmolVLM (Qwen-VL's merger is in .visual)


def is_multimodal_config(config: Any) -> bool:
    """Whether a model config is an image-text-to-text model's (a vision config beside its text config)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    return model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and hasattr(config, "vision_config")


def is_multimodal(model: nn.Module) -> bool:
    return is_multimodal_config(getattr(model, "config", None))


def load_processor(source: Any) -> Any:
    """The model's processor (``AutoProcessor``: image processor, tokenizer, chat template), or the one given."""
    if not isinstance(source, str):
        return source
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(source)


def is_processor(value: Any) -> bool:
    from transformers import ProcessorMixin

    return isinstance(value, ProcessorMixin)


def vision_towers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the model's vision encoder(s): the modules named like ``VISION_TOWERS``, outermost."""
    found = [(n, m) for n, m in model.named_modules() if n.split(".")[-1] in VISION_TOWERS]
    return [(n, m) for n, m in found if not any(n.startswith(other + ".") for other, _ in found)]


def freeze_vision_tower(model: nn.Module) -> int:
    """Turn off the gradient of the vision encoder's weights (the projector and language model still train);
    the number of weights frozen. A model without a recognised tower is refused: freezing nothing silently
    would train what the user meant to keep."""
    towers = vision_towers(model)
    if not towers:
        raise ValueError(
            f"policy.freeze_vision_tower=True but {type(model).__name__} has no module named one of {VISION_TOWERS}: "
            "set policy.freeze_vision_tower=false (and freeze what you need in code)"
        )
    frozen = 0
    for _, tower in towers:
        for param in tower.parameters():
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def projectors(model: nn.Module) -> list[str]:
    """Names of the modules that map vision features into the language model (``PROJECTORS``)."""
    return [n for n, _ in model.named_modules() if n.split(".")[-1] in PROJECTORS]


def lora_layout(model: nn.Module, lora_vision_tower: bool, freeze_vision_tower: bool) -> tuple[str, list[str]]:
    """(PEFT ``exclude_modules``, ``modules_to_save``) for a LoRA adapter on a vision-language model, so that under LoRA
    what trains is what trains without it. The projector is trained in full (``modules_to_save``, LLaVA's own LoRA
    recipe: a new module, small, with no pretrained weights worth keeping low-rank) and gets no adapter. The vision
    tower gets adapters with ``lora_vision_tower``; else with ``freeze_vision_tower=False`` it trains in full
    (``modules_to_save``); else it is left out. PEFT's adapter-off view (the reference) keeps the original copies.

    >>> from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config
    >>> tiny = LlavaForConditionalGeneration(LlavaConfig(
    ...     vision_config=CLIPVisionConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1,
    ...                                    num_attention_heads=1, image_size=28, patch_size=14),
    ...     text_config=Qwen2Config(vocab_size=32, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
    ...                             num_attention_heads=1, num_key_value_heads=1)))
    >>> lora_layout(tiny, lora_vision_tower=False, freeze_vision_tower=True)
    ('^(model\\\\.multi_modal_projector|model\\\\.vision_tower)(\\\\..*)?$', ['model.multi_modal_projector'])
    >>> lora_layout(tiny, lora_vision_tower=False, freeze_vision_tower=False)[1]
    ['model.multi_modal_projector', 'model.vision_tower']
    """
    towers, projected = [n for n, _ in vision_towers(model)], projectors(model)
    excluded = projected + ([] if lora_vision_tower else towers)
    full = projected + ([] if lora_vision_tower or freeze_vision_tower else towers)
    return "^(" + "|".join(re.escape(n) for n in excluded) + r")(\..*)?$", full


def multimodal_body(model: nn.Module) -> nn.Module:
    """The model whose forward takes ids and images and returns hidden states (``.model`` of the task model,
    under a PEFT wrapper too: the adapter's layers are inside it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def multimodal_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, vision: dict[str, Tensor]) -> Tensor:
    """[n, L, H] the language model's last hidden states for ids with image tokens and their ``vision`` inputs.

    Positions count real tokens from 0 in each left-padded row, as ``generate`` gives them, for models with
    one position a token; multimodal-RoPE models (Qwen-VL: ``get_rope_index``) compute their own from the ids,
    the images and the mask."""
    from lightning_grpo.model.padding import position_ids_from_mask

    body = multimodal_body(model)
    positions = None if hasattr(body, "get_rope_index") else position_ids_from_mask(attention_mask)
    outputs = body(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=False,
        **vision,
        **modality_inputs(body, input_ids),
    )
    if vision or not torch.is_grad_enabled():
        return outputs.last_hidden_state
    return outputs.last_hidden_state + 0.0 * unused_vision(body)


def unused_vision(body: nn.Module) -> Tensor:
    """The sum of the trainable vision tower and projector weights, for rows without images to add times 0: their
    gradient is then 0, not missing. DDP (``find_unused_parameters=False``, Lightning's default) waits for a
    gradient of every trainable weight on every rank: a rank whose micro-batch had no image would stall the
    others' all-reduce."""
    names = [n for n, _ in vision_towers(body)] + projectors(body)
    weights = [p for n in names for p in body.get_submodule(n).parameters() if p.requires_grad]
    return sum((p.sum() for p in weights), torch.zeros((), device=body.device))


# Config fields naming the tokens a processor writes for images (and videos): never the model's to sample, since a
# completion holding one has no image to fill it and the next forward fails ("Image features and image tokens do
# not match").
VISION_TOKEN_FIELDS = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "video_token_index",
    "vision_start_token_id",
    "vision_end_token_id",
    "boi_token_index",
    "eoi_token_index",
)


# Per-token fields a processor returns beside ``input_ids`` that mark each token's modality, and the models whose
# forward reads them: ``mm_token_type_ids`` (Qwen2/2.5/3-VL, GLM-4V: M-RoPE positions) wherever a forward takes it;
# ``token_type_ids`` (Gemma 3: attention among one image's tokens is bidirectional) for the model types named here
# only, since other forwards give the name another meaning (PaliGemma's prefix and suffix).
MODALITY_FIELD = "mm_token_type_ids"
TOKEN_TYPE_MODELS = ("gemma3",)


def token_types_problem(model_type: str | None) -> str | None:
    """Why a model of ``model_type`` whose forward reads ``token_type_ids`` cannot be trained (``None``: it can)."""
    if model_type in TOKEN_TYPE_MODELS:
        return None
    return (
        f"model type {model_type!r} reads per-token 'token_type_ids': only {', '.join(TOKEN_TYPE_MODELS)} (Gemma 3's "
        "image-token mask, rebuilt from the ids at every forward) is supported; PaliGemma's prefix and suffix types "
        "and Gemma 3n's are not"
    )


def modality_problem(model: nn.Module) -> str | None:
    """Why ``model``'s per-token modality input cannot be rebuilt from the ids (``None``: it can, or it reads none):
    asked when the model is loaded, before a processor or a prompt is."""
    if "token_type_ids" not in inspect.signature(type(model).forward).parameters:
        return None
    return token_types_problem(getattr(model.config, "model_type", None))


def modality_ids(input_ids: Tensor, config: Any) -> Tensor:
    """[n, L] 1 on ``config``'s image tokens, 2 on its video tokens, 0 elsewhere: transformers' rule for
    ``mm_token_type_ids`` (``ProcessorMixin.create_mm_token_type_ids``; Gemma 3's ``token_type_ids`` is the same),
    from the ids themselves."""
    types = torch.zeros_like(input_ids)
    for kind, fields in ((1, ("image_token_id", "image_token_index")), (2, ("video_token_id", "video_token_index"))):
        for token in {getattr(config, field, None) for field in fields} - {None}:
            types = types.masked_fill(input_ids == token, kind)
    return types


def modality_field(model: nn.Module) -> str | None:
    """The per-token modality field ``model``'s forward reads (a multimodal body, ``multimodal_body``), if any."""
    return _modality_field(type(model), getattr(model.config, "model_type", None))


@functools.cache  # asked at every generate and log-prob forward; a class's forward signature never changes
def _modality_field(model_class: type, model_type: str | None) -> str | None:
    takes = inspect.signature(model_class.forward).parameters
    if MODALITY_FIELD in takes:
        return MODALITY_FIELD
    if "token_type_ids" in takes and model_type in TOKEN_TYPE_MODELS:
        return "token_type_ids"
    return None


def modality_inputs(model: nn.Module, input_ids: Tensor) -> dict[str, Tensor]:
    """``{field: modality_ids(...)}`` for a model whose forward reads a modality field (``modality_field``), else
    nothing. Computed from the ids of each call, it lines up with whatever the call holds (prompt columns trimmed,
    completions after the prompt: never an image token, so 0 there, as TRL pads them)."""
    field = modality_field(model)
    return {field: modality_ids(input_ids, model.config)} if field else {}


def vision_token_ids(config: Any) -> list[int]:
    """The ids of a vision-language config's image and video tokens (``VISION_TOKEN_FIELDS`` that it sets)."""
    ids = {getattr(config, name, None) for name in VISION_TOKEN_FIELDS}
    return sorted(i for i in ids if isinstance(i, int))


def policy_processor(source: Any) -> Any:
    """The processor of a vision-language model, or a clear refusal where there is none to build it from."""
    if not isinstance(source, str) and not is_processor(source):
        raise ValueError(
            "a built vision-language model needs its processor: give it as policy.tokenizer (PolicyConfig("
            f"tokenizer=processor)), got {type(source).__name__}"
        )
    return load_processor(resolve_pretrained(source) if isinstance(source, str) else source)


def check_multimodal(config: Any, has_teacher: bool) -> None:
    """What a vision-language policy cannot do yet (``config``: its ``PolicyConfig``), refused before anything runs,
    naming the setting."""
    refused = [
        (config.share_prompt_prefix, "policy.share_prompt_prefix=True: the shared-prompt forward takes no images"),
        (config.padding_free, "policy.padding_free=True: the packed forward takes no images"),
        (has_teacher, "distill.teacher: the teacher's forward takes no images"),
    ]
    problems = [message for bad, message in refused if bad]
    if problems:
        raise ValueError(
            f"a vision-language policy cannot run with {'; '.join(problems)}. Leave them unset (references/vision.md)"
        )
