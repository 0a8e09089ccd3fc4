"""LeRobot-compatible items, built for a contiguous frame range in one pass.

An item is the dict ``LeRobotDataset.__getitem__`` returns (lerobot 0.4.4): one tensor per data
column (floats as float32, ints as int64, 0-d for scalars), one ``(C, H, W)`` image per camera
(float32 in [0, 1] by default, or uint8), ``delta_timestamps`` windows stacked along a new first
axis with ``<key>_is_pad`` masks (indices clamped to the episode, so edge frames repeat), and the
``task`` string. :class:`EpisodeRangeReader` reads the rows of a frame range once and keeps one
decoder per camera open, so a range is built with one parquet read and one seek per camera.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .errors import DatasetFormatError, MetadataMismatchError, describe
from .format.metadata import DatasetMeta, EpisodeInfo
from .format.tabular import ParquetTable
from .format.video import VideoReader

__all__ = ["EpisodeRangeReader", "ItemBuilder", "ItemOptions"]

IMAGE_DTYPES = ("float32", "uint8")


@dataclass(frozen=True)
class ItemOptions:
    """How items are built.

    Attributes:
        delta_timestamps: per feature key, offsets in seconds (multiples of 1/fps), as in lerobot.
        image_dtype: "float32" (lerobot's [0, 1] floats) or "uint8" (4x less memory to move
            between processes; convert with ``x.float() / 255`` later).
        image_transforms: callable applied to each camera tensor of an item, as in lerobot.
        tolerance_s: how far a decoded frame's time may be from the wanted time (lerobot: 1e-4).
        decoder_threads: threads per video decoder (0 = FFmpeg's choice).
    """

    delta_timestamps: Mapping[str, Sequence[float]] | None = None
    image_dtype: str = "float32"
    image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = field(
        default=None, compare=False
    )
    tolerance_s: float = 1e-4
    decoder_threads: int = 0

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


def _to_tensor(values: np.ndarray) -> torch.Tensor:
    """numpy -> torch with lerobot's dtypes: floats float32, integers int64, bools bool."""
    if values.dtype.kind == "f":
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    if values.dtype.kind in "iu":
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    if values.dtype.kind == "b":
        return torch.from_numpy(np.ascontiguousarray(values))
    return torch.as_tensor(values)


class ItemBuilder:
    """Builds LeRobot-compatible items for one dataset; shared by the reader and the streams.

    Holds lazily opened parquet tables (one per data file). Picklable before use.
    """

    def __init__(self, meta: DatasetMeta, options: ItemOptions | None = None) -> None:
        self.meta = meta
        self.options = options or ItemOptions()
        self.delta = delta_indices(self.options.delta_timestamps, meta, self.options.tolerance_s)
        self.columns = meta.data_columns()
        self._tables: dict[str, ParquetTable] = {}
        rows: dict[str, int] = {}
        for ep in meta.episodes:
            rows[ep.data_path] = rows.get(ep.data_path, 0) + ep.length
        self._file_rows = rows
        self._checked: set[str] = set()
        d = self.delta or {}
        lo = [int(v.min()) for v in d.values()]
        hi = [int(v.max()) for v in d.values()]
        self.window_before = max(0, -min(lo)) if lo else 0
        self.window_after = max(0, max(hi)) if hi else 0

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tables"] = {}
        state["_checked"] = set()
        return state

    def table(self, ep: EpisodeInfo) -> ParquetTable:
        """The (cached) parquet table holding ``ep``'s rows, its row count checked once."""
        t = self._tables.get(ep.data_path)
        if t is None:
            t = ParquetTable(self.meta.root / ep.data_path)
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
        self._check_rows(table.path)
        self.timestamps = (
            self.rows["timestamp"].astype(np.float64)
            if "timestamp" in self.rows
            else (np.arange(self.lo, self.hi, dtype=np.float64) / meta.fps)
        )
        if cache_frames is None:
            cache_frames = builder.window_before + 2
        self.videos = {
            cam: VideoReader(
                meta.root / ref.path,
                threads=builder.options.decoder_threads,
                cache_frames=cache_frames,
                episode=ep.episode_index,
            )
            for cam, ref in ep.videos.items()
        }

    def _check_rows(self, path) -> None:
        ep = self.ep
        for col, expected in (
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
        """Close the video decoders."""
        for v in self.videos.values():
            v.close()

    def items(self, frames: Sequence[int] | range) -> list[dict[str, Any]]:
        """Build the items of ``frames`` (episode-local, increasing, inside ``[start, stop)``)."""
        frames = np.asarray(frames, dtype=np.int64)
        if frames.size == 0:
            return []
        if frames[0] < self.start or frames[-1] >= self.stop or np.any(np.diff(frames) <= 0):
            raise IndexError(
                describe(
                    "Frames must be increasing and inside the reader's range",
                    expected=f"frames in [{self.start}, {self.stop})",
                    found=f"{frames[:5].tolist()}...",
                    episode=self.ep.episode_index,
                )
            )
        b = self.builder
        meta = b.meta
        length = self.ep.length
        delta = b.delta or {}
        task_of = meta.tasks
        local = frames - self.lo
        cols: dict[str, torch.Tensor] = {}
        for c in b.columns:
            if c in delta:
                continue
            cols[c] = _to_tensor(self.rows[c][local])
        windows: dict[str, torch.Tensor] = {}
        pads: dict[str, torch.Tensor] = {}
        query: dict[str, np.ndarray] = {}
        for key, d in delta.items():
            raw = frames[:, None] + d[None, :]
            q = np.clip(raw, 0, length - 1)
            pads[f"{key}_is_pad"] = torch.from_numpy((raw < 0) | (raw >= length))
            query[key] = q
            if key in self.rows:
                windows[key] = _to_tensor(self.rows[key][q - self.lo])
        images = {cam: self._images(cam, query.get(cam), frames) for cam in self.videos}
        task_col = self.rows.get("task_index")
        out = []
        transform = b.options.image_transforms
        for i in range(len(frames)):
            item: dict[str, Any] = {}
            for cam, imgs in images.items():
                img = imgs[i]
                item[cam] = transform(img) if transform is not None else img
            for c in b.columns:
                item[c] = windows[c][i] if c in windows else cols[c][i]
            for k, v in pads.items():
                item[k] = v[i]
            if task_col is not None:
                item["task"] = task_of[int(task_col[local[i]])]
            out.append(item)
        return out

    def _images(self, cam: str, q: np.ndarray | None, frames: np.ndarray) -> torch.Tensor:
        """Decode the frames a camera needs for these items; returns one tensor per item."""
        ref = self.ep.videos[cam]
        wanted = q if q is not None else frames[:, None]
        uniq = np.unique(wanted)
        times = ref.from_timestamp + self.timestamps[uniq - self.lo]
        decoded = self.videos[cam].frames_at(
            times, tolerance_s=self.builder.options.tolerance_s, frame_numbers=uniq.tolist()
        )
        pos = np.searchsorted(uniq, wanted)
        t = torch.from_numpy(decoded).permute(0, 3, 1, 2)  # (u, C, H, W) uint8
        t = t[torch.from_numpy(pos)]  # (n, w, C, H, W)
        if self.builder.options.image_dtype == "float32":
            t = t.to(torch.float32) / 255
        if t.shape[1] == 1:
            t = t[:, 0]  # lerobot squeezes a single frame to (C, H, W)
        return t
