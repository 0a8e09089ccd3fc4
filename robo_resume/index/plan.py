"""Planning: cut episodes into chunks of contiguous frames. Pure data, no I/O.

A :class:`Chunk` is ``(episode_index, start, stop)``: at most ``chunk_frames`` consecutive frames
of one episode, read with one parquet range read and one video seek. Chunks cover every frame
exactly once, in episode then frame order. With ``cut_points`` (the video keyframes), chunks end
on a keyframe where possible, so the next chunk's seek lands exactly on its first frame.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import DatasetFormatError, describe

__all__ = ["MAX_PLAN_CHUNKS", "Chunk", "EpisodeSpan", "make_chunks", "plan_fingerprint"]

MAX_PLAN_CHUNKS = 2**26
"""Most chunks a plan may hold (one small object each: about 10 GB at the limit). The count is
computed from the lengths before anything is allocated, so a plan beyond it fails at once."""


@dataclass(frozen=True)
class EpisodeSpan:
    """What planning needs of an episode: its index, its first global index and its length."""

    episode_index: int
    dataset_from_index: int
    length: int


@dataclass(frozen=True)
class Chunk:
    """Frames ``[start, stop)`` of one episode; ``dataset_from_index`` is the index of ``start``."""

    episode_index: int
    start: int
    stop: int
    dataset_from_index: int

    @property
    def length(self) -> int:
        """Number of frames."""
        return self.stop - self.start


def make_chunks(
    episodes: Sequence[EpisodeSpan],
    chunk_frames: int,
    *,
    cut_points: Mapping[int, Sequence[int]] | None = None,
) -> tuple[Chunk, ...]:
    """Cut episodes into chunks of at most ``chunk_frames`` frames.

    ``cut_points[episode_index]`` (sorted frame indices, typically keyframes) lets a chunk end at
    the last cut point ``c`` with ``start < c <= start + chunk_frames``; without one in reach
    the chunk is ``chunk_frames`` long. Raises ValueError for a non-positive ``chunk_frames`` or
    an episode with no frames.
    """
    if not isinstance(chunk_frames, int) or chunk_frames < 1:
        raise ValueError(f"chunk_frames must be a positive int; found {chunk_frames!r}")
    count = sum(-(-max(ep.length, 0) // chunk_frames) for ep in episodes)  # at least this many
    if count > MAX_PLAN_CHUNKS:
        longest = max(episodes, key=lambda ep: ep.length)
        raise DatasetFormatError(
            describe(
                "The plan would be too large to hold",
                expected=f"at most {MAX_PLAN_CHUNKS} chunks",
                found=f"at least {count} chunks (episode lengths / chunk_frames={chunk_frames}; "
                f"the longest episode has {longest.length} frames)",
                episode=longest.episode_index,
                fix="check the episode lengths in meta/ (a damaged length?), or raise chunk_frames",
            )
        )
    chunks: list[Chunk] = []
    for ep in episodes:
        if ep.length <= 0:
            raise ValueError(
                f"Episode {ep.episode_index} has {ep.length} frames; expected at least 1. "
                "Fix: leave it out with episodes=[...]."
            )
        cuts = sorted(cut_points.get(ep.episode_index, ())) if cut_points else []
        start = 0
        while start < ep.length:
            limit = min(start + chunk_frames, ep.length)
            stop = limit
            if cuts and limit < ep.length:
                j = bisect.bisect_right(cuts, limit) - 1
                if j >= 0 and cuts[j] > start:
                    stop = cuts[j]
            chunks.append(Chunk(ep.episode_index, start, stop, ep.dataset_from_index + start))
            start = stop
    return tuple(chunks)


def plan_fingerprint(chunks: Sequence[Chunk]) -> str:
    """Stable sha256 hex digest of the chunk list (changes when any chunk changes)."""
    h = hashlib.sha256()
    for c in chunks:
        h.update(f"{c.episode_index},{c.start},{c.stop},{c.dataset_from_index};".encode())
    return h.hexdigest()
