"""What an item holds: :class:`ItemOptions` (image dtype, transforms, windows) and the
``delta_timestamps`` window arithmetic (:func:`delta_indices`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import DatasetFormatError, describe
from ..format.metadata import DatasetMeta

IMAGE_DTYPES = ("float32", "uint8")
IDLE_DECODERS = 16
"""Open decoders an :class:`ItemBuilder` keeps for reuse (an idle decoder holds a megabyte or two).

Opening an mp4 costs milliseconds (the h264 container open decodes to find the stream's
parameters); with the default tuning, 16 idle decoders avoid most reopens for little memory."""


@dataclass(frozen=True)
class ItemOptions:
    """How items are built.

    Attributes:
        delta_timestamps: per feature key, offsets in seconds (multiples of 1/fps), as in lerobot.
        image_dtype: "float32" (lerobot's [0, 1] floats) or "uint8" (4x less memory to move
            between processes; convert with ``x.float() / 255`` later). It applies to every
            camera, video and ``dtype: image`` features alike (lerobot's ``return_uint8`` applies
            to video only and returns image features as float32; ``x.float() / 255`` of ours
            equals those exactly).
        image_transforms: callable applied to each camera tensor of an item (video and image
            features), as in lerobot; it receives uint8 tensors when ``image_dtype="uint8"``.
        tolerance_s: how far a decoded frame's time may be from the wanted time (lerobot: 1e-4).
        decoder_threads: FFmpeg threads per video decoder (0 = FFmpeg's choice; default 1,
            see :class:`~robo_resume.dataset.StreamTuning`).
    """

    delta_timestamps: Mapping[str, Sequence[float]] | None = None
    image_dtype: str = "float32"
    image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = field(
        default=None, compare=False
    )
    tolerance_s: float = 1e-4
    decoder_threads: int = 1

    def __post_init__(self) -> None:
        if self.image_dtype not in IMAGE_DTYPES:
            raise ValueError(
                describe(
                    "Unknown image_dtype",
                    expected=" or ".join(repr(d) for d in IMAGE_DTYPES),
                    found=repr(self.image_dtype),
                )
            )
        if self.tolerance_s <= 0:
            raise ValueError(describe("tolerance_s must be positive", found=self.tolerance_s))


def delta_indices(
    delta_timestamps: Mapping[str, Sequence[float]] | None, meta: DatasetMeta, tolerance_s: float
) -> dict[str, np.ndarray] | None:
    """Validate ``delta_timestamps`` against the dataset and convert them to frame offsets."""
    if not delta_timestamps:
        return None
    fps = meta.fps
    out = {}
    for key, deltas in delta_timestamps.items():
        if key not in meta.features:
            raise DatasetFormatError(
                describe(
                    f"delta_timestamps names an unknown feature '{key}'",
                    expected=f"one of {list(meta.features)}",
                    found=repr(key),
                    file=meta.root / "meta" / "info.json",
                    fix="use the dataset's feature names (e.g. 'actions' instead of 'action')",
                )
            )
        kind = "language" if key in meta.language_keys else meta.features[key].get("dtype")
        if kind in ("string", "language"):
            what = "its string" if kind == "string" else "its list of messages"
            raise ValueError(
                describe(
                    f"delta_timestamps names the {kind} feature '{key}'",
                    expected="numeric, video or image features (windows are stacked tensors)",
                    found=f"'{key}' of dtype '{kind}' (lerobot's LeRobotDataset fails on it too, "
                    "with a TypeError from torch.stack)",
                    file=meta.root / "meta" / "info.json",
                    fix=f"leave '{key}' out of delta_timestamps; items still hold {what}",
                )
            )
        deltas = [float(d) for d in deltas]
        if not deltas:
            raise ValueError(describe(f"delta_timestamps['{key}'] is empty", expected="offsets"))
        bad = [d for d in deltas if abs(d * fps - round(d * fps)) / fps > tolerance_s]
        if bad:
            raise ValueError(
                describe(
                    f"delta_timestamps['{key}'] are not multiples of 1/fps",
                    expected=f"multiples of 1/{fps} s (within {tolerance_s} s)",
                    found=bad,
                    fix=f"use offsets like k/{fps} for integer k",
                )
            )
        out[key] = np.asarray([round(d * fps) for d in deltas], dtype=np.int64)
    return out
