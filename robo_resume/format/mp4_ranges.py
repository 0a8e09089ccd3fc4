"""Byte ranges of the frames of an mp4 file, from its sample tables: what a remote reader fetches.

An mp4 (ISO BMFF) file is a sequence of top-level boxes (``ftyp``, ``moov``, ``mdat``,
``free``, ...); the ``moov`` box describes each track, and a video track's sample table
(``moov/trak/mdia/minf/stbl``) says where every sample (compressed frame) lies in the file:

1. :func:`read_sample_table` walks the top-level box headers (the head of the file, then one
   16-byte header read per box beyond it), reads the ``moov`` where the walk finds it (at the
   end for the files LeRobot writes: a few kB) and parses the first video track: sizes
   (``stsz``/``stz2``), chunk offsets (``stco``/``co64``) and samples per chunk (``stsc``) give
   each sample's byte span; decode durations (``stts``) and composition offsets (``ctts``) its
   times; sync samples (``stss``; none = every sample a keyframe) the keyframes. Every read goes
   through a ``read(start, end)`` callback, so the file can be remote; the spans read are
   recorded in :attr:`SampleTable.spans_read`.
2. :meth:`SampleTable.frame_range_bytes` gives the one byte span holding every sample needed to
   decode frames ``[first, stop)`` (presentation order, sorted by ``pts = dts + ctts``): from
   the keyframe at or before the first one (decode order) through the last needed sample plus
   :attr:`SampleTable.reorder_depth` samples, computed from ``ctts``: the most samples decoded
   before a frame and shown after it (0 for open50's mpeg4 and lerobot's AV1, 1 for x264 with
   two B-frames, 2 with a b-pyramid). One span, not one per mp4 chunk: the demuxer also reads
   the other tracks' samples interleaved between them, and a seek moves every track, so the
   span also starts early enough for the other tracks' samples at the keyframe's time.
3. :class:`~robo_resume.format.ranged_file.RangedFile` is a seekable read-only file object
   over the fetched pieces that PyAV opens (``av.open(RangedFile(...))``); a read starting
   outside them raises :class:`~robo_resume.errors.BytesNotHeldError`, a read reaching the
   end of a piece stops there (a short read). :meth:`SampleTable.chunk_file` fetches
   :meth:`SampleTable.pieces` and declares the rest of the ``mdat`` after the span the end of
   the file (``eof_span``).

What FFmpeg reads (PyAV 15, FFmpeg 7, measured by logging a file object's reads; see
tests/test_mp4_ranges.py): to open an mp4 whose ``moov`` is at the end, the first 32 KiB (the
format probe needs 2 KiB of them), the ``moov``, then from the start of the ``mdat`` the first
packet of each stream (``avformat_find_stream_info`` decodes it; for a 64x48 x264 stream it
read every packet, so such tiny files are best fetched whole). :meth:`SampleTable.open_spans`
holds exactly that. A forward jump of at most 64 KiB (its 32 KiB buffer plus its 32 KiB
short-seek threshold) is read through instead of seeked, so :meth:`SampleTable.pieces` also
holds holes that small. At the end of a chunk a decoder still holds frames it has not output:
FFmpeg's h264 decoder 2 for x264's streams (the SPS's reorder, even where ``ctts`` shows 1),
frame threads ``threads - 1`` more packets (2 with the automatic count on 2 cores). Rather than
fetch that many more samples for every decoder setting, the ``eof_span`` makes the demuxer
stop at the end of the span: FFmpeg flushes the decoder, which outputs every frame it holds.

Only the first video track is read (a file with several video tracks: the first ``trak`` whose
handler is ``vide``); fragmented files (``moof``/``mvex``) are refused. The file is untrusted:
every box size is checked against its parent's end and every entry count against its box
before anything is allocated; what does not fit raises
:class:`~robo_resume.errors.CorruptFileError` naming the file and the box.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import CorruptFileError, VideoDecodeError, describe
from .ranged_file import RangedFile, Span, merge_spans

__all__ = [
    "HEAD_BYTES",
    "PROBE_BYTES",
    "PROBE_SAMPLES",
    "READ_THROUGH",
    "Mp4Box",
    "SampleTable",
    "TrackSamples",
    "read_sample_table",
]

HEAD_BYTES = 64 * 1024
"""Bytes :func:`read_sample_table` reads first from the start of the file: the top-level box
headers there (and a ``moov`` placed first, when small) cost no further request."""

PROBE_SAMPLES = 1
"""Video samples at the start of ``mdat`` (file order) :meth:`SampleTable.open_spans` holds for
FFmpeg's probe when opening (it decodes the first packet of each stream)."""

