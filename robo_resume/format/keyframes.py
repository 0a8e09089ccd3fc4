"""Where chunks may start: the keyframes of the first camera's videos, per episode.

Used by :class:`~robo_resume.dataset.ChunkedEpisodeDataset` (``StreamTuning(
cut_at_keyframes=...)``) and by ``robo-resume plan``, which must plan the same chunks. One read
of each video file's mp4 index (:func:`~robo_resume.format.mp4_index.keyframe_frames`, a small
read per file); in the automatic mode, short-GOP datasets stop after :data:`AUTO_FILES`
files and a dataset without its videos reads nothing.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..errors import RoboResumeError
from .metadata import DatasetMeta
from .mp4_index import keyframe_frames
from .validate import inside_root

__all__ = ["AUTO_FILES", "AUTO_KEYFRAME_INTERVAL", "keyframe_cuts"]

logger = logging.getLogger("robo_resume")

T = TypeVar("T")
R = TypeVar("R")

AUTO_KEYFRAME_INTERVAL = 2
"""``cut_at_keyframes=None`` cuts at keyframes when some keyframe interval of the first camera's
videos is longer than this many frames (at 2 or less the chunks would be at most a frame off
the even plan)."""

AUTO_FILES = 8
"""``cut_at_keyframes=None`` decides from the first this many video files of the first camera:
when none of their keyframe intervals exceeds :data:`AUTO_KEYFRAME_INTERVAL`, the other files
are not read (construction stays cheap for short-GOP datasets of many files)."""

_MANY_FILES = 2000  # keyframe reading announced from this many files (about half a second)

REMOTE_AHEAD = 8
"""Files of a remote dataset whose keyframes are read at once."""


def _in_order(fn: Callable[[T], R], items: Sequence[T], ahead: int) -> Iterator[Callable[[], R]]:
    """For each item in order, a call returning ``fn(item)`` or raising what it raised; with
    ``ahead`` > 0 up to that many items are computed ahead on threads (a consumer that stops
    leaves at most that many computed for nothing)."""
    if ahead <= 0:
        for item in items:
            yield functools.partial(fn, item)
        return
    with ThreadPoolExecutor(ahead) as pool:
        pending: deque[Future[R]] = deque()
        todo = deque(items)
        try:
            while True:
                while len(pending) < ahead and todo:
                    pending.append(pool.submit(fn, todo.popleft()))
                if not pending:
                    return
                yield pending.popleft().result
        finally:
            for future in pending:
                future.cancel()


def keyframe_cuts(
    meta: DatasetMeta, episodes: Sequence[int] | np.ndarray, *, auto: bool, lookback: int = 0
) -> dict[int, np.ndarray] | None:
    """Keyframes of the first camera per episode of ``episodes`` (frames of the episode), the
    ``cut_points`` of :func:`~robo_resume.index.plan.make_chunks`.

    ``auto`` (``cut_at_keyframes=None``): None, for the even plan, when there is no camera, the
    first episode's file is missing or no keyframe interval of the first :data:`AUTO_FILES`
    files read (or of all, when fewer) exceeds :data:`AUTO_KEYFRAME_INTERVAL`; an unreadable
    file leaves its episodes out (cut evenly; reading reports the file). Otherwise errors are
    raised. ``lookback``: frames the camera's delta window reaches back; the cuts move that far
    after each keyframe, so a chunk's first window starts on the keyframe (not one frame before
    it, a GOP back).
    """
    if not meta.camera_keys:
        return None
    episodes = np.asarray(episodes, dtype=np.int64)
    cam = meta.camera_keys[0]
    video = meta.columns.videos[cam]
    if auto and len(episodes):  # a dataset without its videos: decided in O(1)
        e = int(episodes[0])
        path = inside_root(meta.root, meta.episode(e).videos[cam].path, episode=e)
        if not meta.files.is_file(path):
            logger.debug("cut_at_keyframes=None: %s is missing, chunks are not cut", path)
            return None
    rows, _ = meta.columns.positions(episodes)
    files = video.file[rows]
    fps = meta.fps
    first = np.rint(video.from_timestamp[rows] * fps).astype(np.int64)
    lengths = meta.columns.length[rows]
    per_file: dict[int, np.ndarray] = {}
    widest = 0
    codes, where = np.unique(files, return_index=True)
    if len(codes) >= _MANY_FILES:  # a few seconds: say what is happening
        logger.info(
            "robo_resume: reading the keyframes of %d video files of '%s' (mp4 index, "
            "about 0.3 ms per file; StreamTuning(cut_at_keyframes=False) skips this)",
            len(codes),
            cam,
        )
    jobs = []
    for code, at in zip(codes.tolist(), where.tolist(), strict=True):
        e = int(episodes[at])
        jobs.append((code, e, inside_root(meta.root, video.paths[code], episode=e)))

    def read(job: tuple[int, int, Path]) -> np.ndarray:
        return keyframe_frames(job[2], fps, episode=job[1], files=meta.files)

    # a remote dataset's files are read a few at once (each is a few requests in a row)
    ahead = REMOTE_AHEAD if getattr(meta.files, "plans", False) else 0
    for (code, _e, path), outcome in zip(jobs, _in_order(read, jobs, ahead), strict=True):
        try:
            keys = outcome()
        except (OSError, RoboResumeError) as exc:
            if not auto:
                raise
            logger.debug("cut_at_keyframes=None: no keyframes of %s (%s)", path, exc)
            continue
        per_file[code] = keys
        if widest <= AUTO_KEYFRAME_INTERVAL:  # until one interval is known to be longer
            widest = max(widest, int(np.diff(keys).max()) if len(keys) > 1 else 2**31)
            if auto and widest <= AUTO_KEYFRAME_INTERVAL and len(per_file) >= AUTO_FILES:
                return None  # short GOPs (lerobot's AV1): the rest is not read
    if auto and widest <= AUTO_KEYFRAME_INTERVAL:
        return None
    cuts: dict[int, np.ndarray] = {}
    for i, code in enumerate(files.tolist()):
        found = per_file.get(code)
        if found is not None:
            a, n = int(first[i]), int(lengths[i])
            lo, hi = np.searchsorted(found, [a, a + n], side="right")  # inside: a < k
            cuts[int(episodes[i])] = found[lo:hi] - a + lookback
    return cuts
