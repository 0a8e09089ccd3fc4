"""Video decoding of frame ranges with PyAV.

:class:`VideoReader` keeps one container open and decodes forward. A request for frames at
timestamps ``t_0 <= t_1 <= ...`` seeks once to the keyframe at or before ``t_0`` (only when the
decoder is not already positioned before it), then decodes forward, matching decoded frames to
the wanted timestamps within a tolerance. Successive requests with increasing timestamps (a chunk
read block by block) never seek again. A few recently decoded frames are kept so that windows
looking back in time (``delta_timestamps`` with negative deltas) do not force a seek either.

The container is trusted, not ``info.json``: codec, size and frame times come from the stream.

:class:`VideoReader` holds one decoder's state: the open container, where the decoder stands,
the frames it just decoded and those it decoded ahead. The conversion of decoded frames to
planar RGB is :mod:`robo_resume.format.rgb`; a depth camera's reader (``depth`` set) gives
float32 millimetres instead (:mod:`robo_resume.format.depth`).
"""

from __future__ import annotations

import bisect
import io
import itertools
import os
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..errors import (
    CorruptFileError,
    MetadataMismatchError,
    MissingFileError,
    RoboResumeError,
    VideoDecodeError,
    describe,
)
from .file_access import LOCAL, FileAccess
from .mp4_ranges import READ_THROUGH
from .rgb import planar_rgb, planar_writer, row_addresses

if TYPE_CHECKING:  # av is imported where a file is opened (importing robo_resume stays light)
    from av.container import InputContainer
    from av.video.frame import VideoFrame
    from av.video.stream import VideoStream

    from .depth import DepthCodec  # (it imports torch: only the items layer loads it)

__all__ = [
    "VideoReader",
    "VideoStreamInfo",
    "decoded_in_this_process",
    "load_decoder_library",
    "probe_video",
]

# Open readers of this process. A forked child (a DataLoader worker) inherits their containers,
# and using or freeing one there goes wrong in two ways (reproduced by forking workers from
# a process whose decoders stood mid-stream: the first in tests/test_worker_start.py, the second
# on open50, a CorruptFileError in the worker):
# - with decoder threads (decoder_threads != 1, FFmpeg's frame threads), the threads do not
#   exist in the child: decoding on (or closing) the inherited decoder waits for them forever;
# - the container's file descriptor shares its file offset with the parent's (one open file
#   description), so parent and child reading on move each other's position: corrupt packets.
# So right after the fork the child detaches every open container and keeps the objects alive
# unfinalized (never closed or freed there); its readers reopen their files lazily, with new
# descriptors and new threads. This is what makes fork safe after decoding in the parent.
_OPEN: weakref.WeakSet = weakref.WeakSet()
_INHERITED: list = []
_DECODING_PIDS: set[int] = set()


def load_decoder_library() -> None:
    """Import PyAV (FFmpeg's libraries) now, without opening anything: what a process calls
    before forking DataLoader workers that will decode, so that each inherits the import
    instead of paying it on its first batch (per worker, and per epoch without persistent
    workers). No decoder
    and no FFmpeg thread exists after it, so forking stays as safe as before."""
    import av  # noqa: F401


def decoded_in_this_process() -> bool:
    """True once this process (not merely its parent) has opened a video decoder.

    Informational: forking DataLoader workers after decoding is safe (the child detaches the
    inherited decoders, see the comment above), so robo_resume does not change the start
    method because of it.
    """
    return os.getpid() in _DECODING_PIDS


def _detach_after_fork() -> None:
    """In a forked child: drop the inherited containers from their readers (kept alive)."""
    for reader in list(_OPEN):
        if reader._container is not None:
            _INHERITED.append((reader._container, reader._stream, reader._frames, reader._ahead))
            reader._container = reader._stream = reader._frames = None
            reader._last_time = None
            reader._cache = OrderedDict()
            reader._ahead = deque()
    _OPEN.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_detach_after_fork)


@dataclass(frozen=True)
class VideoStreamInfo:
    """Facts read from a video container (not from info.json)."""

    codec: str
    width: int
    height: int
    fps: float
    time_base: float
    num_frames: int
    duration_s: float


