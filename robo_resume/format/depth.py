"""Depth maps stored as video: 12-bit codes decoded and dequantised as lerobot 0.6 does.

lerobot 0.6 records a depth camera (a ``video`` feature whose ``info`` says ``is_depth_map``,
see :func:`~robo_resume.format.features.is_depth_map`) as HEVC ``gray12le`` video: every pixel a
12-bit code (0 to 4095) of the depth, quantised with the ``video.depth_min``,
``video.depth_max``, ``video.shift`` and ``video.use_log`` of the feature's ``info``. Its
``LeRobotDataset`` decodes the codes with PyAV (``frame.to_ndarray(format="gray12le")``) and
dequantises them with ``depth_utils.dequantize_depth`` into ``(1, H, W)`` float32 millimetres
(its default ``depth_output_unit``), whatever ``return_uint8`` says, and leaves depth maps out of
``image_transforms``.

:class:`DepthCodec` does the same with a table: a code's depth depends on the code alone, so the
4096 values are computed once, with lerobot's torch operations in lerobot's order (float32
throughout), and every frame is a lookup (``np.take``) straight into its place in the batch.
The values equal lerobot's item for item (tests/test_depth.py compares them exactly).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import DatasetFormatError, describe
from .features import is_depth_map
from .frame_store import StoredFrame

if TYPE_CHECKING:
    from .meta_types import DatasetMeta

__all__ = ["DEPTH_CODES", "DepthCodec", "depth_codecs"]

DEPTH_CODES = 4096
"""Codes of lerobot's 12-bit depth quantiser (``lerobot.configs.video.DEPTH_QMAX`` + 1)."""

_QMAX = DEPTH_CODES - 1
_MM_PER_METRE = 1000.0
_UINT16_MAX = 65535
_DEFAULTS = {"depth_min": 0.01, "depth_max": 10.0, "shift": 3.5, "use_log": True}
"""lerobot 0.6's ``DepthEncoderConfig`` defaults, used where ``info`` lacks a value (as it does)."""
_NATIVE = "gray12le"  # what lerobot's HEVC depth decodes to: its plane holds the codes as is


@dataclass(frozen=True)
class DepthCodec:
    """The dequantisation of one depth camera: 12-bit codes to float32 millimetres.

    Attributes:
        depth_min: depth (metres) of code 0.
        depth_max: depth (metres) of code 4095.
        shift: offset (metres) added before the logarithm (log quantisation only).
        use_log: codes are spaced in ``log(depth + shift)`` (lerobot's default) or linearly.

    Values are lerobot 0.6.1's ``dequantize_depth(..., output_unit="mm")`` of a torch tensor of
    codes: ``(1, H, W)`` float32 millimetres, whole numbers in ``[1000 * depth_min,
    1000 * depth_max]``. Picklable; the table is computed once per process and parameters.
    """

    depth_min: float = _DEFAULTS["depth_min"]
    depth_max: float = _DEFAULTS["depth_max"]
    shift: float = _DEFAULTS["shift"]
    use_log: bool = True

    @classmethod
    def from_feature(cls, key: str, feature: Mapping[str, Any], info_path: Path) -> DepthCodec:
        """The codec a depth feature's ``info`` describes (lerobot's defaults where it is silent).

        Args:
            key: the feature's key (for the error message).
            feature: the feature's entry in info.json.
            info_path: meta/info.json (for the error message).

        Returns:
            The feature's :class:`DepthCodec`.

        Raises:
            DatasetFormatError: a parameter is not a finite number (``use_log``: not a bool), or
                ``use_log`` with ``depth_min + shift <= 0`` (the logarithm is undefined there).
        """
        info = feature.get("info") or {}
        values: dict[str, Any] = {}
        for name, default in _DEFAULTS.items():
            value = info.get(f"video.{name}") if isinstance(info, Mapping) else None
            value = default if value is None else value
            ok = (
                isinstance(value, bool)
                if name == "use_log"
                else isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            )
            if not ok:
                raise DatasetFormatError(
                    describe(
                        f"The depth feature '{key}' has an invalid video.{name}",
                        expected="true or false" if name == "use_log" else "a finite number",
                        found=repr(value),
                        file=info_path,
                        fix=f"set features['{key}'].info['video.{name}'] in meta/info.json to "
                        "the value the videos were quantised with (lerobot's default is "
                        f"{str(default).lower() if name == 'use_log' else default})",
                    )
                )
            values[name] = value if name == "use_log" else float(value)
        codec = cls(**values)
        if codec.use_log and codec.depth_min + codec.shift <= 0:
            raise DatasetFormatError(
                describe(
                    f"The depth feature '{key}' has a log quantisation without a logarithm",
                    expected="video.depth_min + video.shift > 0 (codes are spaced in "
                    "log(depth + shift))",
                    found=f"depth_min={codec.depth_min} + shift={codec.shift}",
                    file=info_path,
                    fix=f"set features['{key}'].info's video.depth_min and video.shift in "
                    "meta/info.json to the values the videos were quantised with",
                )
            )
        return codec

    @property
    def table(self) -> np.ndarray:
        """float32 ``(4096,)``, read-only: the depth (millimetres) of each code."""
        return _table(self.depth_min, self.depth_max, self.shift, self.use_log)

    def write(self, frame: Any, out: np.ndarray) -> None:
        """Write ``frame``'s depth into ``out`` (float32 ``(H, W)``, any strides).

        ``frame``: a decoded ``av.VideoFrame`` (converted with ``to_ndarray(format="gray12le")``
        as lerobot does, unless it is ``gray12le`` already: its plane is the codes) or a
        :class:`~robo_resume.format.frame_store.StoredFrame` of a ``gray12le`` frame. Codes above
        4095 (none in 12 bits) take code 4095's depth, which is lerobot's clamp to ``depth_max``.
        """
        np.take(self.table, codes(frame), out=out, mode="clip")

    def frames(self, frames: Sequence[Any]) -> np.ndarray:
        """The depth of each of ``frames`` as one new float32 ``(n, 1, H, W)`` array."""
        if not frames:
            return np.zeros((0, 1, 0, 0), dtype=np.float32)
        out = np.empty((len(frames), 1, frames[0].height, frames[0].width), dtype=np.float32)
        for i, frame in enumerate(frames):
            self.write(frame, out[i, 0])
        return out