PROBE_BYTES = 2048
"""Bytes at the start of the file FFmpeg's format probe reads at the least (its
``PROBE_BUF_MIN``); it reads them with one buffered read that must not stop short."""

READ_THROUGH = 64 * 1024
"""Forward gap FFmpeg reads through instead of seeking: its I/O buffer (32 KiB, PyAV's
default ``buffer_size``) plus its short-seek threshold (32 KiB). A hole of at most this many
bytes between two held pieces is read when the demuxer jumps across it, so
:meth:`SampleTable.pieces` holds such holes too."""

_MAX_REORDER = 1024  # a presentation order further from the decode order than this is refused


@dataclass(frozen=True)
class Mp4Box:
    """A top-level box of the file: its four-character type and its byte span ``[start, end)``
    (``payload`` is where the box's content starts, after its 8- or 16-byte header)."""

    kind: str
    start: int
    payload: int
    end: int


def _corrupt(name: str, expected: str, found: str) -> CorruptFileError:
    return CorruptFileError(
        describe(
            "The mp4 index of a video file cannot be used",
            expected=expected,
            found=found,
            file=name,
            fix="download this file again (or re-encode it as a plain, non-fragmented mp4)",
        )
    )


def _header(name: str, head: bytes, at: int, end: int) -> tuple[str, int, int]:
    """``(type, payload start, box end)`` of the box at file offset ``at`` whose first 16 bytes
    (fewer at the end) are ``head``, inside a parent ending at ``end``; sizes checked."""
    if len(head) < 8:
        raise _corrupt(name, f"a box header (8 bytes) at offset {at}", f"{len(head)} bytes left")
    size, raw = struct.unpack_from(">I4s", head)
    kind = raw.decode("latin-1")
    payload = at + 8
    if size == 1:  # a 64-bit size follows the type
        if len(head) < 16:
            raise _corrupt(name, f"a 64-bit size of box {kind!r} at offset {at}", "the end")
        (size,) = struct.unpack_from(">Q", head, 8)
        payload = at + 16
    elif size == 0:  # the box runs to the end of its parent (the file)
        size = end - at
    if size < payload - at or at + size > end:
        raise _corrupt(
            name,
            f"box {kind!r} at offset {at} to fit in its parent (ending at {end})",
            f"size {size}",
        )
    return kind, payload, at + size


def _children(name: str, buf: bytes, span: Span, base: int) -> dict[str, Span]:
    """The first box of each type inside ``buf[span]`` (offsets in ``buf``; ``base`` is the file
    offset of ``buf[0]``, for messages): type -> (payload start, end)."""
    out: dict[str, Span] = {}
    at, end = span
    while at < end:
        kind, payload, stop = _header(name, buf[at : min(at + 16, end)], base + at, base + end)
        out.setdefault(kind, (payload - base, stop - base))
        at = stop - base
    return out


def _all_children(name: str, buf: bytes, span: Span, base: int, kind: str) -> list[Span]:
    out = []
    at, end = span
    while at < end:
        k, payload, stop = _header(name, buf[at : min(at + 16, end)], base + at, base + end)
        if k == kind:
            out.append((payload - base, stop - base))
        at = stop - base
    return out


def _table(name: str, buf: bytes, box: Span, kind: str, skip: int, fmt: str) -> np.ndarray:
    """The entries of a full box: version/flags, ``skip`` more bytes, a uint32 count, then
    ``count`` records of numpy dtype ``fmt`` (big-endian); the count checked against the box."""
    p, e = box
    if e - p < 8 + skip:
        raise _corrupt(name, f"at least {8 + skip} bytes in box {kind!r}", f"{e - p}")
    (count,) = struct.unpack_from(">I", buf, p + 4 + skip)
    dtype = np.dtype(fmt)
    room = (e - p - 8 - skip) // dtype.itemsize
    if count > room:
        raise _corrupt(
            name, f"{count} entries of box {kind!r} in its {e - p} bytes", f"room for {room}"
        )
    return np.frombuffer(buf, dtype=dtype, count=count, offset=p + 8 + skip)


