"""The byte ranges a stream's next chunks will read, for a remote dataset's prefetch.

A stream knows by arithmetic which frames of which episodes it reads next, in order. For a
remote dataset (``robo_resume.remote``) each of those pieces is a few byte ranges of the video
files: per camera, the samples from the keyframe at or before the piece's first frame through
its last one (:meth:`~robo_resume.format.mp4_ranges.SampleTable.frame_range_bytes`), found in
the file's sample tables (the ``moov``: a few kB, read once per file and process).
:func:`video_ranges` turns pieces into those ranges lazily, as the prefetch walks them; the
file access fetches them ahead of the decoders (:meth:`~robo_resume.format.file_access.
FileAccess.plan`). A plan is a hint: a range it gets wrong, or a file whose tables cannot be
read, costs requests when the decoder reads it, never a wrong frame.
"""

from __future__ import annotations

import io
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..format.mp4_ranges import READ_THROUGH, SampleTable

if TYPE_CHECKING:
    from ..format.metadata import DatasetMeta, EpisodeInfo

__all__ = ["SampleTables", "video_ranges"]

WARM_PIECES = 64
"""Pieces looked at together: the files they touch first are opened concurrently (a file's
first reads are a few requests in a row; at 20 ms each, one file after the other would hold
the plan back)."""

WARM_THREADS = 8
"""Files opened at once when a plan meets new ones."""

logger = logging.getLogger("robo_resume")


class SampleTables:
    """The sample tables of a dataset's video files, read through its file access on first
    use and kept (None for a file whose tables cannot be read, or a file access that plans
    nothing: it is not planned). ``path(rel)`` is ``meta.root / rel`` made once per file (the
    item builder's :meth:`~robo_resume.items.builder.ItemBuilder.path`)."""

    def __init__(self, meta: DatasetMeta, path: Callable[[str], Path]) -> None:
        self.meta = meta
        self.path = path
        self._tables: dict[Path, SampleTable | None] = {}
        self._warmed: set[Path] = set()
        self._lock = threading.Lock()

    def get(self, path: Path) -> SampleTable | None:
        """The table of the mp4 at ``path`` (its local path below the dataset root), or None
        when it cannot be read (missing, not an mp4 the parser reads, a failed request)."""
        with self._lock:
            if path in self._tables:
                return self._tables[path]
        table: SampleTable | None
        try:
            table = self._read(path)
        except Exception as exc:  # a hint only: the decoder reports what is wrong with it
            logger.debug("robo_resume: no prefetch plan for %s: %s", path, exc)
            table = None
        with self._lock:
            self._tables[path] = table
        return table

    def warm(self, paths: Iterable[Path], data: Iterable[Path] = ()) -> threading.Thread | None:
        """Start reading, on a background thread, the tables of the mp4s ``paths`` and the
        ends of the data files ``data`` (a small file is fetched whole, a large one its
        footer) that were not read or started yet, concurrently, so that the decoders and
        parquet readers opening them find their first bytes fetched; the thread, or None when
        there was nothing to read. It does not wait: :meth:`get` of a file being read waits
        for that one read (the file access reads a file's tables once), so a plan yields a
        piece's ranges as soon as its own file's tables are there. Errors are left to the
        readers (a hint only)."""
        with self._lock:
            todo = [
                p for p in dict.fromkeys(paths) if p not in self._warmed and p not in self._tables
            ]
            fresh = [p for p in dict.fromkeys(data) if p not in self._warmed]
            self._warmed.update(todo)
            self._warmed.update(fresh)
        jobs = [(self.get, p) for p in todo] + [(self._touch_end, p) for p in fresh]
        if not jobs:
            return None
        thread = threading.Thread(
            target=self._run, args=(jobs,), name="robo_resume-warm", daemon=True
        )
        thread.start()
        return thread

    @staticmethod
    def _run(jobs: list[tuple[Callable[[Path], object], Path]]) -> None:
        if len(jobs) == 1:
            fn, p = jobs[0]
            fn(p)
            return
        with ThreadPoolExecutor(min(WARM_THREADS, len(jobs))) as pool:
            list(pool.map(lambda job: job[0](job[1]), jobs))

    def _touch_end(self, path: Path) -> None:
        try:
            source = self.meta.files.open(path)
            if isinstance(source, str):
                return
            try:
                size = source.seek(0, io.SEEK_END)
                if size:
                    source.seek(size - 1)
                    source.read(1)
            finally:
                source.close()
        except Exception as exc:  # a hint only: the reader reports what is wrong
            logger.debug("robo_resume: could not open %s ahead: %s", path, exc)

    def _read(self, path: Path) -> SampleTable | None:
        ahead = getattr(self.meta.files, "opened_ahead", None)  # a remote file access
        return None if ahead is None else ahead(path)


