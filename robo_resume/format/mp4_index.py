"""Keyframe positions of an mp4 file from its index (the ``stss`` box), without demuxing.

An mp4 (ISO BMFF) file's ``moov`` box describes every track; a video track's sample table
(``moov/trak/mdia/minf/stbl``) holds ``stss``, the sync samples: the 1-based numbers of the
samples a decoder can start at (keyframes). No ``stss`` box means every sample is a keyframe
(then ``stsz`` gives the sample count). The top-level box headers are read one by one (the media
data is skipped), then the ``moov`` box in one read (a few kB per minute of video), parsed in
memory with :mod:`struct`; demuxing reads every packet of the file.

Sample ``i`` (0-based, decode order) is frame ``i`` of the file for the videos LeRobot writes
(constant frame rate; a keyframe of a closed GOP has as many frames before it in decode order as
in display order). :func:`keyframe_frames` returns those frame numbers, or falls back to
demuxing (:meth:`VideoReader.keyframe_times`) when the index cannot say: a fragmented file
(``moof``/``mvex``), no ``moov`` box, no video track.

The file is untrusted: every box size is checked against its parent's end (so against the
file size) before it is used (the ``moov`` read is at most the file's size), and ``stss``'s
entry count against its box size before anything is allocated; a box that does not fit raises
:class:`~robo_resume.errors.CorruptFileError` naming the file and the box.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import CorruptFileError, describe
from .file_access import LOCAL, FileAccess

__all__ = ["keyframe_frames", "mp4_keyframe_samples"]

_CONTAINERS = (b"trak", b"mdia", b"minf", b"stbl")


class _Unsupported(Exception):
    """The index cannot answer (fragmented file, no video track): demux instead."""


def _corrupt(path: str | Path, what: str, found: str) -> CorruptFileError:
    return CorruptFileError(
        describe(
            "The mp4 index of a video file is damaged",
            expected=what,
            found=found,
            file=path,
            fix="download this file again (or re-encode it)",
        )
    )


def _header(path: str | Path, head: bytes, at: int, end: int) -> tuple[bytes, int, int]:
    """``(type, payload start, box end)`` of the box whose first 16 bytes (or fewer, at the
    end) are ``head``, at offset ``at`` of a parent ending at ``end``; sizes checked."""
    if len(head) < 8:
        raise _corrupt(path, f"a box header (8 bytes) at offset {at}", f"{len(head)} bytes left")
    size, kind = struct.unpack_from(">I4s", head)
    payload = at + 8
    if size == 1:  # a 64-bit size follows
        if len(head) < 16:
            raise _corrupt(path, f"a 64-bit box size at offset {at}", "the end of its parent")
        (size,) = struct.unpack_from(">Q", head, 8)
        payload = at + 16
    elif size == 0:  # to the end of the parent (the file)
        size = end - at
    if size < payload - at or at + size > end:
        raise _corrupt(
            path,
            f"box {kind!r} at offset {at} to fit in its parent (ending at {end})",
            f"size {size}",
        )
    return kind, payload, at + size


def _file_boxes(f: BinaryIO | io.RawIOBase, path: str | Path, size: int):
    """The top-level boxes of the file (a header read per box, the payloads skipped)."""
    at = 0
    while at < size:
        f.seek(at)
        kind, payload, end = _header(path, f.read(min(16, size - at)), at, size)
        yield kind, payload, end
        at = end


def _boxes(buf: bytes, path: str | Path, start: int, end: int, base: int):
    """``(type, payload start, box end)`` of each box in ``buf[start:end]`` (offsets in the
    file are ``base +`` those in ``buf``, for messages)."""
    at = start
    while at < end:
        kind, payload, stop = _header(path, buf[at : min(at + 16, end)], base + at, base + end)
        yield kind, payload - base, stop - base
        at = stop - base


def _child(
    buf: bytes, path: str | Path, start: int, end: int, base: int, kind: bytes
) -> tuple[int, int] | None:
    for k, p, e in _boxes(buf, path, start, end, base):
        if k == kind:
            return p, e
    return None


def _field(buf: bytes, path: str | Path, box: tuple[int, int], offset: int, kind: str) -> int:
    """The big-endian uint32 at ``offset`` of a box's payload."""
    p, e = box
    if e - p < offset + 4:
        raise _corrupt(path, f"at least {offset + 4} bytes in box {kind!r}", f"{e - p}")
    return struct.unpack_from(">I", buf, p + offset)[0]


def _video_stbl(
    buf: bytes, path: str | Path, trak: tuple[int, int], base: int
) -> tuple[int, int] | None:
    """The ``stbl`` box of ``trak`` if it is a video track (``hdlr`` handler ``vide``)."""
    mdia = _child(buf, path, *trak, base, b"mdia")
    if mdia is None:
        return None
    hdlr = _child(buf, path, *mdia, base, b"hdlr")
    if hdlr is None or hdlr[1] - hdlr[0] < 12 or buf[hdlr[0] + 8 : hdlr[0] + 12] != b"vide":
        return None
    minf = _child(buf, path, *mdia, base, b"minf")
    return None if minf is None else _child(buf, path, *minf, base, b"stbl")