def _u32(buf: bytes, at: int) -> int:
    return int(struct.unpack_from(">I", buf, at)[0])


@dataclass(frozen=True, eq=False)
class TrackSamples:
    """A non-video track's samples in decode order: file ``offsets`` and ``sizes`` (int64)
    and decode ``times`` in seconds (after the track's edit list start)."""

    offsets: np.ndarray
    sizes: np.ndarray
    times: np.ndarray


@dataclass(frozen=True, eq=False)
class SampleTable:
    """The video track of an mp4 file as byte spans and times, per sample in decode order.

    Built by :func:`read_sample_table`. Frames are presentation-order indices (sorted by
    ``pts``; ties keep the decode order); :attr:`order` maps a frame to its sample.

    Attributes:
        name: the file or URL (for messages).
        size: the file's size in bytes.
        codec: the sample description's four-character code (``mp4v``, ``avc1``, ``av01``...).
        timescale: ticks per second of the track (``mdhd``), the stream's time base.
        offsets: file offset of each sample (int64).
        sizes: byte size of each sample (int64).
        dts: decode time of each sample in ticks (int64, from ``stts``).
        pts: presentation time in ticks, ``dts + ctts - media_start`` (int64): the times
            FFmpeg gives the decoded frames.
        keyframes: sorted sample numbers of the sync samples (all samples without ``stss``).
        media_start: the edit list's start in the media (``elst`` media time, 0 without one).
        boxes: the file's top-level boxes.
        moov: the byte span of the ``moov`` box.
        spans_read: the ``[start, end)`` spans :func:`read_sample_table` read, in order.
        other_tracks: the samples of the file's other tracks (audio...), which the demuxer
            reads interleaved with the video's.
    """

    name: str
    size: int
    codec: str
    timescale: int
    offsets: np.ndarray
    sizes: np.ndarray
    dts: np.ndarray
    pts: np.ndarray
    keyframes: np.ndarray
    media_start: int
    boxes: tuple[Mp4Box, ...]
    moov: Span
    spans_read: tuple[Span, ...] = field(default=())
    other_tracks: tuple[TrackSamples, ...] = field(default=())

    @property
    def num_frames(self) -> int:
        """Number of samples (frames) of the track."""
        return len(self.sizes)

    @cached_property
    def order(self) -> np.ndarray:
        """Sample number (decode order) of each frame (presentation order), int64."""
        return np.argsort(self.pts, kind="stable").astype(np.int64)

    @cached_property
    def frame_times(self) -> np.ndarray:
        """Presentation time (seconds) of each frame, increasing: ``pts / timescale``."""
        return self.pts[self.order] / float(self.timescale)

    @cached_property
    def reorder_depth(self) -> int:
        """Samples a decoder takes in before it can output a frame, from the composition order:
        the largest number of samples decoded before one but presented after it (0 when
        ``pts`` follows ``dts``, 2 for h264 with two pyramid B-frames).

        Raises:
            CorruptFileError: the presentation order strays more than 1024 samples from the
                decode order.
        """
        n = self.num_frames
        rank = np.empty(n, dtype=np.int64)
        rank[self.order] = np.arange(n, dtype=np.int64)
        stray = int(np.abs(rank - np.arange(n)).max()) if n else 0
        if stray > _MAX_REORDER:
            raise _corrupt(
                self.name,
                f"a presentation order within {_MAX_REORDER} samples of the decode order",
                f"a sample {stray} places away (ctts)",
            )
        # j < i presented after i implies i - j < 2 * stray: only that window is counted
        later = np.zeros(n, dtype=np.int64)
        for k in range(1, min(2 * stray, n)):
            later[k:] += rank[:-k] > rank[k:]
        return int(later.max()) if n else 0

    def frame_at(self, seconds: float, *, tolerance_s: float = 1e-4) -> int:
        """The frame shown at ``seconds`` in the file (for a v3.0 episode: its video
        ``from_timestamp`` + the row's ``timestamp``), matched as
        :class:`~robo_resume.format.video.VideoReader` matches: ``|time - seconds| <
        tolerance_s``.

        Args:
            seconds: time in the file.
            tolerance_s: largest difference accepted (lerobot's default, 1e-4 s).

        Returns:
            The frame's index (presentation order).

        Raises:
            VideoDecodeError: no frame within the tolerance (names the nearest frame's time).
        """
        times = self.frame_times
        j = int(np.searchsorted(times, seconds - tolerance_s, side="left"))
        if j < len(times) and abs(times[j] - seconds) < tolerance_s:
            return j
        near = [float(times[i]) for i in (j - 1, j) if 0 <= i < len(times)]
        raise VideoDecodeError(
            describe(
                "No video frame is shown at a requested time",
                expected=f"a frame within {tolerance_s}s of {seconds:.4f}s",
                found="no frames"
                if not near
                else "frames at " + ", ".join(f"{t:.4f}s" for t in near),
                file=self.name,
                fix="check the episode's from_timestamp and timestamps against the video, "
                "or raise tolerance_s if they are slightly off",
            )
        )

    def decode_samples(self, first_frame: int, stop_frame: int, *, decoder_delay: int = 0) -> Span:
        """The samples ``[start, stop)`` (decode order) a decoder reads to output frames
        ``[first_frame, stop_frame)``: from the keyframe at or before each of them through the
        last one's sample plus :attr:`reorder_depth` and ``decoder_delay`` samples (cut at the
        end of the track). Closed GOPs are assumed (what x264, SVT-AV1 and FFmpeg's mpeg4
        write by default): a frame shown before its keyframe but decoded after it would need
        the previous GOP too.

        Args:
            first_frame: first frame wanted (presentation order).
            stop_frame: one past the last frame wanted, ``first_frame < stop_frame <=``
                :attr:`num_frames`.
            decoder_delay: further samples for a decoder that is not flushed at the end of
                the span (frame threads hold ``threads - 1`` packets; FFmpeg's h264 decoder
                holds its SPS's reorder count of later-shown pictures, which may take more
                samples than that); 0 with :meth:`chunk_file`, whose end flushes it.

        Returns:
            ``(start, stop)`` sample numbers.

        Raises:
            ValueError: an empty or out-of-range frame range, or a negative delay.
        """
        n = self.num_frames
        if not 0 <= first_frame < stop_frame <= n or decoder_delay < 0:
            raise ValueError(
                f"frames [{first_frame}, {stop_frame}) of {self.name}: need 0 <= first < stop "
                f"<= {n} (the track's frames) and decoder_delay >= 0 (got {decoder_delay})"
            )
        samples = self.order[first_frame:stop_frame]
        lo, hi = int(samples.min()), int(samples.max())
        k = int(np.searchsorted(self.keyframes, lo, side="right")) - 1
        start = int(self.keyframes[k]) if k >= 0 else 0
        return start, min(hi + 1 + self.reorder_depth + decoder_delay, n)

    def frame_range_bytes(
        self, first_frame: int, stop_frame: int, *, decoder_delay: int = 0
    ) -> Span:
        """The byte span ``[start, end)`` of the file holding the samples of
        :meth:`decode_samples` (with everything between them: other tracks' samples too).

        Args:
            first_frame: first frame wanted (presentation order).
            stop_frame: one past the last frame wanted.
            decoder_delay: as in :meth:`decode_samples`.

        Returns:
            ``(start, end)`` byte offsets, ``0 <= start < end <= size``.

        Raises:
            ValueError: as :meth:`decode_samples`.
        """
        a, b = self.decode_samples(first_frame, stop_frame, decoder_delay=decoder_delay)
        offsets, ends = self.offsets[a:b], self.offsets[a:b] + self.sizes[a:b]
        start = int(offsets.min())
        # a seek moves every track to the keyframe's time: another track's sample at or
        # before it may lie before the keyframe in the file
        seek = (self.dts[a] - self.media_start) / self.timescale
        for track in self.other_tracks:
            j = int(np.searchsorted(track.times, seek + 1e-9, side="right")) - 1
            if len(track.offsets):
                start = min(start, int(track.offsets[max(j, 0)]))
        return start, int(ends.max())

    @cached_property
    def first_park(self) -> int:
        """Where FFmpeg's reads stand after a decoder parks at the first sample (a seek to 0
        and one packet demuxed, ``VideoReader._park``) when only :meth:`open_spans` are held
        (each read stops at the end of the span it starts in): the end of the open span
        holding the first video sample."""
        first = int(self.offsets.min()) if self.num_frames else 0
        for a, b in self.open_spans():
            if a <= first < b:
                return b
        return first

    @cached_property
    def last_key_span(self) -> Span:
        """The bytes of the keyframe decoded last (the largest ``dts``): where a decoder parks
        the second time, for a chunk near the first sample (:meth:`parks_twice`)."""
        k = int(self.keyframes[np.argmax(self.dts[self.keyframes])])
        return int(self.offsets[k]), int(self.offsets[k] + self.sizes[k])

    def parks_twice(self, start: int) -> bool:
        """Whether a decoder seeking to a chunk whose bytes start at ``start`` parks at the last
        keyframe after the first sample: the chunk lies at most ``2 * READ_THROUGH`` bytes past
        :attr:`first_park` (from there FFmpeg would read through to it; the margin covers a
        seek that lands a keyframe off), and that keyframe lies farther than that past it (a
        seek from the first sample to it, and from it back to the chunk, are real seeks).

        A planner extends the range of a chunk within ``READ_THROUGH`` past the first park
        back to it when this is false (a small file): FFmpeg then reads through, from held
        bytes."""
        p0 = self.first_park
        far = 2 * READ_THROUGH
        return p0 < start <= p0 + far and self.last_key_span[0] - p0 > far

    def seek_start(self, seconds: float, *, tolerance_s: float = 1e-4) -> int:
        """The first byte a seek to the frame at ``seconds`` reads (:meth:`frame_range_bytes`
        of that frame alone): the offset a planner found for the chunk it starts."""
        times = self.frame_times
        first = min(int(np.searchsorted(times, seconds - tolerance_s)), self.num_frames - 1)
        return self.frame_range_bytes(max(first, 0), max(first, 0) + 1)[0]

    def frame_bytes(self, first_frame: int, stop_frame: int) -> int:
        """Bytes of the frames' own samples (frames ``[first_frame, stop_frame)``): what a
        reader needs at the least, to compare :meth:`frame_range_bytes` with."""
        return int(self.sizes[self.order[first_frame:stop_frame]].sum())

    def open_spans(self, *, probe_samples: int = PROBE_SAMPLES) -> list[Span]:
        """The byte spans FFmpeg reads to open the file, merged and sorted: the first
        :data:`PROBE_BYTES` bytes (the format probe), every top-level box whole except
        ``mdat`` (``ftyp``, ``moov``, ``free``...), each ``mdat``'s header, and the ``mdat``
        from its payload through the first ``probe_samples`` video samples in file order and
        the first sample of every other track (the packets ``avformat_find_stream_info``
        demuxes and decodes: one per stream for what LeRobot and FFmpeg write).

        Args:
            probe_samples: video samples held for the probe (at least 1).

        Returns:
            Disjoint spans in increasing order.
        """
        spans = [(0, min(PROBE_BYTES, self.size))]
        spans += [(b.start, b.payload if b.kind == "mdat" else b.end) for b in self.boxes]
        first = np.argsort(self.offsets, kind="stable")[: max(probe_samples, 1)]
        probe = [
            *(
                (int(t.offsets[0]), int(t.offsets[0] + t.sizes[0]))
                for t in self.other_tracks
                if len(t.sizes)
            ),
            *zip(self.offsets[first], self.offsets[first] + self.sizes[first], strict=True),
        ]
        if probe:
            at = min(int(a) for a, _ in probe)
            mdat = [b.payload for b in self.boxes if b.kind == "mdat" and b.payload <= at]
            spans.append((max(mdat, default=at), max(int(b) for _, b in probe)))
        return merge_spans(spans)

    def pieces(self, first_frame: int, stop_frame: int, *, decoder_delay: int = 0) -> list[Span]:
        """Every span a :class:`RangedFile` must hold to open the file and decode frames
        ``[first_frame, stop_frame)``: :meth:`open_spans` and :meth:`frame_range_bytes`, merged.

        Raises:
            ValueError: as :meth:`decode_samples`.
        """
        chunk = self.frame_range_bytes(first_frame, stop_frame, decoder_delay=decoder_delay)
        return merge_spans([*self.open_spans(), chunk], gap=READ_THROUGH)

    def chunk_file(
        self, first_frame: int, stop_frame: int, read: Callable[[int, int], bytes]
    ) -> RangedFile:
        """A :class:`RangedFile` holding :meth:`pieces` for frames ``[first_frame,
        stop_frame)``, fetched with ``read(start, end)`` (one call per piece), whose
        ``eof_span`` is the rest of the ``mdat`` after :meth:`frame_range_bytes`: PyAV opens it
        and decodes those frames, with any number of decoder threads.

        Raises:
            ValueError: as :meth:`decode_samples`.
            BytesNotHeldError: (when decoding) a read outside the pieces.
        """
        end = self.frame_range_bytes(first_frame, stop_frame)[1]
        mdat = [b.end for b in self.boxes if b.kind == "mdat" and b.payload <= end < b.end]
        spans = self.pieces(first_frame, stop_frame)
        return RangedFile(
            self.size,
            [(s, read(s, e)) for s, e in spans],
            name=self.name,
            eof_span=(end, mdat[0]) if mdat else None,
        )


