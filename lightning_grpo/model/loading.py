"""Names or objects -> a policy model and its tokenizer, checked for what GRPO needs."""

from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from lightning_grpo import demo
from lightning_grpo.model import gguf


def cuda_package_problems(package: str, runs: str) -> list[str]:
    """Why ``package``, which runs ``runs`` on CUDA only, cannot run here (empty when it can)."""
    problems = []
    if importlib.util.find_spec(package) is None:
        problems.append(f"the {package} package is not installed (pip install {package})")
    if not torch.cuda.is_available():
        problems.append(f"no CUDA GPU is visible ({runs} run on GPUs only)")
    return problems


DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


HUB_NAME = re.compile(r"^[\w-][\w.-]*(/[\w-][\w.-]*)?$")  # huggingface_hub's rule: "name" or "org/name"


def resolve_pretrained(name: str) -> str:
    """A Hugging Face name or local path; embedded names (``lightning-grpo/...``) are written locally first, and a GGUF
    file (``*.gguf``, ``lightning-grpo/smollm2-135m-instruct``) is converted to a local folder once (``gguf.py``). A
    name that is no existing path and cannot be a hub name is refused naming it (not ``Repo id must be in the form``).

    >>> resolve_pretrained("/no/such/model")
    Traceback (most recent call last):
    ...
    FileNotFoundError: model '/no/such/model' is neither an existing directory nor a Hugging Face hub name \
('org/name', e.g. 'Qwen/Qwen2.5-0.5B-Instruct'): check the path
    """
    resolved = gguf.resolve(demo.resolve(name))
    if Path(resolved).exists() or HUB_NAME.match(resolved):
        return resolved
    raise FileNotFoundError(
        f"model {name!r} is neither an existing directory nor a Hugging Face hub name ('org/name', e.g. "
        "'Qwen/Qwen2.5-0.5B-Instruct'): check the path"
    )


def load_policy(
    model: str | nn.Module, dtype: str = "float32", load_in_4bit: bool = False, init_kwargs: dict | None = None
) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` for a name or path; a built model is used as is.

    ``init_kwargs``: more ``from_pretrained`` arguments (TRL's ``model_init_kwargs``: ``trust_remote_code``,
    ``attn_implementation``, ``revision`` ...).

    ``load_in_4bit``: QLoRA's NF4 weights with ``dtype`` compute (bitsandbytes, CUDA), prepared for training
    an adapter on top (the 4-bit base stays frozen).
    """
    if isinstance(model, nn.Module):
        return model
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    kwargs = dict(init_kwargs or {})
    if {"dtype", "torch_dtype", "quantization_config"} & kwargs.keys():
        raise ValueError(
            f"model_init_kwargs {sorted(kwargs)} set dtype or quantization: use the dtype and load_in_4bit settings"
        )
    if not load_in_4bit:
        return auto_model_class(model).from_pretrained(resolve_pretrained(model), dtype=DTYPES[dtype], **kwargs)
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    compute = DTYPES[dtype] if dtype != "auto" else torch.bfloat16
    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )
    loaded = auto_model_class(model).from_pretrained(
        resolve_pretrained(model), quantization_config=quantization, **kwargs
    )
    return prepare_model_for_kbit_training(loaded, use_gradient_checkpointing=False)


def auto_model_class(model: str) -> type:
    """``AutoModelForImageTextToText`` for a vision-language checkpoint (its config has a vision config),
    ``AutoModelForCausalLM`` otherwise."""
    from transformers import AutoConfig

    path = resolve_pretrained(model)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):  # not readable here: from_pretrained says why, in its own words
        return AutoModelForCausalLM
    return auto_class_of(config)


def auto_class_of(config: object) -> type:
    """The auto class that builds a model of ``config``: ``AutoModelForImageTextToText`` for a vision-language
    config, else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForImageTextToText

    from lightning_grpo.model.vision import is_multimodal_config

    return AutoModelForImageTextToText if is_multimodal_config(config) else AutoModelForCausalLM


def empty_init_files(model: str | nn.Module, load_in_4bit: bool) -> list:
    """The checkpoint files to load the weights from later when the policy is being built on the meta device
    (``torch.device("meta")``, as Lightning's ``trainer.init_module(empty_init=True)`` sets it under FSDP2), so
    that each rank reads only its shard; empty otherwise (and for a built model, which has its weights)."""
    if torch.empty(0).device.type != "meta" or not isinstance(model, str):
        return []
    if load_in_4bit:
        raise ValueError(
            "load_in_4bit=True with meta-device initialisation (trainer.init_module(empty_init=True)): bitsandbytes "
            "quantises while loading; build the module outside init_module"
        )
    from lightning_grpo.model.materialize import weight_files

    return weight_files(resolve_pretrained(model))


def load_tokenizer(tokenizer: str | PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left-padding tokenizer with a pad token (EOS stands in for a missing one, as in TRL)."""
    if isinstance(tokenizer, str):
        tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained(tokenizer))
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no eos_token: completions could never end. "
            "Set tokenizer.eos_token before training"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def with_lora(
    model: nn.Module, peft_config: dict, exclude: str | None = None, full: list[str] | None = None
) -> nn.Module:
    """The model wrapped with a LoRA adapter from ``peft.LoraConfig(**peft_config)``; base weights frozen.
    ``exclude``: a pattern of modules that get no adapter (PEFT's ``exclude_modules``) unless the config sets one;
    ``full``: modules trained in full, added to the config's ``modules_to_save``."""
    from peft import LoraConfig, get_peft_model

    extra = {"exclude_modules": exclude} if exclude and "exclude_modules" not in peft_config else {}
    if full:
        extra["modules_to_save"] = list(dict.fromkeys([*(peft_config.get("modules_to_save") or []), *full]))
    try:
        config = LoraConfig(task_type="CAUSAL_LM", **{**peft_config, **extra})
    except TypeError as err:
        raise ValueError(f"peft_config {peft_config!r} is not valid for peft.LoraConfig: {err}") from err
    return get_peft_model(model, config)


def disable_dropout(model: nn.Module) -> None:
    """Every ``nn.Dropout`` to p = 0, as TRL's ``disable_dropout_in_model``; also attention dropout, which
    Hugging Face attention layers keep as a float attribute (``attention_dropout``) rather than a module."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def merged_lora(sharded: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    """An unsharded LoRA model built on the meta device, given ``state`` (the gathered weights, no second copy),
    then merged: base + adapter as plain weights. The base is built by the auto class of its config (a
    vision-language model's ``AutoModelForImageTextToText``: ``AutoModelForCausalLM`` refuses a LLaVA config)."""
    from peft import get_peft_model

    config = copy.deepcopy(sharded.get_base_model().config)
    with torch.device("meta"):
        base = auto_class_of(config).from_config(config)
        model = get_peft_model(base, sharded.peft_config[sharded.active_adapter])
    model.load_state_dict(state, assign=True)
    base.tie_weights()  # assign=True loaded a tied embedding and LM head as two tensors (PEFT would untie them)
    return model.merge_and_unload()


def frozen_copy(model: nn.Module) -> nn.Module:
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    return reference


def checkpointing(model: nn.Module, enable: bool | None = None) -> bool:
    """Whether activation checkpointing is on; ``enable`` switches it. transformers 5 renamed the methods
    (``activation_checkpointing_*``) and warns on the old names, which older versions only have."""
    new = hasattr(model, "activation_checkpointing_enable")
    if enable is True:
        kwargs = {"use_reentrant": False}
        if new:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif enable is False:
        (model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable)()
    return bool(getattr(model, "is_activation_checkpointing" if new else "is_gradient_checkpointing", False))
