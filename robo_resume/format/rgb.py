"""Decoded video frames to planar RGB uint8 ``(3, H, W)``, the layout of lerobot's images.

FFmpeg's swscale converts a frame straight to planar GBR into its place in the batch
(:mod:`robo_resume.format.swscale`); the first frame of every (pixel format, size) in a process
is also converted the usual way (``rgb24``, what lerobot uses) and compared, and a format whose
values differ falls back to ``rgb24`` plus a transpose. Used by
:meth:`robo_resume.format.video.VideoReader.frames_at` and by read-ahead
(:mod:`robo_resume.stream.read_ahead`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .swscale import convert_gbrp, convert_gbrp_at, gbrp_writer

__all__ = ["planar_rgb", "planar_rgb_rows"]

PLANAR_OK: dict[tuple[str, int, int], bool] = {}


def row_addresses(out: np.ndarray | None) -> tuple[int | None, int]:
    """``(address of out[0], bytes from one row to the next)`` when :func:`planar_rgb` may
    write rows of ``out`` by address (C-contiguous uint8 frames along the first axis), else
    ``(None, 0)``."""
    if out is None or out.dtype != np.uint8 or out.ndim != 4 or not out.flags.c_contiguous:
        return None, 0
    known = _ADDRESSES.get(id(out))
    if known is not None and known[0]() is out:  # the same array object: the same memory
        return known[1], known[2]
    found = out.ctypes.data, out.strides[0]  # ndarray.ctypes is slow: cached per array
    if len(_ADDRESSES) >= 64:
        _ADDRESSES.clear()
    _ADDRESSES[id(out)] = (weakref.ref(out), *found)
    return found


_ADDRESSES: dict[int, tuple[weakref.ref, int, int]] = {}
""":func:`row_addresses` of recent arrays, by ``id`` (checked against a weak reference, so a
new array at a freed one's id is never taken for it): read-ahead converts about one frame per
call into the same batch buffer, 30 calls a batch."""


def planar_writer(frame) -> Any:
    """A :func:`~robo_resume.format.swscale.gbrp_writer` for frames like ``frame``, once
    :func:`planar_rgb` found that conversion equal to ``rgb24`` for their format and size;
    None otherwise (the frames then go through :func:`planar_rgb`)."""
    key = (frame.format.name, frame.width, frame.height)
    return gbrp_writer(*key) if PLANAR_OK.get(key) else None


def planar_rgb(frame, out: np.ndarray, address: int | None = None) -> None:
    """Write a decoded frame into ``out`` ``(3, H, W)`` as RGB, equal to ``rgb24`` transposed.

    FFmpeg converts to planar GBR (``gbrp``): straight into ``out`` with
    :func:`~robo_resume.format.swscale.convert_gbrp` where it can, else into a new frame whose
    planes are copied into place. The first frame of every (pixel format, size) in a process
    is also converted the usual way (``rgb24``, what lerobot uses) and compared; where the two
    differ by a single value (another FFmpeg build or CPU path), that format falls back to
    ``rgb24`` plus a transpose. ``address``: where ``out`` starts in memory, when the caller
    knows it is a C-contiguous uint8 row (:func:`~robo_resume.format.swscale.convert_gbrp_at`
    then skips the checks it already made).
    """
    key = (frame.format.name, frame.width, frame.height)
    ok = PLANAR_OK.get(key)
    if ok and address is not None and convert_gbrp_at(frame, address, out.shape):
        return
    if ok is False:
        out[...] = frame.to_ndarray(format="rgb24").transpose(2, 0, 1)
        return
    if not convert_gbrp(frame, out):
        h, w = frame.height, frame.width
        g = frame.reformat(format="gbrp")
        for dst, plane in ((0, 2), (1, 0), (2, 1)):  # gbrp planes are G, B, R
            p = g.planes[plane]
            out[dst] = np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:h, :w]
    if ok is None:
        reference = frame.to_ndarray(format="rgb24").transpose(2, 0, 1)
        PLANAR_OK[key] = bool(np.array_equal(reference, out))
        if not PLANAR_OK[key]:
            out[...] = reference


def planar_rgb_rows(frames: Sequence[Any], out: np.ndarray, rows: Sequence[int]) -> None:
    """:func:`planar_rgb` of each of ``frames`` into ``out[rows[i]]``: the same values, with
    one :func:`~robo_resume.format.swscale.gbrp_writer` for the run where ``out`` allows
    writing rows by address (what :meth:`VideoReader.frames_at` does for the frames it
    decodes; read-ahead converts its kept frames this way)."""
    if not len(frames):
        return
    addr0, step = row_addresses(out)
    writer = planar_writer(frames[0]) if addr0 is not None else None
    for r, frame in zip(rows, frames, strict=True):
        if writer and addr0 is not None and writer(frame, addr0 + r * step):
            continue
        planar_rgb(frame, out[r], None if addr0 is None else addr0 + r * step)
        if writer is None and addr0 is not None:  # the first frame checked the format
            writer = planar_writer(frame) or False
