"""LeRobot-compatible items, built for a contiguous frame range in one pass.

An item is the dict ``LeRobotDataset.__getitem__`` returns (lerobot 0.6.1): one tensor per data
column (floats as float32, ints as int64, 0-d for scalars), one ``(C, H, W)`` image per camera
(float32 in [0, 1] by default, or uint8), a ``str`` per ``dtype: string`` feature,
``delta_timestamps`` windows stacked along a new first axis with ``<key>_is_pad`` masks (indices
clamped to the episode, so edge frames repeat), and the ``task`` string. Cameras are the video
features and the ``dtype: image`` features (PNG or JPEG files in the data parquet, decoded by
:func:`~robo_resume.format.images.decode_image`); ``image_dtype`` and ``image_transforms`` apply
to both kinds alike. :class:`EpisodeRangeReader` reads the rows of a frame range once and keeps
one decoder per camera open, so a range is built with one parquet read and one seek per camera.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DatasetFormatError, MetadataMismatchError, describe
from .format.images import decode_image
from .format.metadata import DatasetMeta, EpisodeInfo
from .format.tabular import ParquetTable
from .format.validate import inside_root
from .format.video import VideoReader

__all__ = ["EpisodeRangeReader", "ItemBuilder", "ItemOptions", "unbind"]

IMAGE_DTYPES = ("float32", "uint8")
IDLE_DECODERS = 8
"""Open decoders an :class:`ItemBuilder` keeps for reuse (a few MB each at most)."""


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
        if meta.features[key].get("dtype") == "string":
            raise ValueError(
                describe(
                    f"delta_timestamps names the string feature '{key}'",
                    expected="numeric, video or image features (windows are stacked tensors)",
                    found=f"'{key}' of dtype 'string' (lerobot's LeRobotDataset fails on it too, "
                    "with a TypeError from torch.stack)",
                    file=meta.root / "meta" / "info.json",
                    fix=f"leave '{key}' out of delta_timestamps; items still hold its string",
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


def _empty(shape: torch.Size, dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised tensor, in shared memory when ``shared`` (as default_collate does)."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    numel = 1
    for d in shape:
        numel *= d
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


class BufferPool:
    """Large output buffers, reused once nothing refers to them any more.

    A fresh 100 MB tensor costs more to fault in page by page (the kernel zeroes every page)
    than the uint8 -> float32 conversion that fills it; a training loop that drops each batch
    before (or right after) asking for the next needs only two buffers in turn. :meth:`empty`
    returns a tensor over a pooled numpy buffer; when the last reference to its memory goes
    (the tensor, its views, arrays made from it), the buffer returns to the pool. At most
    ``keep`` free buffers per shape and dtype are held; requests smaller than ``min_bytes``
    are plain ``torch.empty``.

    Thread-safe without a lock: a buffer returns from a finalizer, which the garbage collector
    can run at any allocation, also inside :meth:`empty` of the same thread (a lock held there
    would deadlock); the free lists only use ``list.pop`` and ``list.append``, which are
    atomic in CPython.
    """

    def __init__(self, keep: int = 2, min_bytes: int = 1 << 20) -> None:
        self.keep, self.min_bytes = keep, min_bytes
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self.reused = 0  # buffers handed out again (tests and benchmarks read it)

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised CPU tensor of ``shape`` and ``dtype`` (see the class)."""
        shape = tuple(int(d) for d in shape)
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        if int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize < self.min_bytes:
            return torch.empty(shape, dtype=dtype)
        key = (shape, np_dtype.str)
        try:
            base = self._free.setdefault(key, []).pop()
            self.reused += 1
        except IndexError:
            base = np.empty(shape, dtype=np_dtype)
        view = base.view()  # the tensor's storage holds this array; its death frees `base`
        weakref.finalize(view, self._put, key, base)
        return torch.from_numpy(view)

    def _put(self, key: tuple[tuple[int, ...], str], base: np.ndarray) -> None:
        free = self._free.setdefault(key, [])
        if len(free) < self.keep:  # two threads at once may keep one more: harmless
            free.append(base)

    def clear(self) -> None:
        """Drop the free buffers (memory in use stays with its tensors)."""
        self._free.clear()


