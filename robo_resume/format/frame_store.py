"""Decoded frames kept in reused memory until they are converted: :class:`FrameStore`.

The shuffle order decodes a chunk whole and emits its frames later, in any order
(:mod:`robo_resume.stream.window_read`). Holding the decoder's own frames would keep the
decoder's buffer pool growing (FFmpeg allocates a new buffer for every frame still held,
with its padding) and fault in fresh pages all the time; a store instead copies each frame's
planes, as decoded (YUV 4:2:0 from LeRobot's encoders: 1.5 bytes a pixel), into slots of
blocks it keeps and reuses, lets the decoder's frame go, and converts a slot straight into its
batch row later with the same swscale call as a decoded frame
(:func:`~robo_resume.format.rgb.planar_rgb_rows`). Memory is the peak number of frames held
times their size, and stays put once reached.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from .rgb import PLANAR_OK, planar_rgb
from .swscale import gbrp_writer

__all__ = ["FrameStore"]

_ALIGN = 64  # plane starts: swscale reads its source with SIMD loads
BLOCK_SLOTS = 32
"""Slots per block of memory a store allocates (and keeps) when it runs out of free slots."""


class _Plane:
    __slots__ = ("buffer_ptr", "line_size")

    def __init__(self, buffer_ptr: int, line_size: int) -> None:
        self.buffer_ptr, self.line_size = buffer_ptr, line_size


class _Format:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class StoredFrame:
    """A frame in a :class:`FrameStore` slot, seen as a decoded frame by the swscale writer
    (``width``, ``height``, ``format.name``, ``planes`` with ``buffer_ptr`` and
    ``line_size``). Valid until its slot is freed."""

    __slots__ = ("format", "height", "planes", "width")

    def __init__(self, fmt: _Format, width: int, height: int, planes: list[_Plane]) -> None:
        self.format, self.width, self.height, self.planes = fmt, width, height, planes


class FrameStore:
    """Slots of reused memory holding decoded frames of one camera (one size and format).

    :meth:`put` copies a decoded ``av.VideoFrame``'s planes into a free slot and returns the
    slot's key; :meth:`frame` gives a :class:`StoredFrame` of it (or, for a frame the store
    could not take, the decoded frame itself); :meth:`free` gives slots back. Frames whose
    format, size or plane layout differ from the first one's, or whose swscale conversion is
    not known to equal ``rgb24`` (see :func:`~robo_resume.format.rgb.planar_rgb`), are kept as
    the decoded frames (correct, only without the memory reuse). Thread-safe (one camera's
    frames may be put from a decoding thread while another camera's are converted).

    ``depth``: the camera is a depth map (:mod:`robo_resume.format.depth`), read from its
    ``gray12le`` plane, not converted to RGB: frames of that format are stored, others kept
    as decoded.
    """

    def __init__(self, *, depth: bool = False) -> None:
        self.depth = depth
        self._lock = threading.Lock()
        self._layout: tuple[str, int, int, tuple[tuple[int, int, int], ...]] | None = None
        self._slot_bytes = 0
        self._blocks: list[np.ndarray] = []
        self._addresses: list[int] = []  # each slot's address
        self._free: list[int] = []
        self._objects: dict[int, Any] = {}  # keys < 0: frames kept as decoded
        self._next_object = -1
        self._views: dict[int, StoredFrame] = {}
        self.held = 0  # frames held now

    def _learn(self, frame: Any) -> bool:
        """Take ``frame``'s layout as the store's (the first frame); False if it cannot be
        stored (its conversion is not the one the batch path checked)."""
        key = (frame.format.name, frame.width, frame.height)
        if self.depth:  # its codes are read from the plane (depth.codes), never converted
            if key[0] != "gray12le":
                return False
        elif PLANAR_OK.get(key) is None:  # the first frame of this kind in the process: check
            planar_rgb(frame, np.empty((3, frame.height, frame.width), np.uint8))
        if not self.depth and (not PLANAR_OK.get(key) or gbrp_writer(*key) is None):
            return False  # converted through PyAV: keep the decoded frames
        planes, at = [], 0
        for p in frame.planes:
            size = p.line_size * p.height
            planes.append((at, p.line_size, size))
            at += -(-size // _ALIGN) * _ALIGN
        self._layout = (*key, tuple(planes))
        self._slot_bytes = at
        return True

    def _sources(self, frame: Any) -> list[tuple[int, int, int]] | None:
        """``(source address, offset in a slot, bytes)`` of each plane of ``frame``, or None
        when the frame does not have the store's layout."""
        layout = self._layout
        if layout is None:
            return None
        fmt, w, h, planes = layout
        if frame.format.name != fmt or frame.width != w or frame.height != h:
            return None
        got = frame.planes
        if len(got) != len(planes):
            return None
        out = []
        for p, (at, ls, size) in zip(got, planes, strict=True):
            if p.line_size != ls or p.line_size * p.height != size:
                return None
            out.append((p.buffer_ptr, at, size))
        return out

    def put(self, frame: Any) -> int:
        """Keep ``frame`` (a decoded ``av.VideoFrame``); returns its key."""
        with self._lock:
            if self._layout is None and not self._learn(frame):
                self._layout = ("", 0, 0, ())  # nothing fits: every frame kept as decoded
            self.held += 1
            sources = self._sources(frame)
            if sources is None:
                key = self._next_object
                self._next_object -= 1
                self._objects[key] = frame
                return key
            if not self._free:
                self._grow()
            slot = self._free.pop()
        base = self._addresses[slot]
        for src, at, size in sources:  # the frame holds its buffers while this copies
            ctypes.memmove(base + at, src, size)
        return slot

    def _grow(self) -> None:
        n = len(self._blocks)
        block = np.empty((BLOCK_SLOTS, self._slot_bytes), dtype=np.uint8)
        self._blocks.append(block)
        base = block.ctypes.data
        self._addresses.extend(base + r * self._slot_bytes for r in range(BLOCK_SLOTS))
        self._free.extend(range((n + 1) * BLOCK_SLOTS - 1, n * BLOCK_SLOTS - 1, -1))

    def frame(self, key: int) -> Any:
        """The frame kept under ``key``: a :class:`StoredFrame` (or the decoded frame)."""
        if key < 0:
            return self._objects[key]
        view = self._views.get(key)
        if view is None:
            fmt, w, h, planes = self._layout  # type: ignore[misc]
            base = self._addresses[key]
            view = StoredFrame(_Format(fmt), w, h, [_Plane(base + at, ls) for at, ls, _ in planes])
            self._views[key] = view
        return view

    def free(self, keys: list[int]) -> None:
        """Give the slots of ``keys`` back (their frames are no longer needed)."""
        with self._lock:
            for key in keys:
                self.held -= 1
                if key < 0:
                    del self._objects[key]
                else:
                    self._free.append(key)

    @property
    def bytes(self) -> int:
        """Bytes of slot memory allocated (kept for reuse)."""
        return len(self._blocks) * BLOCK_SLOTS * self._slot_bytes