def _read_samples(f: BinaryIO | io.RawIOBase, path: str | Path) -> np.ndarray:
    size = f.seek(0, io.SEEK_END)  # a local file or a remote one (no fileno)
    moov = None
    for kind, p, e in _file_boxes(f, path, size):
        if kind == b"moof":
            raise _Unsupported("fragmented")
        if kind == b"moov" and moov is None:
            moov = (p, e)
    if moov is None:
        raise _Unsupported("no moov box")
    f.seek(moov[0])
    buf = f.read(moov[1] - moov[0])  # at most the file's size (checked by _header)
    if len(buf) < moov[1] - moov[0]:
        raise _corrupt(path, f"{moov[1] - moov[0]} bytes of box 'moov'", "the end of the file")
    base = moov[0]
    stbl = None
    for kind, p, e in _boxes(buf, path, 0, len(buf), base):
        if kind == b"mvex":
            raise _Unsupported("fragmented")
        if kind == b"trak" and stbl is None:
            stbl = _video_stbl(buf, path, (p, e), base)
    if stbl is None:
        raise _Unsupported("no video track")
    stss = _child(buf, path, *stbl, base, b"stss")
    if stss is None:  # every sample is a sync sample
        stsz = _child(buf, path, *stbl, base, b"stsz")
        if stsz is None:
            raise _Unsupported("no stsz box")
        count = _field(buf, path, stsz, 8, "stsz")
        if count > size:  # a sample takes at least a byte of the file
            raise _corrupt(path, f"at most {size} samples (the file size)", f"{count} in stsz")
        return np.arange(count, dtype=np.int64)
    p, e = stss
    count = _field(buf, path, stss, 4, "stss")
    if 8 + 4 * count > e - p:
        raise _corrupt(
            path,
            f"{count} stss entries of 4 bytes in the box's {e - p - 8} bytes",
            f"room for {(e - p - 8) // 4}",
        )
    raw = np.frombuffer(buf, dtype=">u4", count=count, offset=p + 8)
    samples = raw.astype(np.int64) - 1
    if count and (samples[0] < 0 or np.any(samples[1:] <= samples[:-1])):
        raise _corrupt(path, "stss sample numbers >= 1 in increasing order", "others")
    return samples


def mp4_keyframe_samples(path: str | Path, *, files: FileAccess = LOCAL) -> np.ndarray | None:
    """0-based numbers (decode order) of the keyframe samples of the first video track of the
    mp4 file ``path``, from its ``stss`` box (all samples when there is none), as a sorted
    int64 array; None when the index cannot tell (not an mp4, fragmented, no video track).

    Raises :class:`~robo_resume.errors.CorruptFileError` (naming the file and the box) for a
    box that does not fit in its parent or the file, an entry count beyond its box, or sample
    numbers out of order; OSError (FileNotFoundError, ...) when the file cannot be opened.
    ``files``: where the file is read from (a remote dataset's store reads the few byte ranges
    of its boxes and its ``moov``).
    """
    path = Path(path)
    source = files.open(path)
    with open(source, "rb") if isinstance(source, str) else source as f:
        try:
            return _read_samples(f, files.where(path))
        except _Unsupported:
            return None


def keyframe_frames(
    path: str | Path, fps: float, *, episode: int | None = None, files: FileAccess = LOCAL
) -> np.ndarray:
    """Frame numbers (0-based, of the whole file) of the keyframes of the video ``path``.

    From the mp4 index (:func:`mp4_keyframe_samples`: sample ``i`` is frame ``i``); when it
    cannot tell, from the packets' times (demuxing the file: ``round(t * fps)``). Raises
    CorruptFileError naming the file (and ``episode``) when neither works, OSError when the file
    cannot be opened.
    """
    samples = mp4_keyframe_samples(path, files=files)
    if samples is not None:
        return samples
    from .video import VideoReader

    try:
        times = VideoReader(Path(path), episode=episode, files=files).keyframe_times()
    except Exception as exc:  # av.error.*, or IndexError for a file without a video stream
        raise CorruptFileError(
            describe(
                "The keyframes of a video file cannot be read",
                expected="an mp4 with a video stream (its index, or packets to demux)",
                found=f"{type(exc).__name__}: {exc}",
                file=files.where(Path(path)),
                episode=episode,
                fix="download this file again, or pass StreamTuning(cut_at_keyframes=False)",
            )
        ) from exc
    return np.unique(np.round(np.asarray(times, dtype=np.float64) * fps).astype(np.int64))
