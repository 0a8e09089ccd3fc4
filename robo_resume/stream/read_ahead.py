"""Read-ahead: a stream's frames decoded ahead of its batches, when batches visit many chunks.

With a large ``StreamTuning.interleave`` a batch takes about one frame from each open chunk;
decoding a few frames per visit and keeping the rest (as decoded, unconverted frames) for the
chunk's next visits saves visits. :func:`frames_ahead` is the policy (how many frames a read
decodes), :func:`take_ahead` serves a read from what was kept, and :func:`held_bytes` what a
kept frame costs. Batches are the same with and without read-ahead (tests/test_read_ahead.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..format.rgb import planar_rgb, planar_rgb_rows
from ..items.windows import HeldWindows
from .tuning import StreamTuning

__all__ = [
    "READ_AHEAD_BYTES",
    "READ_AHEAD_MAX_FRAME",
    "frames_ahead",
    "held_bytes",
    "take_ahead",
]

READ_AHEAD_BYTES = 256 << 20
"""Decoded frames a stream may hold ahead of its batches, counted as :func:`held_bytes`
(1.5 bytes per pixel for a camera without a window): with 128 open chunks, 4 frames ahead of
open50's 480x640 frames, 16 (``block_frames``) of 96x96 ones. See :func:`frames_ahead`."""

READ_AHEAD_MAX_FRAME = 1 << 20
"""Largest frame (bytes held, :func:`held_bytes`, all cameras) read ahead. Frames are
kept as decoded (YUV, referenced, not copied) and converted straight into the batch when read,
so read-ahead costs no extra copy. The limit is the largest frame size at which read-ahead
was measured to pay; larger frames are read without it."""


_DEFAULT_INTERLEAVE = StreamTuning().interleave  # no read-ahead up to this many open segments


def take_ahead(reader, held, frames: range, stop: int, dest=None):
    """Columns of ``frames`` of a segment, and what is left decoded ahead ``(n, columns)``.

    ``held`` (or None): frames decoded earlier from ``frames.start`` on (see
    :meth:`~robo_resume.items.ranges.EpisodeRangeReader.ahead`: cameras without a delta window
    as decoded, unconverted frames); the rest is read with ``reader.raw`` (into ``dest`` like
    ``reader.raw(frames, dest)``: ``{camera: (buffer, rows)}``, one row per frame of
    ``frames``), then the frames up to ``stop`` (>= ``frames.stop``) are decoded and kept (fewer
    where ``ahead`` stops early). Values are the same as one ``reader.raw(frames, dest)``; each
    kept frame is converted straight into its place in ``dest``.
    """
    start, count, pieces = frames.start, len(frames), []
    if held is not None:
        n, cols = held
        m = min(n, count)
        piece: dict[str, Any] = {}
        rest: dict[str, Any] | None = {} if n > m else None
        for k, v in cols.items():  # one pass: a visit takes about one frame of many columns
            d = dest.get(k) if dest else None
            if d is not None:
                _put(v[:m], d[0], d[1][:m])
            else:
                piece[k] = _rgb(v[:m]) if type(v) is list or type(v) is HeldWindows else v[:m]
            if rest is not None:
                rest[k] = v[m:]
        pieces.append(piece)
        held = (n - m, rest) if rest is not None else None
        if dest:
            dest = {cam: (buf, rows[m:]) for cam, (buf, rows) in dest.items()}
        start, count = start + m, count - m
    if count:
        pieces.append(reader.raw(range(start, start + count), dest))
        if stop > start + count:
            n, cols = reader.ahead(range(start + count, stop))
            held = (n, cols) if n else None
    if len(pieces) == 1:
        return pieces[0], held
    return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}, held


def _put(frames, buf: np.ndarray, rows: np.ndarray) -> None:
    """Write a camera's kept frames (decoded frames, or :class:`HeldWindows`) into
    ``buf[rows]``."""
    if isinstance(frames, list):
        planar_rgb_rows(frames, buf, rows.tolist())
    elif isinstance(frames, HeldWindows):
        frames.put(buf, rows)
    else:
        buf[rows] = frames


def _rgb(frames):
    """A kept column as numpy: decoded frames converted to RGB ``(n, 3, H, W)``, windows
    materialised."""
    if isinstance(frames, HeldWindows):
        return frames.array()
    if not isinstance(frames, list):
        return frames
    out = np.empty((len(frames), 3, frames[0].height, frames[0].width), dtype=np.uint8)
    for i, frame in enumerate(frames):
        planar_rgb(frame, out[i])
    return out


def frames_ahead(
    open_segments: int, *, batch_size: int, skip: bool, frame_bytes: int, block_frames: int
) -> int:
    """Frames decoded per read of a segment when a block wants fewer (1: no read-ahead).

    With at least as many open segments as a batch has frames (a large
    ``StreamTuning.interleave``), a batch takes about one frame from each: decoding a few
    frames per visit and keeping the rest for the segment's next frames saves visits, within
    :data:`READ_AHEAD_BYTES` per stream (``frame_bytes`` per frame kept, see
    :func:`held_bytes`) and at most ``block_frames``. Off up to the default interleave's number
    of open segments (4), whatever the batch size: the default reads as without read-ahead.
    Off for frames (all cameras) above :data:`READ_AHEAD_MAX_FRAME` (not measured there). Off
    with ``skip`` (``on_error="skip"``: skips are recorded per read; read-ahead keeps a decode
    error in its place, but the skip path was not re-checked with it).
    """
    if skip or open_segments < batch_size or open_segments <= _DEFAULT_INTERLEAVE:
        return 1  # a batch takes several frames per open segment: decoded into the batch
    if frame_bytes > READ_AHEAD_MAX_FRAME:
        return 1  # frames larger than any measured
    per = READ_AHEAD_BYTES // (open_segments * frame_bytes)
    return int(max(1, min(block_frames, per)))


def held_bytes(
    camera_shapes: Iterable[tuple[int, ...] | None],
    depth_shapes: Iterable[tuple[int, ...] | None] = (),
) -> int:
    """Bytes one frame (all cameras, given their batch shapes) takes while read ahead: a camera
    without a delta window ``(3, H, W)`` is kept as decoded, 8-bit YUV 4:2:0 (1.5 bytes per
    pixel, what LeRobot writes); one with a window ``(w, 3, H, W)`` as RGB, its whole window
    (an upper bound: :class:`~robo_resume.items.windows.HeldWindows` keeps each distinct frame of
    overlapping windows once). Depth cameras (``depth_shapes``) are kept as their float32
    millimetres, 4 bytes a value. At least 1."""
    total = 0
    for shape in camera_shapes:
        if shape is not None:
            size = int(np.prod(shape))
            total += size if len(shape) == 4 else size // 2
    for shape in depth_shapes:
        if shape is not None:
            total += 4 * int(np.prod(shape))
    return total or 1
