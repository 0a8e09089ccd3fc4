"""EpisodeRangeReader: one episode's frame range, read with one parquet read and one seek per
camera, as columns or as items (:func:`unbind`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from ..errors import (
    BROKEN_DATA_ERRORS,
    MetadataMismatchError,
    describe,
)
from ..format.images import decode_image
from ..format.video import VideoReader
from .windows import HeldWindows, decode_windows_into, window_run

if TYPE_CHECKING:
    from ..format.depth import DepthCodec
    from ..format.meta_types import EpisodeInfo
    from ..format.metadata import DatasetMeta
    from ..format.tabular import ParquetTable
    from .options import ItemOptions

_T = TypeVar("_T")


class RangeBuilder(Protocol):
    """What :class:`EpisodeRangeReader` and :func:`check_rows` need of their item builder.

    An :class:`~robo_resume.items.builder.ItemBuilder`, which makes these readers (so a
    protocol, not an import). A reader takes its decoders (:meth:`video`, :meth:`check_video`)
    before it calls :meth:`map_cameras`; the ``fn`` it passes there only reads the properties,
    from several decoding threads at once (one camera each), so they must not change while a
    reader is open. The window members are the builder's ``delta_timestamps`` in frames and
    agree with :attr:`delta`.
    """

    @property
    def meta(self) -> DatasetMeta:
        """The dataset's metadata (episodes, fps, features, tasks, root)."""
        ...

    @property
    def options(self) -> ItemOptions:
        """The item options (``tolerance_s`` is the one a reader uses)."""
        ...

    @property
    def delta(self) -> Mapping[str, np.ndarray] | None:
        """``delta_timestamps`` as frame offsets per key, or None without windows."""
        ...

    @property
    def depth(self) -> Mapping[str, DepthCodec]:
        """The depth map cameras, with their codecs (their frames are float32 millimetres)."""
        ...

    @property
    def columns(self) -> Sequence[str]:
        """The data parquet columns an item holds, in item order."""
        ...

    @property
    def image_keys(self) -> Set[str]:
        """The ``dtype: image`` features (encoded images in the parquet rows)."""
        ...

    @property
    def window_offsets(self) -> Mapping[str, tuple[np.ndarray, int, int]]:
        """Per windowed key: (its frame offsets as a ``(1, w)`` row, the lowest, the highest)."""
        ...

    @property
    def sliding_windows(self) -> Set[str]:
        """The windowed keys whose offsets are consecutive frames in increasing order."""
        ...

    @property
    def window_before(self) -> int:
        """How many frames before a range its windows reach (0 or more)."""
        ...

    @property
    def window_after(self) -> int:
        """How many frames after a range its windows reach (0 or more)."""
        ...

    def table(self, ep: EpisodeInfo) -> ParquetTable:
        """The parquet table holding ``ep``'s rows."""
        ...

    def rows_verified(self, ep: EpisodeInfo) -> bool:
        """Whether every row of ``ep`` passed :func:`check_rows` already (then ranges skip it)."""
        ...

    def episode_task_indices(self, ep: EpisodeInfo) -> np.ndarray | None:
        """The ``task_index`` values ``ep``'s metadata lists, or None when none can be checked."""
        ...

    def path(self, rel: str) -> Path:
        """``meta.root / rel`` (the same object for the same file)."""
        ...

    def video(
        self, path: Path, *, episode: int, cache_frames: int, depth: DepthCodec | None = None
    ) -> VideoReader:
        """A decoder for the mp4 at ``path`` (``depth``: a depth camera's codec), the reader's
        until it hands it to :meth:`release`."""
        ...

    def check_video(self, camera: str, reader: VideoReader) -> None:
        """Check a camera's video file against the metadata; raises on a mismatch."""
        ...

    def release(self, reader: VideoReader) -> None:
        """Take back a decoder :meth:`video` gave (the reader does not use it again)."""
        ...

    def map_cameras(self, fn: Callable[[str], _T], cameras: Sequence[str]) -> list[_T]:
        """``[fn(cam) for cam in cameras]``, in order, possibly on several threads."""
        ...

    def finish(self, raw: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Convert :meth:`EpisodeRangeReader.raw` columns to item columns (tensors, strings)."""
        ...


class EpisodeRangeReader:
    """Reads items of frames ``[start, stop)`` of one episode, in increasing frame order.

    The parquet rows of the range (plus the delta window around it) are read on construction;
    video is decoded on demand by one :class:`VideoReader` per camera, moving forward, so calling
    :meth:`items` on successive blocks decodes each frame once with one seek per camera.
    """

    def __init__(
        self,
        builder: RangeBuilder,
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
        verified = builder.rows_verified(ep)
        self.rows = table.read(
            ep.data_row_start + self.lo,
            ep.data_row_start + self.hi,
            builder.columns,
            episode=ep.episode_index,
            check=not verified,
        )
        self.path = table.path
        if not verified:
            check_rows(builder, ep, self.rows, self.lo, table.path)
        self.timestamps = (
            self.rows["timestamp"].astype(np.float64)
            if "timestamp" in self.rows
            else (np.arange(self.lo, self.hi, dtype=np.float64) / meta.fps)
        )
        if cache_frames is None:
            cache_frames = builder.window_before  # look-back windows; nothing else re-reads
        self._cache_frames = cache_frames
        self.videos: dict[str, VideoReader] = {}  # acquired from the builder on first use

    def __enter__(self) -> EpisodeRangeReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Hand the video decoders back to the builder, which keeps a few open for reuse."""
        videos, self.videos = self.videos, {}
        for v in videos.values():
            v.drop_ahead()  # frames held for this range go: the memory held stays bounded
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
        frames are RGB uint8 ``(..., 3, H, W)`` (depth maps float32 ``(..., 1, H, W)``
        millimetres), image features uint8 ``(..., C, H, W)``
        (decoded here); string features are object arrays of ``str``; ``task`` holds task
        indices. Rows of
        several calls can be concatenated and reordered with plain numpy (memory copies) before
        the one conversion to tensors, which is what the streaming path does per batch.

        ``into`` maps cameras to ``(buffer, rows)``: those cameras' frames are decoded straight
        into ``buffer[rows[i]]`` for ``frames[i]`` (shape :meth:`ItemBuilder.camera_shape`) and
        left out of the result.
        """
        rows = self._checked(frames)
        if rows.size == 0:
            return {}
        query, pads = self._windows(rows)
        cams = list(self.ep.videos)
        for cam in cams:
            self._video(cam)  # acquire decoders here, not on the decoding threads
        into = into or {}
        images = self.builder.map_cameras(
            lambda cam: self._images(cam, query.get(cam), rows, into.get(cam)), cams
        )
        out = {c: im for c, im in zip(cams, images, strict=True) if c not in into}
        return self._columns(rows, query, pads, out)

    def hold(
        self, stores: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, list]]]:
        """Every frame of the range, decoded now and kept for emission in any order (the
        shuffle order, :mod:`robo_resume.stream.window_read`): ``(columns, cameras)``.

        ``columns``: what :meth:`raw` of ``range(start, stop)`` gives for everything but the
        cameras (one row per frame; delta windows, their ``_is_pad`` flags and ``task``
        included). ``cameras``: per camera ``(first, frames)``, the decoded frames
        (``av.VideoFrame``, FFmpeg's pixel format, referenced, not copied) of the episode's
        frames ``first, first + 1, ...`` that the range's frames and their delta windows show;
        :func:`~robo_resume.format.rgb.planar_rgb` converts one to the values :meth:`raw`
        gives. With ``stores`` (camera -> :class:`~robo_resume.format.frame_store.FrameStore`),
        each frame goes into its camera's store as it is decoded and ``frames`` holds the keys.
        Raises what :meth:`raw` of the range raises (the frames it stored freed again).
        """
        frames = np.arange(self.start, self.stop, dtype=np.int64)
        query, pads = self._windows(frames)
        cams = list(self.ep.videos)
        for cam in cams:
            self._video(cam)  # acquire decoders here, not on the decoding threads
        tol = self.builder.options.tolerance_s

        def decode(cam: str) -> tuple[int, list]:
            q = query.get(cam)
            lo = int(q.min()) if q is not None else self.start
            hi = int(q.max()) + 1 if q is not None else self.stop
            times = (
                self.ep.videos[cam].from_timestamp + self.timestamps[lo - self.lo : hi - self.lo]
            )
            store = stores.get(cam) if stores else None
            keep = None
            if store is not None:
                keys = stored[cam] = []

                def keep(frame, put=store.put, keys=keys):
                    keys.append(put(frame))
                    return keys[-1]

            held = self.videos[cam].hold(
                times.tolist(),
                tolerance_s=tol,
                frame_numbers=list(range(lo, hi)),
                keep=keep,
                seek_threshold_s=seek_after,
            )
            return lo, held

        # a range starts on a keyframe (2-frame GOPs, or the plan's keyframe cuts): seeking to
        # it decodes nothing more, decoding on to it decodes the gap; so seek unless it is next
        seek_after = 1.5 / self.builder.meta.fps
        stored: dict[str, list[int]] = {}
        try:
            held = self.builder.map_cameras(decode, cams)
            cols = self._columns(frames, query, pads, {})
        except BaseException:
            for cam, keys in stored.items():
                stores[cam].free(keys)  # type: ignore[index]
            raise
        return cols, dict(zip(cams, held, strict=True))

    def ahead(self, frames: range) -> tuple[int, dict[str, Any]]:
        """Columns of the first ``m`` of ``frames`` decoded now, cameras unconverted: ``(m,
        columns)``, ``m`` as many as decode cleanly (0 when the decoders are not positioned,
        i.e. before the range's first :meth:`raw`).

        For read-ahead (robo_resume/stream/reading.py): like :meth:`raw` of those frames, but
        a camera without a delta window is a list of ``m`` decoded ``av.VideoFrame`` s (YUV as
        decoded, half the bytes of RGB at 4:2:0) that :func:`~robo_resume.format.video.
        planar_rgb` converts to the values :meth:`raw` gives; a camera with a window is a
        :class:`~robo_resume.items.windows.HeldWindows` (its distinct RGB frames and which one
        each window place shows; ``.array()`` is the camera's column in :meth:`raw`); a depth
        camera without a window is its float32 column as :meth:`raw` gives it (converted now:
        its frames are not RGB). ``m`` stops before anything :meth:`raw` would check or raise
        on (a decode error, a gap, a frame of another size): read normally later, that frame
        fails in the same read with the same error as without read-ahead.
        """
        rows = self._checked(frames)
        if rows.size == 0:
            return 0, {}
        b = self.builder
        delta = b.delta or {}
        tol = b.options.tolerance_s
        cams = list(self.ep.videos)
        plain = [c for c in cams if c not in delta]
        rel = self.timestamps[rows - self.lo]
        times = {c: (self.ep.videos[c].from_timestamp + rel).tolist() for c in plain}

        def decode(cam: str) -> int:
            video = self._video(cam)
            video.decode_ahead(times[cam][-1], tolerance_s=tol)
            return video.count_ahead(times[cam], tolerance_s=tol)

        for cam in plain:
            self._video(cam)  # acquire decoders here, not on the decoding threads
        m = min(b.map_cameras(decode, plain), default=len(rows))
        if m == 0:
            return 0, {}
        rows = rows[:m]
        query, pads = self._windows(rows)
        try:
            windowed = {c: self._images(c, query[c], rows, hold=True) for c in cams if c in delta}
            cols = self._columns(rows, query, pads, {})
        except BROKEN_DATA_ERRORS:
            return 0, {}  # nothing ahead: read later, the same read fails the same way
        out: dict[str, Any] = {}
        for c in cams:
            if c in delta:
                out[c] = windowed[c]
            elif c in b.depth:  # float32 millimetres now (4 bytes a pixel held, not YUV)
                out[c] = b.depth[c].frames(self.videos[c].take_ahead(m))
            else:
                out[c] = self.videos[c].take_ahead(m)
        out.update(cols)  # in an item's key order: cameras first
        return m, out

    def _checked(self, frames: Sequence[int] | range) -> np.ndarray:
        """``frames`` as an int64 array, checked to be increasing and inside the range."""
        if isinstance(frames, range) and frames.step > 0:  # the stream's reads: increasing
            first, last = frames.start, frames.start + (len(frames) - 1) * frames.step
            arr: np.ndarray = np.arange(frames.start, frames.stop, frames.step, dtype=np.int64)
            bad = bool(arr.size) and (first < self.start or last >= self.stop)
        else:
            arr = np.asarray(frames, dtype=np.int64)
            bad = bool(arr.size) and (
                arr[0] < self.start
                or arr[-1] >= self.stop
                or (arr.size > 1 and bool((arr[1:] <= arr[:-1]).any()))
            )
        if bad:
            raise IndexError(
                describe(
                    "Frames must be increasing and inside the reader's range",
                    expected=f"frames in [{self.start}, {self.stop})",
                    found=f"{arr[:5].tolist()}...",
                    episode=self.ep.episode_index,
                )
            )
        return arr

    def _windows(self, frames: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The frames each delta window of ``frames`` shows (clipped), and the pad flags.

        ``frames`` is increasing (:meth:`_checked`), so a window reaches outside the episode
        only if the first frame's lowest or the last frame's highest offset does: windows away
        from the episode's ends skip the clipping (``np.clip`` is slow on small arrays)."""
        length = self.ep.length
        query: dict[str, np.ndarray] = {}
        pads: dict[str, np.ndarray] = {}
        first, last = int(frames[0]), int(frames[-1])
        for key, (d, lo, hi) in self.builder.window_offsets.items():
            raw = frames[:, None] + d
            if first + lo >= 0 and last + hi < length:
                query[key] = raw
                pads[f"{key}_is_pad"] = np.zeros(raw.shape, dtype=bool)
            else:
                query[key] = np.clip(raw, 0, length - 1)
                pads[f"{key}_is_pad"] = (raw < 0) | (raw >= length)
        return query, pads

    def _columns(self, frames: np.ndarray, query, pads, out: dict[str, Any]) -> dict[str, Any]:
        """``out`` (the cameras) followed by the data columns, pad flags and task of ``frames``."""
        b = self.builder
        local = frames - self.lo
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
                self.builder.path(self.ep.videos[cam].path),
                episode=self.ep.episode_index,
                cache_frames=self._cache_frames,
                depth=self.builder.depth.get(cam),
            )
            self.builder.check_video(cam, video)
        return video

    def _images(
        self,
        cam: str,
        q: np.ndarray | None,
        frames: np.ndarray,
        into: tuple[np.ndarray, np.ndarray] | None = None,
        *,
        hold: bool = False,
    ) -> np.ndarray | HeldWindows:
        """Decoded RGB uint8 frames a camera needs: ``(n, 3, H, W)``, or ``(n, w, 3, H, W)``
        (float32 ``(n, 1, H, W)`` or ``(n, w, 1, H, W)`` millimetres for a depth map).

        With ``into = (buffer, rows)`` they are written to ``buffer[rows]`` instead (and
        ``buffer`` is returned). ``hold`` (a camera with a window, for read-ahead): the
        windows as a :class:`HeldWindows` (each distinct frame once), not materialised."""
        ref = self.ep.videos[cam]
        wanted = q if q is not None else frames
        run = None  # the places of a window sliding over consecutive frames (see window_run)
        if q is not None:
            _, lo, hi = self.builder.window_offsets[cam]
            n, f0 = len(frames), int(frames[0])
            if (
                cam in self.builder.sliding_windows
                and int(frames[-1]) - f0 == n - 1  # consecutive (frames are increasing)
                and f0 + lo >= 0
                and int(frames[-1]) + hi < self.ep.length  # nothing clipped
            ):
                run = window_run(n, hi - lo + 1)
                uniq = np.arange(f0 + lo, f0 + lo + n + hi - lo, dtype=np.int64)
            else:
                uniq = np.unique(wanted)
        else:
            uniq = frames
        times = ref.from_timestamp + self.timestamps[uniq - self.lo]
        video = self._video(cam)
        tol = self.builder.options.tolerance_s
        if into is not None and q is not None:
            return decode_windows_into(video, times, uniq, q, *into, tolerance_s=tol, run=run)
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
        # lerobot squeezes a one-frame window to (n, 3, H, W)
        held = HeldWindows(decoded, np.searchsorted(uniq, q), q.shape[1] == 1)
        return held if hold else held.array()


def unbind(cols: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Split columns (frames along the first axis) into one dict per frame."""
    n = len(next(iter(cols.values()))) if cols else 0
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


def check_rows(
    builder: RangeBuilder,
    ep: EpisodeInfo,
    rows: Mapping[str, np.ndarray],
    lo: int,
    path: str | Path,
) -> None:
    """Check the parquet ``rows`` of episode ``ep``'s frames ``lo, lo + 1, ...`` (read from
    ``path``) against meta/: task indices the dataset and the episode list, and the
    ``episode_index``, ``index`` and ``frame_index`` columns. Raises MetadataMismatchError
    naming the first disagreeing frame."""
    hi = lo + len(next(iter(rows.values()))) if rows else lo
    tasks = rows.get("task_index")
    if tasks is not None:
        bad = np.flatnonzero((tasks < 0) | (tasks >= len(builder.meta.tasks)))
        if bad.size:
            k = int(bad[0])
            raise MetadataMismatchError(
                describe(
                    "The data file's 'task_index' names a task that meta/ does not have",
                    expected=f"task_index in [0, {len(builder.meta.tasks)})",
                    found=f"task_index={int(tasks[k])}",
                    file=path,
                    episode=ep.episode_index,
                    frame=lo + k,
                    fix="the dataset is inconsistent; download it again or rebuild meta/",
                )
            )
        listed = builder.episode_task_indices(ep)
        bad = np.flatnonzero(~np.isin(tasks, listed)) if listed is not None else bad
        if bad.size and listed is not None:  # (bad is empty when listed is None)
            k = int(bad[0])
            names = builder.meta.tasks
            raise MetadataMismatchError(
                describe(
                    "The data file's 'task_index' names a task that its episode's metadata "
                    "does not list",
                    expected=f"task_index in {sorted(set(listed.tolist()))} "
                    f"(meta/ lists the episode's tasks {list(ep.tasks)!r})",
                    found=f"task_index={int(tasks[k])} ({names[int(tasks[k])]!r})",
                    file=path,
                    episode=ep.episode_index,
                    frame=lo + k,
                    fix="the dataset is inconsistent; download it again or rebuild meta/",
                )
            )
    for col, expected in (
        ("episode_index", np.full(hi - lo, ep.episode_index)),
        ("index", np.arange(ep.dataset_from_index + lo, ep.dataset_from_index + hi)),
        ("frame_index", np.arange(lo, hi)),
    ):
        got = rows.get(col)
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
                    frame=lo + k,
                    fix="the dataset is inconsistent; download it again or rebuild meta/",
                )
            )
