"""Keyframe positions of an mp4 file from its index (the ``stss`` box), without demuxing.

An mp4 (ISO BMFF) file's ``moov`` box describes every track; a video track's sample table
(``moov/trak/mdia/minf/stbl``) holds ``stss``, the sync samples: the 1-based numbers of the
samples a decoder can start at (keyframes). No ``stss`` box means every sample is a keyframe
(then ``stsz`` gives the sample count). Only box headers and those few payloads are read, with
:mod:`struct`: a few kB per file, where demuxing reads every packet.

Sample ``i`` (0-based, decode order) is frame ``i`` of the file for the videos LeRobot writes
(constant frame rate; a keyframe of a closed GOP has as many frames before it in decode order as
in display order). :func:`keyframe_frames` returns those frame numbers, or falls back to
demuxing (:meth:`VideoReader.keyframe_times`) when the index cannot say: a fragmented file
(``moof``/``mvex``), no ``moov`` box, no video track.

The file is untrusted: every box size is checked against its parent's end (so against the
file size) before it is used, and ``stss``'s entry count against its box size before anything
is allocated; a box that does not fit raises :class:`~robo_resume.errors.CorruptFileError`
naming the file and the box.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import CorruptFileError, describe

__all__ = ["keyframe_frames", "mp4_keyframe_samples"]

_CONTAINERS = (b"trak", b"mdia", b"minf", b"stbl")


class _Unsupported(Exception):
    """The index cannot answer (fragmented file, no video track): demux instead."""


def _corrupt(path: Path, what: str, found: str) -> CorruptFileError:
    return CorruptFileError(
        describe(
            "The mp4 index of a video file is damaged",
            expected=what,
            found=found,
            file=path,
            fix="download this file again (or re-encode it)",
        )
    )


def _boxes(f: BinaryIO, path: Path, start: int, end: int):
    """``(type, payload start, box end)`` of each box in ``[start, end)``, headers checked."""
    at = start
    while at < end:
        if end - at < 8:
            raise _corrupt(path, f"a box header (8 bytes) at offset {at}", f"{end - at} bytes left")
        f.seek(at)
        head = f.read(8)
        if len(head) < 8:
            raise _corrupt(path, f"a box header at offset {at}", "the end of the file")
        size, kind = struct.unpack(">I4s", head)
        payload = at + 8
        if size == 1:  # 64-bit size follows
            big = f.read(8)
            if len(big) < 8:
                raise _corrupt(path, f"a 64-bit box size at offset {at}", "the end of the file")
            (size,) = struct.unpack(">Q", big)
            payload = at + 16
        elif size == 0:  # to the end of the parent (the file)
            size = end - at
        if size < payload - at or at + size > end:
            raise _corrupt(
                path,
                f"box {kind!r} at offset {at} to fit in its parent (ending at {end})",
                f"size {size}",
            )
        yield kind, payload, at + size
        at += size


def _child(f, path, start, end, kind: bytes):
    for k, p, e in _boxes(f, path, start, end):
        if k == kind:
            return p, e
    return None


def _payload(f: BinaryIO, path: Path, start: int, end: int, n: int, kind: str) -> bytes:
    if end - start < n:
        raise _corrupt(path, f"at least {n} bytes in box {kind!r}", f"{end - start}")
    f.seek(start)
    data = f.read(n)
    if len(data) < n:
        raise _corrupt(path, f"{n} bytes of box {kind!r}", "the end of the file")
    return data


def _is_video(f, path, trak: tuple[int, int]) -> tuple[int, int] | None:
    """The ``stbl`` box of ``trak`` if it is a video track (``hdlr`` handler ``vide``)."""
    mdia = _child(f, path, *trak, b"mdia")
    if mdia is None:
        return None
    hdlr = _child(f, path, *mdia, b"hdlr")
    if hdlr is None or _payload(f, path, *hdlr, 12, "hdlr")[8:12] != b"vide":
        return None
    minf = _child(f, path, *mdia, b"minf")
    return None if minf is None else _child(f, path, *minf, b"stbl")


def _read_samples(f: BinaryIO, path: Path) -> np.ndarray:
    size = os.fstat(f.fileno()).st_size
    moov = None
    for kind, p, e in _boxes(f, path, 0, size):
        if kind == b"moof":
            raise _Unsupported("fragmented")
        if kind == b"moov":
            moov = (p, e)
    if moov is None:
        raise _Unsupported("no moov box")
    stbl = None
    for kind, p, e in _boxes(f, path, *moov):
        if kind == b"mvex":
            raise _Unsupported("fragmented")
        if kind == b"trak" and stbl is None:
            stbl = _is_video(f, path, (p, e))
    if stbl is None:
        raise _Unsupported("no video track")
    stss = _child(f, path, *stbl, b"stss")
    if stss is None:  # every sample is a sync sample
        stsz = _child(f, path, *stbl, b"stsz")
        if stsz is None:
            raise _Unsupported("no stsz box")
        (count,) = struct.unpack(">I", _payload(f, path, *stsz, 12, "stsz")[8:12])
        if count > size:  # a sample takes at least a byte of the file
            raise _corrupt(path, f"at most {size} samples (the file size)", f"{count} in stsz")
        return np.arange(count, dtype=np.int64)
    p, e = stss
    (count,) = struct.unpack(">I", _payload(f, path, p, e, 8, "stss")[4:8])
    if 8 + 4 * count > e - p:
        raise _corrupt(
            path,
            f"{count} stss entries of 4 bytes in the box's {e - p - 8} bytes",
            f"room for {(e - p - 8) // 4}",
        )
    raw = np.frombuffer(_payload(f, path, p + 8, e, 4 * count, "stss"), dtype=">u4")
    samples = raw.astype(np.int64) - 1
    if count and (samples[0] < 0 or np.any(np.diff(samples) <= 0)):
        raise _corrupt(path, "stss sample numbers >= 1 in increasing order", "others")
    return samples


def mp4_keyframe_samples(path: str | Path) -> np.ndarray | None:
    """0-based numbers (decode order) of the keyframe samples of the first video track of the
    mp4 file ``path``, from its ``stss`` box (all samples when there is none), as a sorted
    int64 array; None when the index cannot tell (not an mp4, fragmented, no video track).

    Raises :class:`~robo_resume.errors.CorruptFileError` (naming the file and the box) for a
    box that does not fit in its parent or the file, an entry count beyond its box, or sample
    numbers out of order; OSError (FileNotFoundError, ...) when the file cannot be opened.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            return _read_samples(f, path)
        except _Unsupported:
            return None


def keyframe_frames(path: str | Path, fps: float, *, episode: int | None = None) -> np.ndarray:
    """Frame numbers (0-based, of the whole file) of the keyframes of the video ``path``.

    From the mp4 index (:func:`mp4_keyframe_samples`: sample ``i`` is frame ``i``); when it
    cannot tell, from the packets' times (demuxing the file: ``round(t * fps)``).
    """
    samples = mp4_keyframe_samples(path)
    if samples is not None:
        return samples
    from .video import VideoReader

    times = VideoReader(Path(path), episode=episode).keyframe_times()
    return np.unique(np.round(np.asarray(times, dtype=np.float64) * fps).astype(np.int64))
