"""Colour conversion of a decoded frame straight into a caller's buffer, with FFmpeg's swscale.

PyAV's ``VideoFrame.reformat`` builds a new swscale context for every frame and converts into a
new frame, whose planes then have to be copied into the batch. This module calls the swscale
library PyAV itself ships (the same build, so the same conversion) through ``ctypes``: one
context per thread and source format is kept, and the conversion writes planar RGB (FFmpeg's
``gbrp``) directly into the three planes of a ``(3, H, W)`` uint8 array, which saves the
per-frame context and the copy. The call releases the GIL for frames of at least
:data:`_RELEASE_GIL_FROM` pixels.

The arguments are those ``reformat(format="gbrp")`` uses (same size, bilinear flag, no
colourspace change), so the values are the same; :func:`robo_resume.format.rgb.planar_rgb`
still compares the first frame of every source format and size with PyAV's ``rgb24`` and
falls back where they differ. When the libraries cannot be found or loaded (a PyAV built
against a system FFmpeg, another platform), :func:`convert_gbrp` returns False and the caller
takes the PyAV path.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["available", "convert_gbrp", "convert_gbrp_at", "gbrp_writer"]

_UINT8 = np.dtype(np.uint8)
_SWS_BILINEAR = 2  # what PyAV's reformat uses by default
_RELEASE_GIL_FROM = 128 * 128
"""Pixels per frame from which the conversion releases the GIL. Below it the call keeps the GIL:
for a small frame, releasing and retaking the GIL costs more than other threads gain."""
_ALIGN = 16  # destination rows at least this aligned, so swscale takes its SIMD code path


class _Libs:
    def __init__(self) -> None:
        import av

        base = Path(av.__file__).resolve().parent
        found = {}
        for name in ("swscale", "avutil"):
            hits = sorted(
                p
                for where in (base.parent / "av.libs", base / ".dylibs")
                if where.is_dir()
                for p in where.glob(f"lib{name}*")
            )
            if not hits:
                raise OSError(f"no bundled lib{name} next to PyAV in {base}")
            found[name] = ctypes.CDLL(str(hits[0]))
        sws, avutil = found["swscale"], found["avutil"]
        avutil.av_get_pix_fmt.argtypes = [ctypes.c_char_p]
        avutil.av_get_pix_fmt.restype = ctypes.c_int
        sws.sws_getContext.argtypes = [*[ctypes.c_int] * 7, *[ctypes.c_void_p] * 3]
        sws.sws_getContext.restype = ctypes.c_void_p
        pointers = ctypes.POINTER(ctypes.c_void_p)
        ints = ctypes.POINTER(ctypes.c_int)
        sws.sws_scale.argtypes = [ctypes.c_void_p, pointers, ints, ctypes.c_int, ctypes.c_int]
        sws.sws_scale.argtypes += [pointers, ints]
        sws.sws_scale.restype = ctypes.c_int
        sws.sws_freeContext.argtypes = [ctypes.c_void_p]
        sws.sws_freeContext.restype = None
        # The same function, called with the GIL held (ctypes.PyDLL): for a small frame,
        # handing the GIL to another thread and taking it back costs more than the few
        # microseconds of conversion it would free.
        held = ctypes.PyDLL(sws._name).sws_scale
        held.argtypes, held.restype = sws.sws_scale.argtypes, sws.sws_scale.restype
        self.sws, self.avutil, self.scale_holding_gil = sws, avutil, held
        self.gbrp = avutil.av_get_pix_fmt(b"gbrp")
        self.formats: dict[str, int] = {}
        if self.gbrp < 0:
            raise OSError("libavutil does not know the pixel format gbrp")

    def pix_fmt(self, name: str) -> int:
        f = self.formats.get(name)
        if f is None:
            f = self.formats[name] = self.avutil.av_get_pix_fmt(name.encode())
        return f


_LIBS: _Libs | None = None
_LOAD_FAILED = False
_LOCAL = threading.local()


def _libs() -> _Libs | None:
    global _LIBS, _LOAD_FAILED
    if _LIBS is None and not _LOAD_FAILED:
        try:
            _LIBS = _Libs()
        except (OSError, AttributeError, ImportError):
            _LOAD_FAILED = True
    return _LIBS


def available() -> bool:
    """True when swscale could be loaded, so :func:`convert_gbrp` can convert frames."""
    return _libs() is not None


class _Contexts:
    """The swscale contexts of one thread, one per (source format, width, height), freed with it.

    Looking a context up here costs a dict lookup; ``sws_getCachedContext`` compares its
    options each call, which costs more than converting a small frame."""

    MAX = 8

    def __init__(self, libs: _Libs) -> None:
        self.libs = libs
        self.ptrs: dict[tuple[str, int, int], int] = {}
        self.writers: dict[tuple[str, int, int], tuple[int, Any]] = {}  # gbrp_writer's, by key
        # argument arrays reused by every call of this thread (filled in place)
        self.src, self.dst = (ctypes.c_void_p * 4)(), (ctypes.c_void_p * 4)()
        self.strides, self.dst_strides = (ctypes.c_int * 4)(), (ctypes.c_int * 4)()

    def get(self, fmt: str, w: int, h: int) -> int | None:
        """The context converting ``fmt`` frames of ``w`` x ``h`` to gbrp (None: impossible)."""
        key = (fmt, w, h)
        ptr = self.ptrs.get(key)
        if ptr is None:
            src = self.libs.pix_fmt(fmt)
            if src < 0:
                return None
            ptr = self.libs.sws.sws_getContext(
                w, h, src, w, h, self.libs.gbrp, _SWS_BILINEAR, None, None, None
            )
            if not ptr:
                return None
            if len(self.ptrs) >= self.MAX:
                self.libs.sws.sws_freeContext(self.ptrs.pop(next(iter(self.ptrs))))
            self.ptrs[key] = ptr
        return ptr

    def __del__(self) -> None:
        ptrs, self.ptrs = self.ptrs, {}
        for ptr in ptrs.values():
            self.libs.sws.sws_freeContext(ptr)


def convert_gbrp(frame, out: np.ndarray) -> bool:
    """Convert the decoded PyAV ``frame`` to RGB straight into ``out`` ``(3, H, W)`` uint8.

    ``out[0]``, ``out[1]``, ``out[2]`` get the R, G and B planes, the values of
    ``frame.reformat(format="gbrp")`` (equal to ``rgb24`` transposed wherever
    :func:`robo_resume.format.rgb.planar_rgb` found them equal). Returns False, having written
    nothing, when the conversion cannot be done this way (swscale not loadable; ``out`` not a
    C-contiguous ``(3, H, W)`` array of the frame's size; rows or planes not 16-byte aligned, where
    swscale could take another code path); the caller then converts another way.
    """
    if out.dtype is not _UINT8 or not out.flags.c_contiguous:
        return False
    return convert_gbrp_at(frame, out.ctypes.data, out.shape)


def convert_gbrp_at(frame, address: int, shape: tuple[int, ...]) -> bool:
    """:func:`convert_gbrp` into the C-contiguous ``(3, H, W)`` uint8 array at ``address``.

    For a caller converting many frames into rows of one buffer: it checks the buffer once
    (C-contiguous uint8, ``address`` 16-byte aligned, ``shape`` the row's shape) and passes each
    row's address, which saves the per-frame checks and ``ndarray.ctypes`` (a large part of a
    small frame's conversion). Returns False, having written nothing, where :func:`convert_gbrp`
    would (``shape`` not the frame's, sizes not 16-aligned, swscale not loadable).
    """
    libs = _LIBS or _libs()
    if libs is None:
        return False
    h, w = frame.height, frame.width
    if shape != (3, h, w) or w % _ALIGN or (h * w) % _ALIGN or address % _ALIGN:
        return False
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None:
        ctx = _LOCAL.ctx = _Contexts(libs)
    ptr = ctx.get(frame.format.name, w, h)
    if ptr is None:
        return False
    src, strides, dst, dst_strides = ctx.src, ctx.strides, ctx.dst, ctx.dst_strides
    for i, p in enumerate(frame.planes):
        src[i], strides[i] = p.buffer_ptr, p.line_size
    plane = h * w
    dst[0], dst[1], dst[2] = address + plane, address + 2 * plane, address  # gbrp: G, B, R
    dst_strides[0] = dst_strides[1] = dst_strides[2] = w
    scale = libs.sws.sws_scale if plane >= _RELEASE_GIL_FROM else libs.scale_holding_gil
    return scale(ptr, src, strides, 0, h, dst, dst_strides) == h


def gbrp_writer(fmt: str, width: int, height: int) -> Callable[[Any, int], bool] | None:
    """A function ``write(frame, address)`` doing :func:`convert_gbrp_at` for frames of one
    source format and size, with what does not change from frame to frame looked up once.

    For a caller converting a run of frames of one stream on one thread (the writer uses that
    thread's swscale context and argument arrays: call it on the thread that made it; each
    thread keeps its writers, so asking again is a lookup).
    ``write`` returns False, having written nothing, for a frame of another format or size or
    an ``address`` not 16-byte aligned; the caller then converts that frame another way. None
    when frames of this format and size cannot be converted this way (see :func:`convert_gbrp`).
    Per 96x96 frame, about half the Python time of :func:`convert_gbrp_at`.
    """
    libs = _LIBS or _libs()
    if libs is None or width % _ALIGN or (height * width) % _ALIGN:
        return None
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None:
        ctx = _LOCAL.ctx = _Contexts(libs)
    key = (fmt, width, height)
    made = ctx.writers.get(key)
    if made is not None and ctx.ptrs.get(key) == made[0]:
        return made[1]
    ptr = ctx.get(fmt, width, height)
    if ptr is None:
        return None
    ptrs = ctx.ptrs
    context = ctypes.c_void_p(ptr)
    src, strides, dst, dst_strides = ctx.src, ctx.strides, ctx.dst, ctx.dst_strides
    plane = height * width
    scale = libs.sws.sws_scale if plane >= _RELEASE_GIL_FROM else libs.scale_holding_gil

    def write(frame, address: int) -> bool:
        if (
            frame.width != width
            or frame.height != height
            or address % _ALIGN
            or frame.format.name != fmt
            or ptrs.get(key) != ptr  # the thread's context was freed (more than MAX formats)
        ):
            return False
        for i, p in enumerate(frame.planes):
            src[i], strides[i] = p.buffer_ptr, p.line_size
        dst[0], dst[1], dst[2] = address + plane, address + 2 * plane, address  # G, B, R
        dst_strides[0] = dst_strides[1] = dst_strides[2] = width
        return scale(context, src, strides, 0, height, dst, dst_strides) == height

    ctx.writers[key] = (ptr, write)
    return write