class VideoReader:
    """Sequential reader of one video file; see the module docstring for the decoding strategy.

    Args:
        path: the mp4 (or any container PyAV opens).
        threads: decoder threads; 0 lets FFmpeg choose (one per core).
        cache_frames: how many of the most recently decoded frames are kept (RGB, uint8).
        seek_threshold_s: when the next wanted frame is further ahead than this, seek instead of
            decoding through the gap.
        episode: only used in error messages.
        depth: the camera's :class:`~robo_resume.format.depth.DepthCodec` when it is a depth
            map: :meth:`frames_at` then gives float32 millimetres, one channel.
        files: where the file is read from (:data:`~robo_resume.format.file_access.LOCAL`, or
            a remote dataset's access, whose file objects fetch byte ranges, or one that serves
            a :class:`~robo_resume.format.ranged_file.RangedFile` of fetched pieces); each
            (re)open asks it for the file again.

    Not thread-safe. Picklable while closed; :meth:`close` releases the container.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int = 0,
        cache_frames: int = 8,
        seek_threshold_s: float = 2.0,
        episode: int | None = None,
        depth: DepthCodec | None = None,
        files: FileAccess = LOCAL,
    ) -> None:
        self.path = Path(path)
        self.files = files
        self._file: BinaryIO | io.RawIOBase | None = None  # what files.open gave, if no path
        self.depth = depth
        self.threads = threads
        self.cache_frames = max(int(cache_frames), 0)
        self.seek_threshold_s = seek_threshold_s
        self.episode = episode
        self._container: InputContainer | None = None
        self._stream: VideoStream | None = None
        self._frames: Iterator[VideoFrame] | None = None  # iterator of decoded frames
        self._last_time: float | None = None  # time of the last decoded frame (seconds)
        self._cache: OrderedDict[float, np.ndarray] = OrderedDict()
        # Frames decoded ahead by decode_ahead() and not yet consumed, unconverted (av frames,
        # refcounted FFmpeg buffers); a None or an exception last: the end or a decode error,
        # given to the consumer when it reaches that place (see _next_frame).
        self._ahead: deque = deque()
        self._time_base = 0.0
        self._size: tuple[int, int] = (0, 0)  # (width, height) of the stream's header
        self._cache_layout = False  # channels_first of the cached images
        self.seeks = 0  # number of seeks done (for tests and profiling)
        self.decoded = 0  # number of frames decoded

    @property
    def position(self) -> float | None:
        """Time (s) of the last decoded frame, or None when not positioned (closed, just seeked)."""
        return self._last_time

    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(_container=None, _stream=None, _frames=None, _last_time=None, _file=None)
        state["_cache"] = OrderedDict()
        state["_ahead"] = deque()
        return state

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the container; the reader can be used again (it reopens lazily)."""
        if _OPEN is not None:  # None while the interpreter shuts down
            _OPEN.discard(self)
        if self._container is not None:
            try:
                self._container.close()
            finally:
                self._container = None
                self._stream = None
                self._frames = None
                self._last_time = None
                self._cache.clear()
                self._ahead.clear()
                self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            f, self._file = self._file, None
            f.close()

    @property
    def where(self) -> str | Path:
        """The file as messages name it: its path, or its URL for a remote dataset."""
        return self.files.where(self.path)

    # -- opening ---------------------------------------------------------------------------
    def _open(self) -> InputContainer:
        if self._container is not None:
            return self._container
        import av

        if not self.files.is_file(self.path):
            raise MissingFileError(
                describe(
                    "A video file is missing",
                    expected="the mp4 that meta/ points to",
                    found="no such file",
                    file=self.where,
                    episode=self.episode,
                    fix="download the dataset's videos again, or select only episodes whose "
                    "videos exist with episodes=[...]",
                )
            )
        try:
            source = self.files.open(self.path)
            if not isinstance(source, str):
                self._file = source  # closed with the container (PyAV does not close it)
            container = av.open(source, mode="r")
        except RoboResumeError:  # a remote read that failed for good: its own message
            self._close_file()
            raise
        except Exception as exc:  # av.error.InvalidDataError, EOFError, ...
            self._close_file()
            raise CorruptFileError(
                describe(
                    "A video file cannot be opened",
                    expected="a readable video container",
                    found=f"{type(exc).__name__}: {exc}",
                    file=self.where,
                    episode=self.episode,
                    fix="download this file again; it is probably truncated or empty",
                )
            ) from exc
        if not container.streams.video:
            container.close()
            raise CorruptFileError(
                describe(
                    "A video file has no video stream",
                    expected="one video stream",
                    found="none",
                    file=self.where,
                    episode=self.episode,
                    fix="re-encode or download this file again",
                )
            )
        stream = container.streams.video[0]
        if stream.codec_context is None:  # FFmpeg has no decoder for the stream's codec tag
            container.close()
            raise CorruptFileError(
                describe(
                    "A video file's codec is unknown to FFmpeg",
                    expected="a video stream FFmpeg can decode (LeRobot writes AV1, h264 or hevc)",
                    found="a stream without a decoder (an unknown codec tag)",
                    file=self.where,
                    episode=self.episode,
                    fix="download this file again, or re-encode it with a standard codec",
                )
            )
        self._time_base = float(stream.time_base) if stream.time_base else 0.0
        self._size = (stream.codec_context.width, stream.codec_context.height)
        stream.thread_type = "AUTO"
        stream.thread_count = self.threads
        self._container = container
        self._stream = stream
        _OPEN.add(self)
        _DECODING_PIDS.add(os.getpid())
        return container

    def _opened(self) -> tuple[InputContainer, VideoStream]:
        """The container and its video stream, opened now if closed."""
        container = self._open()
        assert self._stream is not None  # _open sets both
        return container, self._stream

    def info(self) -> VideoStreamInfo:
        """Return codec, size, fps, frame count and duration read from the container."""
        container, s = self._opened()
        tb = float(s.time_base) if s.time_base else 0.0
        fps = float(s.average_rate) if s.average_rate else 0.0
        duration = float(s.duration * s.time_base) if s.duration and s.time_base else 0.0
        if not duration and container.duration:
            duration = container.duration / 1_000_000
        return VideoStreamInfo(
            codec=s.codec_context.name,
            width=s.codec_context.width,
            height=s.codec_context.height,
            fps=fps,
            time_base=tb,
            num_frames=int(s.frames or 0),
            duration_s=duration,
        )

    def start_time(self) -> float:
        """Time (s) of the stream's first frame according to the container header (no decoding)."""
        _, s = self._opened()
        if s.start_time is None or not s.time_base:
            return 0.0
        return float(s.start_time * s.time_base)

    def _wrong_size(self, frame, t: float) -> None:
        """Refuse a frame whose size differs from the stream header's (checked per frame: a
        stream that changes resolution mid-way would otherwise return frames of another size)."""
        w, h = self._size
        raise MetadataMismatchError(
            describe(
                "A video changes its frame size mid-stream",
                expected=f"every frame {h}x{w} (height x width, the stream header's)",
                found=f"a {frame.height}x{frame.width} frame at {t:.4f}s",
                file=self.where,
                episode=self.episode,
                fix="re-encode the video at one size (the one meta/info.json declares)",
            )
        )

    def keyframe_times(self) -> list[float]:
        """Times (seconds) of the keyframes, read from packets without decoding."""
        import av

        source = self.files.open(self.path)
        try:
            with av.open(source, mode="r") as c:
                s = c.streams.video[0]
                tb = float(s.time_base) if s.time_base else 0.0
                times = sorted(
                    float(p.pts * tb) for p in c.demux(s) if p.pts is not None and p.is_keyframe
                )
        finally:
            if not isinstance(source, str):
                source.close()
        return times

    # -- decoding --------------------------------------------------------------------------
    def _seek(self, t: float) -> None:
        container, stream = self._opened()
        # Rounded, not truncated: timestamps come from float32 parquet columns, so a keyframe's
        # time (250/30 s: 127999.995 ticks of 1/15360) truncated one tick short seeks a whole
        # GOP back, decoded and thrown away.
        target = max(round(t / self._time_base), 0)
        try:
            if getattr(self._file, "parks", False):
                self._park(container, stream, t)
            container.seek(target, stream=stream, backward=True, any_frame=False)
        except RoboResumeError:  # a remote read that failed for good: its own message
            raise
        except Exception as exc:
            raise CorruptFileError(
                describe(
                    "Seeking in a video file failed",
                    expected=f"a seekable stream (seek to {t:.4f}s)",
                    found=f"{type(exc).__name__}: {exc}",
                    file=self.where,
                    episode=self.episode,
                    fix="download this file again",
                )
            ) from exc
        self.seeks += 1
        self._frames = container.decode(stream)
        self._last_time = None
        # Frames come out in presentation order from here on; the cache must stay sorted by time.
        self._cache.clear()
        self._ahead.clear()

    def _park(self, container: InputContainer, stream: VideoStream, t: float) -> None:
        """Before a seek to ``t`` in a file whose reads are fetched ranges (``parks``, a remote
        file), move FFmpeg's read position to the file's first sample (one packet demuxed, not
        decoded) where it would otherwise read through to the chunk.

        FFmpeg reads through a forward jump of up to 64 KiB from its buffer instead of
        seeking (``robo_resume.format.mp4_ranges.READ_THROUGH``): from a chunk it just read
        to the next chunk of the file, it would read the bytes between them, which no plan
        fetched. With the file's sample tables (``sample_table``) the decoder parks only when
        the chunk's first byte lies within that distance (twice it, for a seek landing a
        keyframe off) after the read position; farther, or behind it, FFmpeg seeks for real.
        From the first sample (held since the file was opened) a seek to a chunk is a real
        seek, except for chunks just past it: for those, when the file is large enough, the
        decoder parks once more at the last keyframe (also held;
        :meth:`~robo_resume.format.mp4_ranges.SampleTable.parks_twice`), else their planned
        ranges reach back to the first sample (``robo_resume.items.read_plan``)."""
        table = getattr(self._file, "sample_table", None)
        start = None
        if table is not None and table.num_frames:
            start = table.seek_start(t)
            at = self._file.tell()  # type: ignore[union-attr]
            if not at < start <= at + 2 * READ_THROUGH:
                return
        container.seek(0, stream=stream, backward=True, any_frame=False)
        for _ in container.demux(stream):
            break
        if table is not None and start is not None and table.parks_twice(start):
            end = round((float(table.frame_times[-1]) + 1.0) / self._time_base)
            container.seek(end, stream=stream, backward=True, any_frame=False)
            for _ in container.demux(stream):
                break

    def _next_frame(self):
        """The next decoded frame (None at the end): one held by :meth:`decode_ahead` if any."""
        if self._ahead:
            frame = self._ahead.popleft()
            if isinstance(frame, BaseException):
                raise frame  # the decode error met ahead, raised where reading reaches it
            return frame
        return self._decode()

    def _decode(self):
        assert self._frames is not None  # callers seek first
        try:
            frame = next(self._frames)
        except StopIteration:
            return None
        except RoboResumeError:  # a remote read that failed for good: its own message
            raise
        except Exception as exc:  # av.error.InvalidDataError and friends
            raise CorruptFileError(
                describe(
                    "A video file cannot be decoded",
                    expected="decodable frames",
                    found=f"{type(exc).__name__}: {exc}",
                    file=self.where,
                    episode=self.episode,
                    fix="download this file again; it is probably truncated",
                )
            ) from exc
        self.decoded += 1
        return frame

    def decode_ahead(self, until: float, *, tolerance_s: float = 1e-4) -> None:
        """Decode now the frames after the decoder's position up to time ``until`` (seconds, in
        the file) and hold them unconverted for the next :meth:`frames_at` calls.

        Nothing changes in what :meth:`frames_at` returns or raises: it takes the held frames
        first, as if decoding them then, and converts each straight into its place. A decode
        error (or the end of the stream) met ahead is held in its place and raised (returned)
        when reading reaches it. Held frames are in FFmpeg's decoded pixel format (YUV 4:2:0:
        half the bytes of RGB), referenced, not copied; a seek or :meth:`close` drops them, so
        does :meth:`drop_ahead`. Does nothing when the decoder is not positioned.
        """
        if self._frames is None or self._last_time is None:
            return
        ahead, tb = self._ahead, self._time_base
        last = self._last_time
        if ahead:
            frame = ahead[-1]
            if frame is None or isinstance(frame, BaseException):
                return
            last = frame.pts * tb if frame.pts is not None else float(frame.time)
        while last < until - tolerance_s:
            try:
                frame = self._decode()
            except CorruptFileError as exc:
                ahead.append(exc)
                return
            ahead.append(frame)
            if frame is None:
                return
            last = frame.pts * tb if frame.pts is not None else float(frame.time)

    def count_ahead(self, timestamps: Sequence[float], *, tolerance_s: float = 1e-4) -> int:
        """How many of ``timestamps`` (increasing, after the decoder's position), from the
        first, are the next held frames (:meth:`decode_ahead`) one to one, each within
        ``tolerance_s`` and of the stream's size; :meth:`take_ahead` gives those frames.

        Anything else (a gap, a duplicate, a frame of another size, a held error or the end)
        ends the count there: :meth:`frames_at` reads on from that place, with its checks.
        """
        if self._last_time is None:
            return 0
        tb, size, count = self._time_base, self._size, 0
        for frame, want in zip(self._ahead, timestamps, strict=False):
            if frame is None or isinstance(frame, BaseException):
                break
            t = frame.pts * tb if frame.pts is not None else float(frame.time)
            if abs(want - t) >= tolerance_s or (size[0] and (frame.width, frame.height) != size):
                break
            count += 1
        return count

    def take_ahead(self, count: int) -> list:
        """The next ``count`` held frames, unconverted (``av.VideoFrame``; :func:`planar_rgb`
        converts one); the decoder's position moves past them. ``count`` must not exceed
        :meth:`count_ahead`'s. Frames taken this way do not go into the look-back cache (it
        serves windows looking back; a camera read this way has none, see
        :meth:`EpisodeRangeReader.ahead`).
        """
        ahead = self._ahead
        frames = [ahead.popleft() for _ in range(count)]
        if frames:
            f = frames[-1]
            self._last_time = f.pts * self._time_base if f.pts is not None else float(f.time)
        return frames

    def drop_ahead(self) -> None:
        """Forget the frames held by :meth:`decode_ahead` (the decoder stays where it is,
        so the next read seeks)."""
        if self._ahead:
            self._ahead.clear()
            self._last_time = None  # the decoder stands past them: make the next read seek

    def _remember(self, t: float, image: np.ndarray) -> None:
        if self.cache_frames == 0:
            return
        self._cache[t] = image
        while len(self._cache) > self.cache_frames:
            self._cache.popitem(last=False)

    def frames_at(
        self,
        timestamps: np.ndarray | list[float],
        *,
        tolerance_s: float = 1e-4,
        frame_numbers: list[int] | None = None,
        channels_first: bool = False,
        out: np.ndarray | None = None,
        rows: Sequence[int] | np.ndarray | None = None,
    ) -> np.ndarray:
        """Return RGB uint8 frames ``(n, H, W, 3)`` shown at ``timestamps`` (seconds, in the file).

        A depth camera's reader (:attr:`depth` set) gives float32 millimetres ``(n, H, W, 1)``
        (``(n, 1, H, W)`` with ``channels_first``) instead, as lerobot returns depth maps.

        With ``channels_first`` the frames are ``(n, 3, H, W)`` with the same values, converted
        by FFmpeg straight to planar RGB (see :func:`planar_rgb`), which saves the slow
        interleaved-to-planar copy torch needs for lerobot's ``(C, H, W)`` layout.

        ``timestamps`` must be non-decreasing. A frame matches a timestamp when their times
        differ by less than ``tolerance_s`` (lerobot's default is 1e-4 s). Raises
        :class:`VideoDecodeError` naming the file, episode and frame if a timestamp has no
        frame (``frame_numbers`` gives the frame indices used in that message).

        With ``out`` (an array with frames along its first axis, ``(3, H, W)`` or ``(H, W, 3)``
        per frame to match ``channels_first``), the frame for ``timestamps[i]`` is decoded
        straight into ``out[rows[i]]`` (``rows`` defaults to ``0..n-1``) and ``out`` is returned:
        the streaming path decodes into its batch buffer this way, without another copy.
        """
        ts = np.asarray(timestamps, dtype=np.float64)
        n = len(ts)
        depth = self.depth
        channels, dtype = (1, np.float32) if depth is not None else (3, np.uint8)
        if n == 0:
            return out if out is not None else np.zeros((0, 0, 0, channels), dtype=dtype)
        want = ts.tolist()
        # a few timestamps per call on the stream's path: a loop over the list beats np.diff
        if n > 1 and any(b < a for a, b in itertools.pairwise(want)):
            raise ValueError("frames_at needs non-decreasing timestamps")
        if out is not None:
            if rows is None:
                at = list(range(n))
            elif isinstance(rows, np.ndarray) and rows.dtype.kind in "iu":
                at = rows.tolist()  # Python ints, as below, without a call per row
            else:
                at = [int(r) for r in rows]
            if len(at) != n:
                raise ValueError(f"frames_at: {n} timestamps but {len(at)} rows of out")
        else:
            at = None

        # 1) frames still in the cache (look-back windows)
        if self._cache and self._cache_layout == channels_first:
            filled = [False] * n
            keys = list(self._cache)
            for i, t in enumerate(want):
                j = bisect.bisect_left(keys, t - tolerance_s)
                if j < len(keys) and abs(keys[j] - t) < tolerance_s:
                    image = self._cache[keys[j]]
                    if out is None:
                        out = np.empty((n, *image.shape), dtype=image.dtype)
                    out[i if at is None else at[i]] = image
                    filled[i] = True
            pending = [i for i in range(n) if not filled[i]]
        else:
            pending = list(range(n))
        if not pending:
            assert out is not None  # n > 0 frames, all from the cache
            return out

        addr0, step = row_addresses(out) if channels_first and depth is None else (None, 0)
        writer: Any = None  # a gbrp_writer for the stream's frames once known good (else falsy)
        recent: deque = deque(maxlen=self.cache_frames)  # (time, image) of the newest frames
        for k, end, frame, t in self._walk(
            [want[i] for i in pending],
            tolerance_s,
            ts,
            pending,
            frame_numbers,
            on_the_way=bool(recent.maxlen),
        ):
            if k < 0:  # decoded on the way to a wanted frame: kept for look-backs
                if depth is not None:
                    image = depth.frames([frame])[0]
                    recent.append((t, image if channels_first else image.transpose(1, 2, 0)))
                    continue
                image = frame.to_ndarray(format="rgb24")
                recent.append((t, image.transpose(2, 0, 1) if channels_first else image))
                continue
            if out is None:
                h, w = frame.height, frame.width
                shape = (n, channels, h, w) if channels_first else (n, h, w, channels)
                out = np.empty(shape, dtype)
                addr0, step = row_addresses(out) if channels_first and depth is None else (None, 0)
            row = pending[k] if at is None else at[pending[k]]
            image = out[row]
            if depth is not None:
                depth.write(frame, image[0] if channels_first else image[..., 0])
            elif channels_first:
                address = None if addr0 is None else addr0 + row * step
                if writer is None and address is not None:
                    writer = planar_writer(frame) or False
                if not (writer and address is not None and writer(frame, address)):
                    planar_rgb(frame, image, address)
                    if writer is False and address is not None:  # asked once more: the
                        writer = planar_writer(frame) or 0  # first frame checked the format
            else:
                image[...] = frame.to_ndarray(format="rgb24")
            for k2 in range(k + 1, end):  # the same frame asked for again
                out[pending[k2] if at is None else at[pending[k2]]] = image
            if recent.maxlen:
                recent.append((t, image))
        if recent and self._cache_layout != channels_first:
            self._cache.clear()
            self._cache_layout = channels_first
        for t, image in recent:  # copies: the cache must not keep `out` alive
            self._remember(t, np.ascontiguousarray(image).copy())
        assert out is not None  # n > 0 frames, each decoded into it
        return out

    def _walk(
        self,
        want,
        tolerance_s,
        ts,
        pending,
        frame_numbers,
        *,
        on_the_way: bool,
        seek_threshold_s: float | None = None,
    ):
        """Decode forward to the frames shown at ``want`` (non-decreasing seconds), seeking
        first when the decoder is not positioned before ``want[0]`` (or far before it).

        Yields ``(k, end, frame, t)`` for the decoded frame at time ``t`` that matches
        ``want[k:end]`` (within ``tolerance_s``), and ``(-1, -1, frame, t)`` for a frame
        decoded on the way after ``want[0]`` when ``on_the_way``. Raises
        :class:`VideoDecodeError` for a wanted time without a frame (``ts[pending[k]]`` and
        ``frame_numbers`` name it), :class:`MetadataMismatchError` for a frame of another size.
        ``seek_threshold_s``: instead of :attr:`seek_threshold_s`.
        """
        first = want[0]
        ahead = self.seek_threshold_s if seek_threshold_s is None else seek_threshold_s
        self._open()
        if (
            self._frames is None
            or self._last_time is None
            or first < self._last_time + tolerance_s  # at or before a frame already passed
            or first - self._last_time > ahead
        ):
            self._seek(first)
            fresh_seek = True
        else:
            fresh_seek = False
        keep_from = first - tolerance_s
        tb = self._time_base
        k, m = 0, len(want)
        while k < m:
            frame = self._next_frame()
            if frame is None:
                self._raise_missing(ts, pending[k], frame_numbers, end=True)
            pts = frame.pts
            t = pts * tb if pts is not None else float(frame.time)
            if fresh_seek:
                fresh_seek = False
                if t > first + tolerance_s:
                    # The container's index put us after the wanted time: restart from 0.
                    self._seek(0.0)
                    continue
            self._last_time = t
            if t < keep_from:
                continue
            if (frame.width, frame.height) != self._size and self._size[0]:
                self._wrong_size(frame, t)
            if abs(want[k] - t) < tolerance_s:
                end = k + 1
                while end < m and abs(want[end] - t) < tolerance_s:
                    end += 1
                yield k, end, frame, t
                k = end
            elif want[k] < t - tolerance_s:
                self._raise_missing(ts, pending[k], frame_numbers, near=t)
            elif on_the_way:
                yield -1, -1, frame, t

    def hold(
        self,
        timestamps: Sequence[float],
        *,
        tolerance_s: float = 1e-4,
        frame_numbers: list[int] | None = None,
        keep: Callable[[Any], Any] | None = None,
        seek_threshold_s: float | None = None,
    ) -> list:
        """The decoded frames shown at ``timestamps`` (increasing seconds, in the file), as
        decoded: ``av.VideoFrame`` s in FFmpeg's pixel format (YUV 4:2:0 for what LeRobot
        writes: half the bytes of RGB), referenced, not copied; :func:`planar_rgb` converts one
        to the values :meth:`frames_at` gives. For the shuffle order, which holds a chunk's
        frames until it emits them. Seeks and checks as :meth:`frames_at` does (the same errors
        for a missing frame or one of another size); the look-back cache is not used or filled.
        """
        want = [float(t) for t in timestamps]
        if not want:
            return []
        if any(b <= a for a, b in itertools.pairwise(want)):
            raise ValueError("hold needs increasing timestamps")
        out = []
        ts = np.asarray(want)
        for _, _, frame, _ in self._walk(
            want,
            tolerance_s,
            ts,
            range(len(want)),
            frame_numbers,
            on_the_way=False,
            seek_threshold_s=seek_threshold_s,
        ):
            out.append(frame if keep is None else keep(frame))
        return out

    def _raise_missing(self, ts, i, frame_numbers, *, end: bool = False, near: float | None = None):
        frame = frame_numbers[i] if frame_numbers is not None else None
        found = (
            f"the video ends before {ts[i]:.4f}s (decoded up to "
            f"{self._last_time if self._last_time is not None else 0:.4f}s)"
            if end
            else f"no frame within tolerance of {ts[i]:.4f}s (nearest decoded frame at {near:.4f}s)"
        )
        raise VideoDecodeError(
            describe(
                "A requested video frame is not in the file",
                expected=f"a frame at {ts[i]:.4f}s",
                found=found,
                file=self.where,
                episode=self.episode,
                frame=frame,
                fix="the video is shorter than or out of sync with the parquet timestamps; "
                "download it again, or raise tolerance_s if timestamps are slightly off",
            )
        )


def probe_video(path: str | Path) -> VideoStreamInfo:
    """Open ``path`` and return its :class:`VideoStreamInfo`."""
    with VideoReader(path) as r:
        return r.info()