class _Reader:
    """The ``read(start, end)`` callback with the spans read recorded and short reads refused."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, name: str) -> None:
        self.read, self.size, self.name = read, size, name
        self.spans: list[Span] = []

    def __call__(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        data = bytes(self.read(start, end))
        self.spans.append((start, end))
        if len(data) != end - start:
            raise _corrupt(
                self.name,
                f"{end - start} bytes at offset {start} (file of {self.size} bytes)",
                f"{len(data)} bytes",
            )
        return data


def _top_level(get: _Reader, head: bytes) -> list[Mp4Box]:
    """The top-level boxes: headers from ``head`` where it holds them, else one read each."""
    boxes = []
    at, size = 0, get.size
    while at < size:
        raw = head[at : at + 16] if at + 16 <= len(head) else get(at, min(at + 16, size))
        kind, payload, end = _header(get.name, raw, at, size)
        boxes.append(Mp4Box(kind, at, payload, end))
        if kind == "moof":
            raise _corrupt(
                get.name, "a plain mp4 (one moov with sample tables)", "a fragmented mp4 (moof)"
            )
        at = end
    return boxes


def _video_track(name: str, moov: bytes, base: int) -> tuple[Span, dict[str, Span]]:
    """``(mdia span, stbl children)`` of the first track whose handler is ``vide``."""
    top = (0, len(moov))
    if "mvex" in _children(name, moov, top, base):
        raise _corrupt(name, "a plain mp4 (one moov with sample tables)", "a fragmented mp4 (mvex)")
    for trak in _all_children(name, moov, top, base, "trak"):
        mdia = _children(name, moov, trak, base).get("mdia")
        if mdia is None:
            continue
        inner = _children(name, moov, mdia, base)
        hdlr = inner.get("hdlr")
        if hdlr is None or hdlr[1] - hdlr[0] < 12 or moov[hdlr[0] + 8 : hdlr[0] + 12] != b"vide":
            continue
        minf = inner.get("minf")
        stbl = None if minf is None else _children(name, moov, minf, base).get("stbl")
        if stbl is None:
            raise _corrupt(name, "a video track with a sample table (minf/stbl)", "none")
        return trak, _children(name, moov, stbl, base)
    raise _corrupt(name, "a video track (a trak whose hdlr is 'vide') in the moov", "none")


def _timescale(name: str, moov: bytes, mdhd: Span) -> int:
    p, e = mdhd
    version = moov[p] if e > p else 0
    at = p + (20 if version == 1 else 12)
    if e - at < 4:
        raise _corrupt(name, "a timescale in box 'mdhd'", f"{e - p} bytes")
    scale = _u32(moov, at)
    if scale == 0:
        raise _corrupt(name, "a non-zero timescale in box 'mdhd'", "0")
    return scale


def _media_start(name: str, moov: bytes, trak: Span, base: int) -> int:
    """The media time where the first non-empty edit starts (``edts/elst``), 0 without one."""
    edts = _children(name, moov, trak, base).get("edts")
    elst = None if edts is None else _children(name, moov, edts, base).get("elst")
    if elst is None or elst[1] - elst[0] < 8:
        return 0
    wide = moov[elst[0]] == 1
    entries = _table(name, moov, elst, "elst", 0, ">u8,>i8,>u4" if wide else ">u4,>i4,>u4")
    for entry in entries:
        if int(entry[1]) != -1:  # -1: an empty edit (a delay before the media starts)
            return int(entry[1])
    return 0


def _sample_sizes(name: str, moov: bytes, stbl: dict[str, Span]) -> np.ndarray:
    if "stsz" in stbl:
        p, e = stbl["stsz"]
        if e - p < 12:
            raise _corrupt(name, "at least 12 bytes in box 'stsz'", f"{e - p}")
        fixed, count = struct.unpack_from(">II", moov, p + 4)
        if fixed:
            return np.full(count, fixed, dtype=np.int64)
        return _table(name, moov, stbl["stsz"], "stsz", 4, ">u4").astype(np.int64)
    if "stz2" in stbl:
        p, e = stbl["stz2"]
        if e - p < 12:
            raise _corrupt(name, "at least 12 bytes in box 'stz2'", f"{e - p}")
        bits = moov[p + 7]
        count = _u32(moov, p + 8)
        if bits not in (4, 8, 16) or (count * bits + 7) // 8 > e - p - 12:
            raise _corrupt(name, f"{count} sizes of 4, 8 or 16 bits in box 'stz2'", f"{bits}-bit")
        if bits == 4:
            raw = np.frombuffer(moov, np.uint8, (count + 1) // 2, p + 12)
            return np.stack([raw >> 4, raw & 15], axis=1).reshape(-1)[:count].astype(np.int64)
        dtype = ">u1" if bits == 8 else ">u2"
        return np.frombuffer(moov, dtype, count, p + 12).astype(np.int64)
    raise _corrupt(name, "sample sizes (box 'stsz' or 'stz2') in the video track", "neither")


def _sample_offsets(name: str, moov: bytes, stbl: dict[str, Span], sizes: np.ndarray) -> np.ndarray:
    if "stco" in stbl:
        chunks = _table(name, moov, stbl["stco"], "stco", 0, ">u4").astype(np.int64)
    elif "co64" in stbl:
        chunks = _table(name, moov, stbl["co64"], "co64", 0, ">u8").astype(np.int64)
    else:
        raise _corrupt(name, "chunk offsets (box 'stco' or 'co64') in the video track", "neither")
    if "stsc" not in stbl:
        raise _corrupt(name, "box 'stsc' (samples per chunk) in the video track", "none")
    runs = _table(name, moov, stbl["stsc"], "stsc", 0, ">u4,>u4,>u4")
    first = runs["f0"].astype(np.int64) - 1
    if len(first) == 0 or first[0] != 0 or np.any(np.diff(first) <= 0) or first[-1] >= len(chunks):
        raise _corrupt(name, "stsc runs from chunk 1 in increasing order within stco", "others")
    lengths = np.diff(np.append(first, len(chunks)))
    per_chunk = np.repeat(runs["f1"].astype(np.int64), lengths)
    if int(per_chunk.sum()) < len(sizes):
        raise _corrupt(
            name,
            f"chunks holding the {len(sizes)} samples of stsz",
            f"{int(per_chunk.sum())} (stsc)",
        )
    chunk = np.repeat(np.arange(len(chunks)), per_chunk)[: len(sizes)]
    ends = np.cumsum(sizes)
    before = ends - sizes  # bytes of the track's samples before each one
    chunk_start = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]]) if len(chunk) else chunk
    base = np.repeat(before[chunk_start], np.diff(np.append(chunk_start, len(chunk))))
    return chunks[chunk] + before - base


def _repeat(name: str, moov: bytes, box: Span, kind: str, n: int) -> np.ndarray:
    runs = _table(name, moov, box, kind, 0, ">u4,>i4")
    counts = runs["f0"].astype(np.int64)
    if int(counts.sum()) < n:
        raise _corrupt(name, f"{kind} entries for {n} samples", f"{int(counts.sum())}")
    return np.repeat(runs["f1"].astype(np.int64), counts)[:n]


def _samples(
    name: str, moov: bytes, base: int, trak: Span, stbl: dict[str, Span], size: int
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(timescale, offsets, sizes, dts, edit start)`` of a track's samples, checked."""
    inner = _children(name, moov, _children(name, moov, trak, base).get("mdia", (0, 0)), base)
    if "mdhd" not in inner:
        raise _corrupt(name, "box 'mdhd' (the timescale) in each track", "none")
    timescale = _timescale(name, moov, inner["mdhd"])
    sizes = _sample_sizes(name, moov, stbl)
    n = len(sizes)
    if n > size:  # each sample takes at least a byte of the file
        raise _corrupt(name, f"at most {size} samples (the file's size)", f"{n}")
    offsets = _sample_offsets(name, moov, stbl, sizes)
    if n and (offsets.min() < 0 or int((offsets + sizes).max()) > size):
        raise _corrupt(name, f"samples inside the file's {size} bytes", "a sample beyond its end")
    if "stts" not in stbl:
        raise _corrupt(name, "box 'stts' (decode times) in each track", "none")
    deltas = _repeat(name, moov, stbl["stts"], "stts", n)
    dts = np.concatenate([[0], np.cumsum(deltas)[:-1]]).astype(np.int64) if n else deltas
    return timescale, offsets, sizes, dts, _media_start(name, moov, trak, base)