def codes(frame: Any) -> np.ndarray:
    """A frame's 12-bit codes, ``(H, W)`` uint16: a view of its plane when it is ``gray12le``
    (valid while the frame or its store slot is), else lerobot's
    ``frame.to_ndarray(format="gray12le")``."""
    h, w = frame.height, frame.width
    if frame.format.name != _NATIVE:
        return frame.to_ndarray(format=_NATIVE)
    plane = frame.planes[0]
    per_row = plane.line_size // 2
    if isinstance(frame, StoredFrame):  # a slot: an address, not a buffer
        buf = (ctypes.c_uint16 * (per_row * h)).from_address(plane.buffer_ptr)
        return np.frombuffer(buf, np.uint16).reshape(h, per_row)[:, :w]
    return np.frombuffer(plane, np.uint16).reshape(-1, per_row)[:h, :w]


@functools.lru_cache(maxsize=64)
def _table(depth_min: float, depth_max: float, shift: float, use_log: bool) -> np.ndarray:
    """Each code's depth in millimetres: lerobot 0.6.1's ``dequantize_depth`` torch path (its
    operations, in its order, in float32) applied to the codes 0..4095."""
    if use_log:
        log_min = math.log(depth_min + shift)
        log_max = math.log(depth_max + shift)
        scale, offset = (log_max - log_min) / _QMAX, log_min
    else:
        scale, offset = (depth_max - depth_min) / _QMAX, depth_min
    codes_ = torch.from_numpy(np.arange(DEPTH_CODES, dtype=np.uint16))
    buf = codes_.to(dtype=torch.float32, copy=True)
    buf.mul_(scale).add_(offset)
    if use_log:
        buf.exp_().sub_(shift)
    buf.clamp_(depth_min, depth_max)
    buf.mul_(_MM_PER_METRE).round_().clamp_(0.0, _UINT16_MAX)
    table = buf.numpy()
    table.flags.writeable = False
    return table


def depth_codecs(meta: DatasetMeta) -> dict[str, DepthCodec]:
    """``{camera: DepthCodec}`` for the depth video features of ``meta`` (a
    :class:`~robo_resume.format.metadata.DatasetMeta`); raises what :meth:`DepthCodec.
    from_feature` raises."""
    info_path = meta.root / "meta" / "info.json"
    return {
        key: DepthCodec.from_feature(key, meta.features[key], info_path)
        for key in meta.camera_keys
        if is_depth_map(meta.features[key])
    }