BUFFERS = BufferPool()
"""The process's pool for float32 images and uint8 batches built in this process."""


def to_float(src: torch.Tensor, shared: bool = False) -> torch.Tensor:
    """uint8 images -> float32 in [0, 1] (``x / 255``, the values lerobot computes).

    One pass into a pooled buffer (:data:`BUFFERS`), or into shared memory when ``shared``.
    """
    if shared:
        dst = _empty(src.shape, torch.float32, True)
    else:
        dst = BUFFERS.empty(src.shape, torch.float32)
    np.divide(src.numpy(), np.float32(255), out=dst.numpy(), dtype=np.float32)
    return dst


def _lerobot_dtype(values: np.ndarray) -> np.dtype | None:
    """lerobot's dtype for a numpy column: floats float32, integers int64, bools bool."""
    kind = values.dtype.kind
    if kind == "f":
        return np.dtype(np.float32)
    if kind in "iu":
        return np.dtype(np.int64)
    if kind == "b":
        return np.dtype(bool)
    return None


def _to_tensor(values: np.ndarray) -> torch.Tensor:
    """numpy -> torch with lerobot's dtypes: floats float32, integers int64, bools bool."""
    dtype = _lerobot_dtype(values)
    if dtype is None:
        return torch.as_tensor(values)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))


_ALIGN = 64