def read_sample_table(
    read: Callable[[int, int], bytes], size: int, *, name: str = "<mp4>", head: int = HEAD_BYTES
) -> SampleTable:
    """Parse the first video track's sample tables of an mp4 file read through ``read``.

    Reads the first ``head`` bytes, a 16-byte header for each top-level box beyond them, then
    the ``moov`` box (unless the head holds it): for the files LeRobot writes (moov at the
    end), 2 or 3 reads. Handles 64-bit box sizes, size 0 (to the end of the file), several
    tracks (the first video track is used), ``stz2`` and ``co64``, ``ctts`` of version 0 or 1
    (offsets read as signed) and an edit list's start (``elst``); no ``stss`` means every
    sample is a keyframe.

    Args:
        read: ``read(start, end)`` returns the file's bytes ``[start, end)``.
        size: the file's size in bytes.
        name: the file or URL, for messages and :attr:`SampleTable.name`.
        head: bytes read first.

    Returns:
        The :class:`SampleTable` (with :attr:`SampleTable.spans_read`).

    Raises:
        CorruptFileError: not an mp4, a box that does not fit, a truncated ``moov``, no video
            track, a fragmented file, tables that disagree (fewer entries than samples).
    """
    get = _Reader(read, size, name)
    first = get(0, min(head, size)) if size else b""
    boxes = _top_level(get, first)
    moovs = [b for b in boxes if b.kind == "moov"]
    if not moovs:
        kinds = ",".join(b.kind for b in boxes[:8]) or "no boxes"
        raise _corrupt(name, "a 'moov' box among the top-level boxes", kinds)
    box = moovs[0]
    base = box.payload
    moov = first[base : box.end] if box.end <= len(first) else get(base, box.end)
    trak, stbl = _video_track(name, moov, base)
    timescale, offsets, sizes, dts, shift = _samples(name, moov, base, trak, stbl, size)
    n = len(sizes)
    if "stsd" not in stbl or stbl["stsd"][1] - stbl["stsd"][0] < 16:
        raise _corrupt(name, "a sample description (box 'stsd') in the video track", "none")
    codec = moov[stbl["stsd"][0] + 12 : stbl["stsd"][0] + 16].decode("latin-1")
    pts = dts - shift
    if "ctts" in stbl:
        pts = pts + _repeat(name, moov, stbl["ctts"], "ctts", n)
    if "stss" in stbl:
        keys = _table(name, moov, stbl["stss"], "stss", 0, ">u4").astype(np.int64) - 1
        if len(keys) and (keys[0] < 0 or keys[-1] >= n or np.any(np.diff(keys) <= 0)):
            raise _corrupt(name, f"stss sample numbers 1..{n} in increasing order", "others")
    else:
        keys = np.arange(n, dtype=np.int64)
    others = []
    for other in _all_children(name, moov, (0, len(moov)), base, "trak"):
        if other == trak:
            continue
        node: Span | None = other
        for kind in ("mdia", "minf", "stbl"):
            node = None if node is None else _children(name, moov, node, base).get(kind)
        if node is None:
            continue
        tables = _children(name, moov, node, base)
        if not {"stsz", "stts", "stsc"} <= tables.keys() and "stz2" not in tables:
            continue  # a track without samples
        scale, at, length, decode, start = _samples(name, moov, base, other, tables, size)
        others.append(TrackSamples(at, length, (decode - start) / scale))
    return SampleTable(
        name=name,
        size=size,
        codec=codec,
        timescale=timescale,
        offsets=offsets,
        sizes=sizes,
        dts=dts,
        pts=pts,
        keyframes=keys,
        media_start=shift,
        boxes=tuple(boxes),
        moov=(box.start, box.end),
        spans_read=tuple(get.spans),
        other_tracks=tuple(others),
    )
