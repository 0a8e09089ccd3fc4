"""Decoding of ``dtype: image`` features: PNG or JPEG files stored in the data parquet.

lerobot writes such a feature as a struct column ``{bytes, path}`` (Hugging Face
``datasets.Image``) holding one encoded file per frame, and returns it as
``torchvision.transforms.ToTensor()`` of the Pillow image: ``(C, H, W)`` float32 in [0, 1].
:func:`decode_image` decodes the same bytes with the same library (Pillow, including the EXIF
orientation ``datasets`` applies) into ``(C, H, W)`` uint8, so that ``x / 255`` equals
lerobot's tensor exactly.

Untrusted bytes stay data: the image header is compared with the feature's shape in
meta/info.json before any pixel is decoded (a forged header cannot make it allocate more than
the declared size), and only the modes whose pixels are 8-bit channels are decoded (``L``,
``LA``, ``RGB``, ``RGBA``); anything else raises an error naming the file, episode and frame.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import PIL.ImageOps

from ..errors import CorruptFileError, MetadataMismatchError, UnsupportedFeatureError, describe

__all__ = ["MODES", "declared_chw", "decode_image"]

MODES = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}
"""Pillow modes decoded, with their channel counts (8 bits per channel, as ToTensor reads)."""


def declared_chw(feature: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(channels, height, width)`` of an image feature from its info.json ``shape`` and
    ``names`` (lerobot's ``(height, width, channels)`` when names do not say); None if unknown."""
    shape, names = feature.get("shape"), feature.get("names")
    if not isinstance(shape, list | tuple) or len(shape) != 3:
        return None
    if isinstance(names, list | tuple) and {"height", "width", "channels"} <= set(names):
        c, h, w = (int(shape[names.index(n)]) for n in ("channels", "height", "width"))
        return c, h, w
    return int(shape[2]), int(shape[0]), int(shape[1])


def decode_image(
    data: bytes,
    *,
    key: str,
    feature: Mapping[str, Any],
    file: Path,
    episode: int,
    frame: int,
) -> np.ndarray:
    """One stored image -> ``(C, H, W)`` uint8, the values lerobot returns times 255.

    Raises :class:`CorruptFileError` for bytes Pillow cannot decode,
    :class:`MetadataMismatchError` when the image's size or channel count is not the
    feature's declared shape, :class:`UnsupportedFeatureError` for a mode other than
    :data:`MODES`; every message names ``file``, ``episode`` and ``frame``.
    """
    where: dict[str, Any] = dict(file=file, episode=episode, frame=frame)
    want = declared_chw(feature)
    try:
        img: PIL.Image.Image = PIL.Image.open(io.BytesIO(data))
        size = (img.height, img.width)
        # before decoding (a forged header must not allocate more); an EXIF rotation may swap
        # height and width, so only the pixel count here, the exact shape after decoding
        if want is not None and size[0] * size[1] != want[1] * want[2]:
            raise MetadataMismatchError(
                describe(
                    f"Image '{key}' in a data file has another size than meta/info.json declares",
                    expected=f"height {want[1]}, width {want[2]} (shape {list(feature['shape'])})",
                    found=f"height {size[0]}, width {size[1]} ({img.format} {img.mode})",
                    **where,
                    fix=f"set the shape of '{key}' in meta/info.json to the images' size, or "
                    "rewrite the images; every frame of a feature must have one size",
                )
            )
        img.load()
        if img.getexif().get(PIL.Image.ExifTags.Base.Orientation) is not None:
            img = PIL.ImageOps.exif_transpose(img)  # as datasets.Image.decode_example does
    except (MetadataMismatchError, MemoryError):
        raise
    except Exception as exc:  # UnidentifiedImageError, OSError (truncated), SyntaxError, ...
        raise CorruptFileError(
            describe(
                f"Image '{key}' in a data file cannot be decoded",
                expected="PNG or JPEG bytes (lerobot's datasets.Image column)",
                found=f"{len(data)} bytes starting {data[:8]!r} ({type(exc).__name__}: {exc})",
                **where,
                fix="the data file is damaged; download it again, or leave this episode out "
                "with episodes=[...] (on_error='skip' skips its chunks)",
            )
        ) from exc
    channels = MODES.get(img.mode)
    if channels is None:
        raise UnsupportedFeatureError(
            describe(
                f"Image '{key}' in a data file has a pixel mode robo_resume does not decode",
                expected=f"one of the 8-bit modes {list(MODES)}",
                found=f"{img.format} image of mode {img.mode!r}",
                **where,
                fix="re-encode the images as 8-bit grayscale, RGB or RGBA, or read this dataset "
                "with lerobot's LeRobotDataset",
            )
        )
    if want is not None and (channels, img.height, img.width) != want:
        raise MetadataMismatchError(
            describe(
                f"Image '{key}' in a data file has another shape than meta/info.json declares",
                expected=f"(channels, height, width) {want} (shape {list(feature['shape'])})",
                found=f"{(channels, img.height, img.width)} ({img.format} {img.mode})",
                **where,
                fix=f"set the shape of '{key}' in meta/info.json to the images' shape, or "
                "rewrite the images in one mode",
            )
        )
    pixels = np.asarray(img, dtype=np.uint8)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))