def shared_views(specs: Mapping[str, tuple[Sequence[int], np.dtype]]) -> dict[str, torch.Tensor]:
    """Uninitialised tensors ``{key: (shape, numpy dtype)}`` over ONE shared-memory storage.

    A DataLoader worker hands each shared storage to the main process through its own file
    descriptor (a socket round trip per storage); a batch of a dozen columns in one storage
    crosses several times faster than a dozen storages. Each tensor starts on a 64-byte
    boundary.
    """
    at, total = {}, 0
    for key, (shape, dtype) in specs.items():
        total = -(-total // _ALIGN) * _ALIGN
        at[key] = total
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    storage = torch.UntypedStorage._new_shared(max(total, 1))
    out = {}
    for key, (shape, dtype) in specs.items():
        t = torch.from_numpy(np.empty(0, dtype=dtype))
        out[key] = t.set_(storage, at[key] // t.element_size(), tuple(shape))
    return out


def _pack_shared(columns: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Numpy columns as lerobot-typed tensors in one shared-memory storage (see shared_views)."""
    dtypes = {k: _lerobot_dtype(v) for k, v in columns.items()}
    out = shared_views({k: (v.shape, dtypes[k]) for k, v in columns.items()})
    for k, v in columns.items():
        out[k].numpy()[...] = v
    return out


class ItemBuilder:
    """Builds LeRobot-compatible items for one dataset; shared by the reader and the streams.

    Holds lazily opened parquet tables (one per data file). Picklable before use.
    """

    def __init__(self, meta: DatasetMeta, options: ItemOptions | None = None) -> None:
        self.meta = meta
        self.options = options or ItemOptions()
        self.delta = delta_indices(self.options.delta_timestamps, meta, self.options.tolerance_s)
        self.columns = meta.data_columns()
        self._cameras = frozenset(meta.visual_keys)  # converted and transformed as images
        self.image_keys = frozenset(meta.image_keys)  # decoded from parquet bytes in raw()
        self._strings = frozenset(meta.string_keys)
        self._tables: dict[str, ParquetTable] = {}
        self._idle: OrderedDict[int, VideoReader] = OrderedDict()  # id -> reader, oldest first
        self.decoder_threads = self.options.decoder_threads
        self.camera_threads = 1  # cameras decoded concurrently (the stream sets it)
        self._pool: tuple[int, Any] | None = None  # (pid, ThreadPoolExecutor)
        rows: dict[str, int] = {}
        for ep in meta.episodes:
            rows[ep.data_path] = rows.get(ep.data_path, 0) + ep.length
        self._file_rows = rows
        self._checked: set[str] = set()
        self._videos_checked: set[str] = set()
        d = self.delta or {}
        lo = [int(v.min()) for v in d.values()]
        hi = [int(v.max()) for v in d.values()]
        self.window_before = max(0, -min(lo)) if lo else 0
        self.window_after = max(0, max(hi)) if hi else 0

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tables"] = {}
        state["_idle"] = OrderedDict()
        state["_pool"] = None
        state["_checked"] = set()
        state["_videos_checked"] = set()
        return state

    def table(self, ep: EpisodeInfo) -> ParquetTable:
        """The (cached) parquet table holding ``ep``'s rows, its row count checked once."""
        t = self._tables.get(ep.data_path)
        if t is None:
            t = ParquetTable(
                inside_root(self.meta.root, ep.data_path, episode=ep.episode_index),
                fps=self.meta.fps if self.meta.camera_keys else None,
                tolerance_s=self.options.tolerance_s,
                features=self.meta.features,
            )
            self._tables[ep.data_path] = t
        if ep.data_path not in self._checked:
            t.check_rows(ep.data_row_start + ep.length, episode=ep.episode_index)
            expected = self._file_rows[ep.data_path]
            if t.num_rows != expected:
                raise MetadataMismatchError(
                    describe(
                        "Episode metadata and the data file disagree on the number of rows",
                        expected=f"{expected} rows (sum of the lengths of the episodes in it)",
                        found=f"{t.num_rows} rows",
                        file=t.path,
                        episode=ep.episode_index,
                        fix="the dataset is inconsistent; download it again or rebuild meta/",
                    )
                )
            self._checked.add(ep.data_path)
        return t

    def video(self, path: Path, *, episode: int, cache_frames: int) -> VideoReader:
        """A decoder for ``path``: an idle one kept open by :meth:`release` if there is one.

        Several episodes of a v3.0 dataset share one mp4; reusing its open decoder saves the
        container open and, when the next range starts after its position, the seek too.
        Among idle decoders of the file, the one stopped latest is taken.
        """
        best = None
        for key, r in self._idle.items():
            if r.path == path and (best is None or (r.position or -1) > (best[1].position or -1)):
                best = (key, r)
        if best is None:
            return VideoReader(
                inside_root(self.meta.root, path.relative_to(self.meta.root), episode=episode),
                threads=self.decoder_threads,
                cache_frames=cache_frames,
                episode=episode,
            )
        reader = self._idle.pop(best[0])
        reader.episode, reader.cache_frames = episode, cache_frames
        return reader

    def check_video(self, camera: str, reader: VideoReader) -> None:
        """Compare a video file with info.json (size, fps) and with the episode metadata (where
        each episode starts), once per file."""
        key = str(reader.path)
        if key not in self._videos_checked:
            info = reader.info()
            self.meta.check_video_stream(camera, info, file=reader.path, episode=reader.episode)
            self._check_video_starts(camera, reader, info)
            self._videos_checked.add(key)

    def _check_video_starts(self, camera: str, reader: VideoReader, info: Any) -> None:
        """Each episode of a shared mp4 starts at the frame after the episodes before it.

        Episodes are concatenated in one mp4 in time order, so the episode at ``from_timestamp``
        ``f`` starts at frame ``round((f - t0) * fps)`` (``t0``: the container's first frame
        time), which must equal the summed lengths of the episodes before it in the file. A
        ``from_timestamp`` off by whole frames still finds frames (the neighbours), silently;
        this catches it from the metadata and the container header alone, with no decoding.
        """
        rel = reader.path.relative_to(self.meta.root).as_posix()
        members = sorted(
            (e.videos[camera].from_timestamp, e.episode_index, e.length)
            for e in self.meta.episodes
            if camera in e.videos and e.videos[camera].path == rel
        )
        fps = float(info.fps or self.meta.fps)
        t0 = reader.start_time()
        start = 0
        for from_ts, episode, length in members:
            at = (from_ts - t0) * fps
            if abs(at - start) > 0.5:
                raise MetadataMismatchError(
                    describe(
                        f"An episode's from_timestamp for '{camera}' does not point at its first "
                        "frame in the video",
                        expected=f"from_timestamp {t0 + start / fps:.6f} (frame {start} of the "
                        "file: the summed lengths of the episodes before it in this mp4)",
                        found=f"from_timestamp {from_ts:.6f} (frame {at:.2f})",
                        file=reader.path,
                        episode=episode,
                        frame=0,
                        fix="every frame of the episode would be read from another time; set "
                        f"videos/{camera}/from_timestamp in meta/episodes to the episode's "
                        "start in the mp4, or download meta/ again",
                    )
                )
            start += length
        # More frames than its episodes: the file belongs to other episodes (fewer frames are
        # reported when decoding, naming the first missing frame).
        if info.num_frames > start:
            raise MetadataMismatchError(
                describe(
                    f"A video of '{camera}' holds another number of frames than its episodes",
                    expected=f"{start} frames (the lengths of the {len(members)} episodes whose "
                    f"videos/{camera} point to this file)",
                    found=f"{info.num_frames} frames in the container",
                    file=reader.path,
                    episode=reader.episode,
                    fix="the file belongs to other episodes; download it again, or "
                    "rebuild meta/ if the video is right",
                )
            )

    def map_cameras(self, fn: Callable[[str], Any], cameras: Sequence[str]) -> list[Any]:
        """``[fn(cam) for cam in cameras]``, on ``camera_threads`` threads when above 1.

        PyAV decodes and converts frames without holding the GIL, so the cameras of one range
        decode in parallel. Each camera has its own decoder; nothing else is shared.
        """
        if self.camera_threads <= 1 or len(cameras) < 2:
            return [fn(cam) for cam in cameras]
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:  # none yet, or inherited over a fork
            from concurrent.futures import ThreadPoolExecutor

            self._pool = (pid, ThreadPoolExecutor(self.camera_threads, "robo_resume-decode"))
        return list(self._pool[1].map(fn, cameras))

    def release(self, reader: VideoReader) -> None:
        """Keep ``reader`` open for reuse; the oldest idle decoders beyond the limit close."""
        self._idle[id(reader)] = reader
        while len(self._idle) > IDLE_DECODERS:
            self._idle.popitem(last=False)[1].close()

    def close(self) -> None:
        """Close the idle decoders."""
        while self._idle:
            self._idle.popitem()[1].close()

    def finish(
        self,
        raw: Mapping[str, np.ndarray],
        *,
        image_dtype: str | None = None,
        shared: bool = False,
    ) -> dict[str, Any]:
        """Convert numpy columns from :meth:`EpisodeRangeReader.raw` to item columns.

        Cameras (video and image features) become ``(..., C, H, W)`` tensors (float32 in
        [0, 1], or uint8 when ``image_dtype`` or the options say so) with ``image_transforms``
        applied item by item, data columns get lerobot's dtypes, ``task`` and string features
        become lists of ``str``. At most one copy
        per camera (the float conversion), written straight into shared memory when ``shared``
        (a DataLoader worker: the batch then crosses to the main process without another copy).
        A camera value that is already a uint8 tensor (decoded into its final buffer, see
        :meth:`camera_buffers`) is used as it is when no conversion is asked for.
        """
        dtype = torch.float32 if (image_dtype or self.options.image_dtype) == "float32" else None
        transform = self.options.image_transforms
        tasks = self.meta.tasks
        out: dict[str, Any] = {}
        for key, v in raw.items():
            if key in self._cameras:
                ready = isinstance(v, torch.Tensor)  # decoded into its final buffer already
                t = v if ready else torch.from_numpy(v)  # (..., C, H, W) uint8
                if transform is None and dtype is None and (ready or not shared):
                    out[key] = t  # already in place: no copy
                    continue
                if transform is None:
                    if dtype is not None:
                        t = to_float(t, shared)
                    else:
                        t = _empty(t.shape, torch.uint8, shared).copy_(t)
                else:
                    t = t.to(dtype) / 255 if dtype is not None else t.contiguous()
                    t = torch.stack([transform(img) for img in t])
                out[key] = t
            elif key == "task":
                out[key] = [tasks[i] for i in v.tolist()]
            elif key in self._strings:
                out[key] = [str(x) for x in v.tolist()]
            elif shared and _lerobot_dtype(v) is not None:
                out[key] = None  # packed below, in this place
            else:
                out[key] = _to_tensor(v)
        if shared:
            out.update(_pack_shared({k: raw[k] for k, v in out.items() if v is None}))
        return out

    def camera_shape(self, camera: str) -> tuple[int, ...] | None:
        """One item's shape of ``camera``: ``(3, H, W)``, or ``(w, 3, H, W)`` with a delta window
        of ``w`` > 1 frames; None when info.json does not give the frame size."""
        size = self.meta.frame_size(camera)
        if size is None:
            return None
        d = (self.delta or {}).get(camera)
        w = 1 if d is None else len(d)
        return (3, *size) if w == 1 else (w, 3, *size)

    def camera_buffers(
        self, cameras: Sequence[str], n: int, *, shared: bool
    ) -> dict[str, torch.Tensor]:
        """Uninitialised uint8 tensors for ``n`` items of each camera to decode into.

        All in one shared-memory storage when ``shared`` (a worker's batch, see
        :func:`shared_views`), else from :data:`BUFFERS`. Cameras whose shape is unknown (see
        :meth:`camera_shape`) are left out.
        """
        shapes = {c: self.camera_shape(c) for c in cameras}
        shapes = {c: (n, *s) for c, s in shapes.items() if s is not None}
        if shared:
            return shared_views({c: (s, np.dtype(np.uint8)) for c, s in shapes.items()})
        return {c: BUFFERS.empty(s, torch.uint8) for c, s in shapes.items()}

    def episode_reader(
        self, episode_index: int, start: int, stop: int, *, cache_frames: int | None = None
    ) -> EpisodeRangeReader:
        """Open a reader for frames ``[start, stop)`` of an episode (rows read at once)."""
        return EpisodeRangeReader(self, episode_index, start, stop, cache_frames=cache_frames)

    def build_range(self, episode_index: int, start: int, stop: int) -> list[dict[str, Any]]:
        """Return the items of frames ``[start, stop)`` of an episode, in frame order."""
        with self.episode_reader(episode_index, start, stop) as r:
            return r.items(range(start, stop))


class EpisodeRangeReader:
    """Reads items of frames ``[start, stop)`` of one episode, in increasing frame order.

    The parquet rows of the range (plus the delta window around it) are read on construction;
    video is decoded on demand by one :class:`VideoReader` per camera, moving forward, so calling
    :meth:`items` on successive blocks decodes each frame once with one seek per camera.
    """

    def __init__(
        self,
        builder: ItemBuilder,
        episode_index: int,
        start: int,
        stop: int,
        *,
        cache_frames: int | None = None,
    ) -> None:
        meta = builder.meta
        ep = meta.episode(episode_index)
        if not 0 <= start < stop <= ep.length:
            raise IndexError(
                describe(
                    "Frame range outside the episode",
                    expected=f"0 <= start < stop <= {ep.length}",
                    found=f"[{start}, {stop})",
                    episode=episode_index,
                )
            )
        self.builder = builder
        self.ep = ep
        self.start, self.stop = start, stop
        self.lo = max(0, start - builder.window_before)
        self.hi = min(ep.length, stop + builder.window_after)
        table = builder.table(ep)
        self.rows = table.read(
            ep.data_row_start + self.lo,
            ep.data_row_start + self.hi,
            builder.columns,
            episode=ep.episode_index,
        )
        self.path = table.path
        self._check_rows(table.path)
        self.timestamps = (
            self.rows["timestamp"].astype(np.float64)
            if "timestamp" in self.rows
            else (np.arange(self.lo, self.hi, dtype=np.float64) / meta.fps)
        )
        if cache_frames is None:
            cache_frames = builder.window_before  # look-back windows; nothing else re-reads
        self._cache_frames = cache_frames
        self.videos: dict[str, VideoReader] = {}  # acquired from the builder on first use

    def _check_rows(self, path) -> None:
        ep = self.ep
        tasks = self.rows.get("task_index")
        if tasks is not None:
            bad = np.flatnonzero((tasks < 0) | (tasks >= len(self.builder.meta.tasks)))
            if bad.size:
                k = int(bad[0])
                raise MetadataMismatchError(
                    describe(
                        "The data file's 'task_index' names a task that meta/ does not have",
                        expected=f"task_index in [0, {len(self.builder.meta.tasks)})",
                        found=f"task_index={int(tasks[k])}",
                        file=path,
                        episode=ep.episode_index,
                        frame=self.lo + k,
                        fix="the dataset is inconsistent; download it again or rebuild meta/",
                    )
                )
        for col, expected in (
            ("episode_index", np.full(self.hi - self.lo, ep.episode_index)),
            ("index", np.arange(ep.dataset_from_index + self.lo, ep.dataset_from_index + self.hi)),
            ("frame_index", np.arange(self.lo, self.hi)),
        ):
            got = self.rows.get(col)
            if got is None:
                continue
            bad = np.flatnonzero(got != expected)
            if bad.size:
                k = int(bad[0])
                raise MetadataMismatchError(
                    describe(
                        f"The data file's '{col}' column disagrees with the episode metadata",
                        expected=f"{col}={int(expected[k])}",
                        found=f"{col}={int(got[k])}",
                        file=path,
                        episode=ep.episode_index,
                        frame=self.lo + k,
                        fix="the dataset is inconsistent; download it again or rebuild meta/",
                    )
                )

    def __enter__(self) -> EpisodeRangeReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Hand the video decoders back to the builder, which keeps a few open for reuse."""
        videos, self.videos = self.videos, {}
        for v in videos.values():
            self.builder.release(v)

    def items(self, frames: Sequence[int] | range) -> list[dict[str, Any]]:
        """Build the items of ``frames`` (episode-local, increasing, inside ``[start, stop)``)."""
        return unbind(self.columns(frames))

    def columns(self, frames: Sequence[int] | range) -> dict[str, Any]:
        """The items of ``frames`` as columns: what ``default_collate`` makes of :meth:`items`."""
        return self.builder.finish(self.raw(frames))

    def raw(
        self,
        frames: Sequence[int] | range,
        into: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> dict[str, np.ndarray]:
        """The items of ``frames`` as numpy columns, before :meth:`ItemBuilder.finish`.

        Every value has the frames along its first axis, in the key order of an item. Camera
        frames are RGB uint8 ``(..., 3, H, W)``, image features uint8 ``(..., C, H, W)``
        (decoded here); string features are object arrays of ``str``; ``task`` holds task
        indices. Rows of
        several calls can be concatenated and reordered with plain numpy (memory copies) before
        the one conversion to tensors, which is what the streaming path does per batch.

        ``into`` maps cameras to ``(buffer, rows)``: those cameras' frames are decoded straight
        into ``buffer[rows[i]]`` for ``frames[i]`` (shape :meth:`ItemBuilder.camera_shape`) and
        left out of the result.
        """
        frames = np.asarray(frames, dtype=np.int64)
        if frames.size == 0:
            return {}
        if (
            frames[0] < self.start
            or frames[-1] >= self.stop
            or (frames.size > 1 and np.any(np.diff(frames) <= 0))
        ):
            raise IndexError(
                describe(
                    "Frames must be increasing and inside the reader's range",
                    expected=f"frames in [{self.start}, {self.stop})",
                    found=f"{frames[:5].tolist()}...",
                    episode=self.ep.episode_index,
                )
            )
        b = self.builder
        length = self.ep.length
        local = frames - self.lo
        out: dict[str, np.ndarray] = {}
        query: dict[str, np.ndarray] = {}
        pads: dict[str, np.ndarray] = {}
        for key, d in (b.delta or {}).items():
            raw = frames[:, None] + d[None, :]
            query[key] = np.clip(raw, 0, length - 1)
            pads[f"{key}_is_pad"] = (raw < 0) | (raw >= length)
        cams = list(self.ep.videos)
        for cam in cams:
            self._video(cam)  # acquire decoders here, not on the decoding threads
        into = into or {}
        images = b.map_cameras(
            lambda cam: self._images(cam, query.get(cam), frames, into.get(cam)), cams
        )
        out.update((c, im) for c, im in zip(cams, images, strict=True) if c not in into)
        for c in b.columns:
            rows = query[c] - self.lo if c in query else local
            out[c] = self._decode(c, rows) if c in b.image_keys else self.rows[c][rows]
        out.update(pads)
        task_col = self.rows.get("task_index")
        if task_col is not None:
            out["task"] = np.asarray(task_col[local], dtype=np.int64)
        return out

    def _decode(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Image feature ``key`` at ``rows`` (indices into the rows read, any shape) as uint8
        ``(*rows.shape, C, H, W)``; each distinct row is decoded once (windows overlap)."""
        uniq, inverse = np.unique(rows, return_inverse=True)
        feature = self.builder.meta.features[key]
        column = self.rows[key]
        decoded = np.stack(
            [
                decode_image(
                    column[k],
                    key=key,
                    feature=feature,
                    file=self.path,
                    episode=self.ep.episode_index,
                    frame=self.lo + k,
                )
                for k in uniq.tolist()
            ]
        )
        return decoded[inverse.reshape(rows.shape)]

    def _video(self, cam: str) -> VideoReader:
        video = self.videos.get(cam)
        if video is None:
            video = self.videos[cam] = self.builder.video(
                self.builder.meta.root / self.ep.videos[cam].path,
                episode=self.ep.episode_index,
                cache_frames=self._cache_frames,
            )
            self.builder.check_video(cam, video)
        return video

    def _images(
        self,
        cam: str,
        q: np.ndarray | None,
        frames: np.ndarray,
        into: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Decoded RGB uint8 frames a camera needs: ``(n, 3, H, W)``, or ``(n, w, 3, H, W)``.

        With ``into = (buffer, rows)`` they are written to ``buffer[rows]`` instead (and
        ``buffer`` is returned)."""
        ref = self.ep.videos[cam]
        wanted = q if q is not None else frames
        uniq = np.unique(wanted) if q is not None else frames
        times = ref.from_timestamp + self.timestamps[uniq - self.lo]
        video = self._video(cam)
        tol = self.builder.options.tolerance_s
        if into is not None and q is not None:
            return self._window_into(video, times, uniq, q, *into)
        decoded = video.frames_at(
            times,
            tolerance_s=tol,
            frame_numbers=uniq.tolist(),
            channels_first=True,
            out=into[0] if into is not None else None,
            rows=into[1] if into is not None else None,
        )
        if q is None:
            return decoded
        picked = decoded[np.searchsorted(uniq, wanted)]  # (n, w, 3, H, W)
        return picked[:, 0] if picked.shape[1] == 1 else picked  # lerobot squeezes one frame

    def _window_into(
        self,
        video: VideoReader,
        times: np.ndarray,
        uniq: np.ndarray,
        q: np.ndarray,
        buffer: np.ndarray,
        rows: np.ndarray,
    ) -> np.ndarray:
        """Decode a delta window's frames into ``buffer[rows]`` (``(B, w, 3, H, W)``, or
        ``(B, 3, H, W)`` for a one-frame window): each distinct frame is decoded once into its
        first place and copied to the others (a frame is in the windows of several items)."""
        w = q.shape[1]
        flat = buffer.view()
        flat.shape = (-1, *buffer.shape[-3:])  # a view of (B * w) frames; never a copy
        dest = (np.asarray(rows, dtype=np.int64)[:, None] * w + np.arange(w)).ravel()
        which = np.searchsorted(uniq, q).ravel()  # the distinct frame each place shows
        _, first = np.unique(which, return_index=True)  # every distinct frame occurs
        primary = dest[first]
        video.frames_at(
            times,
            tolerance_s=self.builder.options.tolerance_s,
            frame_numbers=uniq.tolist(),
            channels_first=True,
            out=flat,
            rows=primary,
        )
        others = np.ones(len(dest), dtype=bool)
        others[first] = False
        for d, src in zip(dest[others].tolist(), primary[which[others]].tolist(), strict=True):
            flat[d] = flat[src]  # one copy per place (a fancy-indexed copy makes two)
        return buffer


def unbind(cols: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Split columns (frames along the first axis) into one dict per frame."""
    n = len(next(iter(cols.values()))) if cols else 0
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]
