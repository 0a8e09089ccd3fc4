"""ItemBuilder: the open parquet tables and video decoders of a dataset, checked against its
metadata, and the assembly of a frame range's columns into items."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import BROKEN_DATA_ERRORS, MetadataMismatchError, describe
from ..format.depth import DepthCodec, depth_codecs
from ..format.frame_store import FrameStore
from ..format.metadata import DatasetMeta, EpisodeInfo
from ..format.row_groups import RowGroupCache
from ..format.tabular import ParquetTable
from ..format.validate import inside_root
from ..format.video import VideoReader, VideoStreamInfo
from .buffers import (
    BUFFERS,
    empty_like_batch,
    lerobot_dtype,
    pack_shared,
    shared_views,
    to_float,
    to_tensor,
)
from .options import IDLE_DECODERS, ItemOptions, delta_indices
from .ranges import EpisodeRangeReader, check_rows
from .read_plan import SampleTables, video_ranges
from .threads import DecodingThreads

logger = logging.getLogger("robo_resume")

_WARNED: set[str] = set()  # video files warned about in this process: once per file
_WARNED_LOCK = threading.Lock()


class ItemBuilder(DecodingThreads):
    """Builds LeRobot-compatible items for one dataset; shared by the reader and the streams.

    Holds lazily opened parquet tables (one per data file). Picklable before use.
    ``idle_decoders``: how many released decoders :meth:`release` keeps open (the stream sets
    it from the interleave, see ``_configure_decoding``).
    """

    idle_decoders = IDLE_DECODERS

    def __init__(self, meta: DatasetMeta, options: ItemOptions | None = None) -> None:
        self.meta = meta
        self.options = options or ItemOptions()
        self.delta = delta_indices(self.options.delta_timestamps, meta, self.options.tolerance_s)
        self.columns = meta.data_columns()
        self._cameras = frozenset(meta.visual_keys)  # converted and transformed as images
        # depth video cameras: float32 millimetres from decoding on, never converted or
        # transformed (lerobot leaves them out of image_transforms and return_uint8)
        self.depth: dict[str, DepthCodec] = depth_codecs(meta)
        self.image_keys = frozenset(meta.image_keys)  # decoded from parquet bytes in raw()
        self._strings = frozenset(meta.string_keys)
        self._language = frozenset(meta.language_keys)  # object arrays of message lists
        self._tables: dict[str, ParquetTable] = {}
        self._row_groups = RowGroupCache()  # decoded parquet rows the next chunks read again
        self._idle: OrderedDict[int, VideoReader] = OrderedDict()  # id -> reader, oldest first
        self._paths: dict[str, Path] = {}  # a file's path below the root, made once
        self._stores: dict[str, FrameStore] = {}  # held decoded frames (the shuffle order)
        self.decoder_threads = self.options.decoder_threads
        self.camera_threads = 1  # threads decoding concurrently (the stream sets it)
        self._pool: tuple[int, Any] | None = None  # (pid, ThreadPoolExecutor)
        self._lock = threading.Lock()  # the idle decoders, taken and given back from threads
        cols = meta.columns
        rows = np.zeros(len(cols.data_paths), dtype=np.int64)
        np.add.at(rows, cols.data_file, cols.length)  # rows of each data file: its episodes
        self._file_rows = dict(zip(cols.data_paths, rows.tolist(), strict=True))
        self._checked: set[str] = set()
        self._videos_checked: set[str] = set()
        self._rows_verified: dict[int, bool] = {}  # episode -> all its rows passed the checks
        self._sample_tables: SampleTables | None = None  # a remote dataset's planned reads
        d = self.delta or {}
        # (offsets as a (1, w) row, lowest, highest) of each window, for EpisodeRangeReader
        self.window_offsets = {k: (v[None, :], int(v.min()), int(v.max())) for k, v in d.items()}
        # windows whose offsets are consecutive frames in order (e.g. [-1, 0]): a read of
        # consecutive frames places their frames without a search (windows.window_run)
        self.sliding_windows = frozenset(
            k for k, v in d.items() if np.array_equal(v, np.arange(v[0], v[0] + len(v)))
        )
        lo = [w[1] for w in self.window_offsets.values()]
        hi = [w[2] for w in self.window_offsets.values()]
        self.window_before = max(0, -min(lo)) if lo else 0
        self.window_after = max(0, max(hi)) if hi else 0

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tables"] = {}
        state["_idle"] = OrderedDict()
        state["_stores"] = {}
        state["_pool"] = None
        del state["_lock"]
        state["_checked"] = set()
        state["_videos_checked"] = set()
        state["_rows_verified"] = {}
        state["_sample_tables"] = None
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def episode_task_indices(self, ep: EpisodeInfo) -> np.ndarray | None:
        """The ``task_index`` values ``ep``'s metadata lists (its ``tasks`` strings looked up
        in ``meta.tasks``), or None when it lists none or one that ``meta.tasks`` lacks (then
        nothing can be checked against it)."""
        if not ep.tasks:
            return None
        lookup = self.__dict__.get("_task_lookup")
        if lookup is None:
            lookup = {task: i for i, task in enumerate(self.meta.tasks)}
            self._task_lookup = lookup
        found = [lookup.get(task) for task in ep.tasks]
        if any(i is None for i in found):
            return None
        return np.asarray(found, dtype=np.int64)

    def frame_store(self, camera: str) -> FrameStore:
        """This process's :class:`~robo_resume.format.frame_store.FrameStore` for ``camera``:
        the reused memory the shuffle order holds decoded frames in (made on first use)."""
        store = self._stores.get(camera)
        if store is None:
            store = self._stores[camera] = FrameStore(depth=camera in self.depth)
        return store

    def rows_verified(self, ep: EpisodeInfo) -> bool:
        """Whether every parquet row of ``ep`` passed the row checks (one read of the episode's
        rows the first time it is asked, then remembered): ranges of a verified episode skip
        them. False where any check fails, or the read does: each range of that episode is then
        checked on its own, so an error names the range's own rows, and ``on_error="skip"``
        skips only the chunks that hold them."""
        known = self._rows_verified.get(ep.episode_index)
        if known is None:
            table = self.table(ep)
            try:
                rows = table.read(
                    ep.data_row_start,
                    ep.data_row_start + ep.length,
                    self.columns,
                    episode=ep.episode_index,
                )
                check_rows(self, ep, rows, 0, table.path)
                known = True
            except BROKEN_DATA_ERRORS:
                known = False
            self._rows_verified[ep.episode_index] = known
        return known

    def table(self, ep: EpisodeInfo) -> ParquetTable:
        """The (cached) parquet table holding ``ep``'s rows, its row count checked once."""
        t = self._tables.get(ep.data_path)
        if t is None:
            t = ParquetTable(
                inside_root(self.meta.root, ep.data_path, episode=ep.episode_index),
                fps=self.meta.fps if self.meta.camera_keys else None,
                tolerance_s=self.options.tolerance_s,
                features=self.meta.features,
                cache=self._row_groups,
                files=self.meta.files,
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

    def path(self, rel: str) -> Path:
        """``meta.root / rel``, made once per file (a Path is slow to build and to hash, and
        every chunk names its files)."""
        found = self._paths.get(rel)
        if found is None:
            found = self._paths[rel] = self.meta.root / rel
        return found

    def video(
        self, path: Path, *, episode: int, cache_frames: int, depth: DepthCodec | None = None
    ) -> VideoReader:
        """A decoder for ``path``: an idle one kept open by :meth:`release` if there is one.

        ``depth``: the camera's codec when it is a depth map (:attr:`depth`), see
        :class:`~robo_resume.format.video.VideoReader`.

        Several episodes of a v3.0 dataset share one mp4; reusing its open decoder saves the
        container open and, when the next range starts after its position, the seek too.
        Among idle decoders of the file, the one stopped latest is taken.
        """
        want = str(path)  # str() of a Path is kept; Path == Path normalises both each time
        with self._lock:
            best = None
            for key, r in self._idle.items():
                if str(r.path) == want and (
                    best is None or (r.position or -1) > (best[1].position or -1)
                ):
                    best = (key, r)
            if best is not None:
                reader = self._idle.pop(best[0])
                reader.episode, reader.cache_frames = episode, cache_frames
                reader.depth = depth
                return reader
        return VideoReader(
            inside_root(self.meta.root, path.relative_to(self.meta.root), episode=episode),
            threads=self.decoder_threads,
            cache_frames=cache_frames,
            episode=episode,
            depth=depth,
            files=self.meta.files,
        )

    def check_video(self, camera: str, reader: VideoReader) -> None:
        """Compare a video file with info.json (size, fps) and with the episode metadata (where
        each episode starts), once per file."""
        key = str(reader.path)
        if key not in self._videos_checked:
            info = reader.info()
            self.meta.check_video_stream(camera, info, file=reader.path, episode=reader.episode)
            self._check_video_starts(camera, reader, info)
            self._videos_checked.add(key)

    def _video_members(self, camera: str, rel: str) -> list[tuple[float, float, int, int]]:
        """``(from_timestamp, to_timestamp, episode_index, length)`` of the episodes whose
        ``camera`` video is the file ``rel``, sorted (by time in the file)."""
        cols = self.meta.columns
        video = cols.videos.get(camera)
        if video is None or rel not in video.paths:
            return []
        rows = np.flatnonzero(video.file == video.paths.index(rel))
        ts, ep, length = video.from_timestamp[rows], cols.episode_index[rows], cols.length[rows]
        order = np.lexsort((length, ep, ts))
        columns = (
            ts[order].tolist(),
            video.to_timestamp[rows][order].tolist(),
            ep[order].tolist(),
            length[order].tolist(),
        )
        return list(zip(*columns, strict=True))

    def _check_video_starts(self, camera: str, reader: VideoReader, info: VideoStreamInfo) -> None:
        """Each episode of a shared mp4 starts where the episodes before it end; frames that
        no episode reads are reported once per file (a warning: they are harmless).

        Episodes are concatenated in one mp4 in time order, so the episode at ``from_timestamp``
        ``f`` starts at frame ``round((f - t0) * fps)`` (``t0``: the container's first frame
        time), which must be where the episode before it in the file ends: after its
        ``length`` frames, or after its video segment (``to_timestamp - from_timestamp``) when
        that is longer (an episode trimmed in the parquet whose video was kept whole, as
        lerobot's v2.1 to v3.0 converter writes it from the mp4 durations). A
        ``from_timestamp`` off by whole frames still finds frames (the neighbours), silently,
        in lerobot too; this refuses it from the metadata and the container header alone, with
        no decoding. Frames past an episode's rows inside its segment, and frames after the
        last episode of the file, are never read: lerobot reads by timestamp and returns the
        right frames, and so does this reader; they get one warning per file and process
        (:data:`_WARNED`). Fewer frames than the episodes need are reported when decoding,
        naming the first missing frame.
        """
        rel = reader.path.relative_to(self.meta.root).as_posix()
        members = self._video_members(camera, rel)
        fps = float(info.fps or self.meta.fps)
        t0 = reader.start_time()
        ends = [0]  # where the next episode may start: after the rows, or after the segment
        odd: list[str] = []
        longer = None  # the previous episode's segment longer than its rows, if it is
        for from_ts, to_ts, episode, length in members:
            at = (from_ts - t0) * fps
            start = min(ends, key=lambda e: abs(at - e))
            if abs(at - start) > 0.5:
                by_segment = f" or {t0 + ends[1] / fps:.6f}" if len(ends) > 1 else ""
                raise MetadataMismatchError(
                    describe(
                        f"An episode's from_timestamp for '{camera}' does not point at its first "
                        "frame in the video",
                        expected=f"from_timestamp {t0 + ends[0] / fps:.6f} (frame {ends[0]} of "
                        "the file: where the rows of the episodes before it in this mp4 end)"
                        + (
                            f"{by_segment} (where the previous episode's to_timestamp ends)"
                            if by_segment
                            else ""
                        ),
                        found=f"from_timestamp {from_ts:.6f} (frame {at:.2f})",
                        file=reader.path,
                        episode=episode,
                        frame=0,
                        fix="every frame of the episode would be read from another time; set "
                        f"videos/{camera}/from_timestamp in meta/episodes to the episode's "
                        "start in the mp4, or download meta/ (or the mp4, if it was copied from "
                        "other episodes) again",
                    )
                )
            if longer is not None and start == ends[-1]:
                odd.append(longer)  # the episode before it ends at its segment, after its rows
            segment = round((to_ts - from_ts) * fps)  # the frames to_timestamp gives it
            ends, longer = [start + length], None
            if segment > length:
                ends.append(start + segment)
                longer = (
                    f"episode {episode}'s video segment holds {segment - length} frames after "
                    f"its {length} rows (to_timestamp - from_timestamp = {to_ts - from_ts:.3f} "
                    f"s; {length / fps:.3f} s by its length)"
                )
        end = ends[-1] if info.num_frames >= ends[-1] else ends[0]
        if longer is not None and end == ends[-1]:
            odd.append(longer)
        if info.num_frames > end:
            last = f" (episode {members[-1][2]})" if members else ""
            odd.append(
                f"{info.num_frames - end} trailing frames after the last episode{last} of meta/ "
                f"({info.num_frames} frames in the container, {end} in its episodes)"
            )
        if not odd:
            return
        with _WARNED_LOCK:  # decoding threads of one process may open the file at once
            first = str(reader.path) not in _WARNED
            _WARNED.add(str(reader.path))
        if first:
            logger.warning(
                "video %s ('%s', opened for episode %s): %s. Harmless: frames are read at "
                "from_timestamp + timestamp, as lerobot reads them, and no episode reads "
                "these (an episode trimmed in its parquet, or a recording that ran past its "
                "last row); if the file was copied from other episodes, download it again",
                reader.path,
                camera,
                reader.episode,
                "; ".join(odd),
            )

    def release(self, reader: VideoReader) -> None:
        """Keep ``reader`` open for reuse; beyond :data:`IDLE_DECODERS` idle decoders, one
        closes: the oldest of a file that has another idle decoder, else the oldest.

        Dropping a file's second idle decoder before another file's only one keeps as many
        files open as there are places: the next chunk of any of them starts without opening
        its mp4, with no more decoders kept."""
        closing = []
        with self._lock:
            self._idle[id(reader)] = reader
            while len(self._idle) > self.idle_decoders:
                seen: set[Path] = set()
                twin = None
                for key, r in reversed(self._idle.items()):  # newest first
                    if r.path in seen:
                        twin = key  # the oldest so far of a file with a newer idle decoder
                    seen.add(r.path)
                if twin is None:
                    closing.append(self._idle.popitem(last=False)[1])
                else:
                    closing.append(self._idle.pop(twin))
        for r in closing:
            r.close()

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
        into: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """Convert numpy columns from :meth:`EpisodeRangeReader.raw` to item columns.

        Cameras (video and image features) become ``(..., C, H, W)`` tensors (float32 in
        [0, 1], or uint8 when ``image_dtype`` or the options say so) with ``image_transforms``
        applied item by item, data columns get lerobot's dtypes, ``task`` and string features
        become lists of ``str``, language columns lists of their items' values (message lists
        or None, never in shared memory). At most one copy
        per camera (the float conversion), written straight into shared memory when ``shared``
        (a DataLoader worker: the batch then crosses to the main process without another copy).
        A camera value that is already a uint8 tensor (decoded into its final buffer, see
        :meth:`camera_buffers`) is used as it is when no conversion is asked for. ``into``:
        float32 tensors of the cameras' batch shapes the conversion writes into (a worker's
        reusable buffers), used when there is no transform. Depth cameras (:attr:`depth`) are
        float32 millimetres already, whatever ``image_dtype`` says, and never transformed (as
        in lerobot): a tensor is used as it is, an array copied once (into ``into``, shared
        memory or a pooled buffer: it may be a buffer the stream reuses).
        """
        dtype = torch.float32 if (image_dtype or self.options.image_dtype) == "float32" else None
        transform = self.options.image_transforms
        tasks = self.meta.tasks
        out: dict[str, Any] = {}
        for key, v in raw.items():
            if key in self.depth:
                if isinstance(v, torch.Tensor):  # decoded into its final buffer already
                    out[key] = v
                    continue
                dst = (into or {}).get(key)
                if dst is None:
                    shape = torch.Size(v.shape)
                    dst = (
                        empty_like_batch(shape, torch.float32, True)
                        if shared
                        else BUFFERS.empty(shape, torch.float32)
                    )
                out[key] = dst.copy_(torch.from_numpy(v))
            elif key in self._cameras:
                ready = isinstance(v, torch.Tensor)  # decoded into its final buffer already
                t = (
                    v if isinstance(v, torch.Tensor) else torch.from_numpy(v)
                )  # (..., C, H, W) uint8
                if transform is None and dtype is None and (ready or not shared):
                    out[key] = t  # already in place: no copy
                    continue
                if transform is None:
                    if dtype is not None:
                        t = to_float(t, shared, out=(into or {}).get(key))
                    else:
                        t = empty_like_batch(t.shape, torch.uint8, shared).copy_(t)
                else:
                    t = t.to(dtype) / 255 if dtype is not None else t.contiguous()
                    t = torch.stack([transform(img) for img in t])
                out[key] = t
            elif key == "task":
                out[key] = [tasks[i] for i in v.tolist()]
            elif key in self._strings:
                out[key] = [str(x) for x in v.tolist()]
            elif key in self._language:
                out[key] = v.tolist()  # each item's own list (see format/language.py)
            elif shared and lerobot_dtype(v) is not None:
                out[key] = None  # packed below, in this place
            else:
                out[key] = to_tensor(v)
        if shared:
            out.update(pack_shared({k: raw[k] for k, v in out.items() if v is None}))
        return out

    def camera_shape(self, camera: str) -> tuple[int, ...] | None:
        """One item's shape of ``camera``: ``(3, H, W)`` (``(1, H, W)`` for a depth map), or
        ``(w, 3, H, W)`` with a delta window of ``w`` > 1 frames; None when info.json does not
        give the frame size."""
        size = self.meta.frame_size(camera)
        if size is None:
            return None
        d = (self.delta or {}).get(camera)
        w = 1 if d is None else len(d)
        c = 1 if camera in self.depth else 3
        return (c, *size) if w == 1 else (w, c, *size)

    def camera_dtype(self, camera: str) -> np.dtype:
        """What ``camera`` is decoded into: uint8 RGB, or float32 millimetres (a depth map)."""
        return np.dtype(np.float32 if camera in self.depth else np.uint8)

    def camera_buffers(
        self, cameras: Sequence[str], n: int, *, shared: bool
    ) -> dict[str, torch.Tensor]:
        """Uninitialised tensors for ``n`` items of each camera to decode into (uint8, float32
        for a depth map: :meth:`camera_dtype`).

        All in one shared-memory storage when ``shared`` (a worker's batch, see
        :func:`shared_views`), else from :data:`BUFFERS`. Cameras whose shape is unknown (see
        :meth:`camera_shape`) are left out.
        """
        shapes = {c: self.camera_shape(c) for c in cameras}
        known = {c: (n, *s) for c, s in shapes.items() if s is not None}
        if shared:
            return shared_views({c: (s, self.camera_dtype(c)) for c, s in known.items()})
        return {
            c: BUFFERS.empty(s, torch.float32 if c in self.depth else torch.uint8)
            for c, s in known.items()
        }

    @property
    def plans_reads(self) -> bool:
        """Whether :meth:`plan_reads` does anything: the dataset's files are fetched ahead
        (a remote dataset), not read on demand."""
        return self.meta.files.plans

    def plan_reads(self, pieces: Iterable[tuple[int, int, int]]) -> None:
        """Let the file access fetch ahead what the decoders of ``pieces`` (``(episode_index,
        start, stop)`` in the order they are read, lazily) will read (see
        :mod:`~robo_resume.items.read_plan`); replaces the plan before. Nothing for a local
        dataset (``pieces`` is not iterated)."""
        files = self.meta.files
        if not files.plans:
            return
        if self._sample_tables is None:
            self._sample_tables = SampleTables(self.meta, self.path)
        files.plan(
            video_ranges(
                self.meta,
                pieces,
                self._sample_tables,
                before=self.window_before,
                after=self.window_after,
            )
        )

    def end_plan(self) -> None:
        """The stream that planned its reads ended: stop fetching ahead (see
        :meth:`plan_reads`)."""
        if self.meta.files.plans:
            self.meta.files.end_plan()

    def episode_reader(
        self, episode_index: int, start: int, stop: int, *, cache_frames: int | None = None
    ) -> EpisodeRangeReader:
        """Open a reader for frames ``[start, stop)`` of an episode (rows read at once)."""
        return EpisodeRangeReader(self, episode_index, start, stop, cache_frames=cache_frames)

    def build_range(self, episode_index: int, start: int, stop: int) -> list[dict[str, Any]]:
        """Return the items of frames ``[start, stop)`` of an episode, in frame order."""
        with self.episode_reader(episode_index, start, stop) as r:
            return r.items(range(start, stop))
