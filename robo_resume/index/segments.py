"""Segments as columns: the pieces of chunks one stream reads, in the stream's order. Pure.

A *segment* is frames ``[start, stop)`` of an episode that one stream reads as one piece of a
chunk (a chunk cut by a stream boundary becomes two). A stream-epoch has about
``chunks / streams`` of them, so they are kept as int64 columns (:class:`Segments`); a
:class:`Segment` object is made only for the few segments of a group being read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["NO_EPOCH", "Segment", "Segments"]

NO_EPOCH = -1
"""``Segments.epoch`` value of a segment of an epoch's own schedule (``Segment.epoch`` None)."""

_COLUMNS = ("chunk_id", "episode_index", "start", "stop", "dataset_from_index", "epoch")


@dataclass(frozen=True)
class Segment:
    """Frames ``[start, stop)`` of an episode that one stream reads as one piece of a chunk.

    ``epoch``: None in an epoch's own schedule; in a remainder epoch (elastic resume), the
    epoch the piece was left over from (a remainder can hold pieces of several epochs).
    """

    chunk_id: int
    episode_index: int
    start: int
    stop: int
    dataset_from_index: int
    epoch: int | None = None

    @property
    def length(self) -> int:
        """Number of frames."""
        return self.stop - self.start


class Segments:
    """Segments in order, as six int64 columns (``epoch`` is :data:`NO_EPOCH` for None).

    Treated as immutable: no method changes a column in place (:meth:`replace` copies).

    ``segs[i]`` is a :class:`Segment`; ``segs[a:b]`` and ``segs[index_array]`` are
    :class:`Segments`; iterating yields :class:`Segment` s.
    """

    __slots__ = _COLUMNS
    chunk_id: np.ndarray
    episode_index: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    dataset_from_index: np.ndarray
    epoch: np.ndarray

    def __init__(self, chunk_id, episode_index, start, stop, dataset_from_index, epoch=None):
        cols = [
            np.asarray(a, dtype=np.int64).reshape(-1)
            for a in (chunk_id, episode_index, start, stop, dataset_from_index)
        ]
        n = len(cols[0])
        if any(len(c) != n for c in cols):
            raise ValueError(f"segment columns differ in length: {[len(c) for c in cols]}")
        if epoch is None:
            epoch = np.full(n, NO_EPOCH, dtype=np.int64)
        else:
            epoch = np.broadcast_to(np.asarray(epoch, dtype=np.int64), (n,)).copy()
        for k, c in zip(_COLUMNS, [*cols, epoch], strict=True):
            setattr(self, k, c)

    @classmethod
    def _raw(cls, cols: Sequence[np.ndarray]) -> Segments:
        """Segments over six int64 columns of equal length, taken as they are (no checks)."""
        out = object.__new__(cls)
        for k, c in zip(_COLUMNS, cols, strict=True):
            setattr(out, k, c)
        return out

    @classmethod
    def empty(cls) -> Segments:
        """No segments."""
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z)

    @classmethod
    def of(cls, segments: Segments | Sequence[Segment]) -> Segments:
        """``segments`` as columns (columns are returned as they are)."""
        if isinstance(segments, Segments):
            return segments
        segs = list(segments)
        chunk_id, episode_index, start, stop, dataset_from_index = (
            np.fromiter((getattr(s, k) for s in segs), dtype=np.int64, count=len(segs))
            for k in _COLUMNS[:-1]
        )
        epoch = np.fromiter(
            (NO_EPOCH if s.epoch is None else s.epoch for s in segs), np.int64, len(segs)
        )
        return cls(chunk_id, episode_index, start, stop, dataset_from_index, epoch)

    @classmethod
    def concat(cls, parts: Sequence[Segments]) -> Segments:
        """The segments of ``parts``, one after the other."""
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls._raw([np.concatenate([getattr(p, k) for p in parts]) for k in _COLUMNS])

    @property
    def lengths(self) -> np.ndarray:
        """Frames per segment (``stop - start``)."""
        return self.stop - self.start

    def frames(self) -> int:
        """Frames in all."""
        return int(self.lengths.sum())

    def replace(self, **columns: np.ndarray) -> Segments:
        """A copy with some columns replaced (same number of rows)."""
        return Segments._raw(
            [np.asarray(columns.get(k, getattr(self, k)), np.int64) for k in _COLUMNS]
        )

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i):
        if isinstance(i, slice | np.ndarray | list):
            return Segments._raw([getattr(self, k)[i] for k in _COLUMNS])
        e = int(self.epoch[i])
        return Segment(
            int(self.chunk_id[i]),
            int(self.episode_index[i]),
            int(self.start[i]),
            int(self.stop[i]),
            int(self.dataset_from_index[i]),
            None if e == NO_EPOCH else e,
        )

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.objects(0, len(self)))

    def objects(self, lo: int, hi: int) -> tuple[Segment, ...]:
        """Rows ``[lo, hi)`` as :class:`Segment` objects (a group's few members)."""
        cols = [getattr(self, k)[lo:hi].tolist() for k in _COLUMNS]
        return tuple(
            Segment(c, e, a, b, d, None if x == NO_EPOCH else x)
            for c, e, a, b, d, x in zip(*cols, strict=True)
        )

    def __repr__(self) -> str:
        return f"Segments({len(self)} segments, {self.frames()} frames)"
