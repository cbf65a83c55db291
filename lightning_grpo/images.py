"""Image columns -> the images of each row, opened lazily, and their problems found before any compute.

TRL's convention: a dataset's ``image`` column holds one image a row, its ``images`` column a list of them; an
image is a PIL image, a file path, raw bytes, or the ``{"bytes", "path"}`` dict ``datasets`` stores undecoded. A
chat prompt marks where each image goes with a ``{"type": "image"}`` content part; a prompt without such parts
gets them in front of its first user message (TRL's ``prepare_multimodal_messages``; the rollout stage applies it).
Knows files and PIL; nothing about models or processors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset
    from PIL.Image import Image

IMAGE_COLUMNS = ("image", "images")  # TRL's names: one image a row, or a list of them
IMAGE_TYPES = "a PIL image, a file path, bytes, or a {'bytes', 'path'} dict (or a list of those for 'images')"


def image_column(columns: list[str] | dict[str, Any]) -> str | None:
    """The column holding the rows' images (``image`` or ``images``), or ``None``; both is ambiguous."""
    found = [c for c in IMAGE_COLUMNS if c in columns]
    if len(found) > 1:
        raise ValueError(
            f"the dataset has both an 'image' and an 'images' column: keep one (TRL reads either): {found}"
        )
    return found[0] if found else None


def row_images(value: Any) -> list[Any]:
    """A row's image value as a list: ``None`` -> none, one image -> [it], a list as it is."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def open_image(value: Any) -> Image:
    """One image of ``IMAGE_TYPES`` as TRL and transformers open it, so that the processor gets what it gets under
    TRL: a PIL image unchanged (the processor's own RGB conversion puts transparent pixels on white), a path through
    transformers' ``load_image`` (its EXIF rotation applied, RGB), bytes as ``datasets`` decodes an ``Image`` column
    (its EXIF rotation applied, its mode kept). Opening a path or bytes reads them now."""
    from PIL import Image as PILImage

    if isinstance(value, PILImage.Image):
        return value
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        from datasets import Image as ImageFeature

        return ImageFeature().decode_example({"bytes": bytes(value), "path": None})
    if isinstance(value, (str, Path)):
        if not Path(value).is_file():  # load_image would read any other string as base64
            raise FileNotFoundError(f"no image file at {str(value)!r}")
        from transformers.image_utils import load_image

        return load_image(str(value))
    raise TypeError(f"an image must be {IMAGE_TYPES}, got {type(value).__name__}")


def image_problem(value: Any) -> str | None:
    """Why ``value`` is not an image that opens (a missing file, bytes PIL cannot decode), or ``None``.

    >>> image_problem("/no/such.png")
    "is a path to a missing file: '/no/such.png'"
    >>> image_problem(b"not a png")
    'does not decode as an image (9 bytes): cannot identify image file'
    """
    path = value.get("path") if isinstance(value, dict) and not value.get("bytes") else value
    if isinstance(path, (str, Path)) and not Path(path).is_file():
        return f"is a path to a missing file: {str(path)!r}"
    try:
        open_image(value)
    except TypeError as err:
        return str(err)
    except Exception as err:  # PIL raises UnidentifiedImageError, OSError or ValueError for bad data
        size = f" ({len(value)} bytes)" if isinstance(value, (bytes, bytearray)) else ""
        return f"does not decode as an image{size}: {str(err).split(' <')[0]}"
    return None


def image_problems(data: Dataset, column: str, prompt_column: str) -> list[str]:
    """``row i: ...`` for each image of a loaded split that does not open, and each chat prompt whose
    ``{"type": "image"}`` parts are not one per image of its row. The images are read undecoded (``datasets``'
    ``Image(decode=False)``): a bad one is named with its row here, not when its batch is drawn."""
    from datasets import Image as ImageFeature
    from datasets import Sequence

    feature = data.features[column]
    if isinstance(feature, ImageFeature):
        data = data.cast_column(column, ImageFeature(decode=False))
    elif isinstance(feature, Sequence) and isinstance(feature.feature, ImageFeature):
        data = data.cast_column(column, Sequence(ImageFeature(decode=False)))
    elif isinstance(feature, list) and feature and isinstance(feature[0], ImageFeature):
        data = data.cast_column(column, [ImageFeature(decode=False)])
    problems = []
    for i, row in enumerate(data.select_columns([column, prompt_column])):
        images = row_images(row[column])
        problems += [f"row {i}: {column}[{j}] {p}" for j, image in enumerate(images) if (p := image_problem(image))]
        parts = count_image_parts(row[prompt_column])
        if parts and parts != len(images):
            problems.append(
                f"row {i}: its prompt has {parts} {{'type': 'image'}} parts but the row has {len(images)} images in "
                f"{column!r}: one part per image, or none (the images then go before the first user message)"
            )
    return problems


def count_image_parts(prompt: Any) -> int:
    """``{"type": "image"}`` content parts of a chat prompt (0 for plain text)."""
    if not isinstance(prompt, list):
        return 0
    return sum(
        1
        for message in prompt
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    )


def column_images(columns: dict[str, list[Any]] | None) -> list[list[Any]] | None:
    """[B] each prompt's images from a batch's columns, as they are stored (opened later); ``None``: no image column."""
    column = image_column(columns or {})
    return None if column is None else [row_images(value) for value in columns[column]]