def video_ranges(
    meta: DatasetMeta,
    pieces: Iterable[tuple[int, int, int]],
    tables: SampleTables,
    *,
    before: int = 0,
    after: int = 0,
) -> Iterator[tuple[Path, int, int]]:
    """The byte ranges ``(path, start, end)`` the decoders read for ``pieces``, in order.

    Args:
        meta: the dataset's metadata (episodes, cameras, fps, root).
        pieces: ``(episode_index, start, stop)`` frame ranges in the order they are read.
        tables: the files' sample tables (read when a piece first needs one).
        before: frames before a piece its windows read too (``delta_timestamps``).
        after: frames after a piece its windows read too.

    Yields:
        Per piece and camera with a video, the span of
        :meth:`~robo_resume.format.mp4_ranges.SampleTable.frame_range_bytes` for the piece's
        frames in the file (found by time: the episode's ``from_timestamp`` plus frame / fps).
        Cameras whose file cannot be read are left out.
    """
    fps = float(meta.fps)
    cams = list(meta.camera_keys)
    it = iter(pieces)

    def next_batch() -> tuple[list[tuple[int, int, int]], list[EpisodeInfo]]:
        batch = list(itertools.islice(it, WARM_PIECES))
        eps = [meta.episode(int(e)) for e, _, _ in batch]
        tables.warm(
            (tables.path(ep.videos[c].path) for ep in eps for c in cams if c in ep.videos),
            (tables.path(ep.data_path) for ep in eps),
        )
        return batch, eps

    # the files of the next batch of pieces are opened in the background while this one's
    # ranges are yielded: the plan never waits for more than the file of the piece at hand
    batch, eps = next_batch()
    while batch:
        upcoming = next_batch()
        yield from _ranges(meta, batch, eps, tables, cams, fps, before, after)
        batch, eps = upcoming


def _ranges(
    meta: DatasetMeta,
    batch: list[tuple[int, int, int]],
    eps: list[EpisodeInfo],
    tables: SampleTables,
    cams: list[str],
    fps: float,
    before: int,
    after: int,
) -> Iterator[tuple[Path, int, int]]:
    for (_, start, stop), ep in zip(batch, eps, strict=True):
        a, b = max(int(start) - before, 0), min(int(stop) + after, ep.length)
        if b <= a:
            continue
        for cam in cams:
            ref = ep.videos.get(cam)
            if ref is None:
                continue
            path = tables.path(ref.path)
            table = tables.get(path)
            if table is None:
                continue
            times = table.frame_times
            t0 = ref.from_timestamp + a / fps
            t1 = ref.from_timestamp + (b - 1) / fps
            half = 0.5 / fps
            first = int(np.searchsorted(times, t0 - half))
            last = int(np.searchsorted(times, t1 + half)) - 1
            if last < first or first >= table.num_frames:
                continue
            s, e = table.frame_range_bytes(first, min(last, table.num_frames - 1) + 1)
            # a decoder seeks from the first sample (VideoReader._park): FFmpeg reads through
            # to a chunk at most READ_THROUGH bytes after it instead of seeking, unless the
            # decoder parks at the last keyframe too (a file large enough)
            parked = table.first_park
            if parked <= s <= parked + READ_THROUGH and not table.parks_twice(s):
                s = parked
            yield path, s, e
