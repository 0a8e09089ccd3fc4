"""Planning: cut episodes into chunks of contiguous frames. Pure data, no I/O.

A chunk is ``(episode_index, start, stop)``: at most ``chunk_frames`` consecutive frames of one
episode, read with one parquet range read and one video seek. Chunks cover every frame exactly
once, in episode then frame order. With ``cut_points`` (the video keyframes), every chunk after
an episode's first starts on a keyframe, so its seek lands exactly on its first frame.

The plan is columns (:class:`Plan`: four int64 arrays), never one Python object per chunk: a
dataset of 10^6 episodes has about 5x10^6 chunks. Indexing a plan gives a :class:`Chunk` for
code that wants one.

The older text fingerprint (:func:`plan_fingerprint`) is kept beside the digest to check
resume states written before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import DatasetFormatError, describe

__all__ = [
    "MAX_PLAN_CHUNKS",
    "PLAN_DIGEST_PREFIX",
    "Chunk",
    "EpisodeSpan",
    "EpisodeSpans",
    "Plan",
    "make_chunks",
    "plan_digest",
    "plan_fingerprint",
]

MAX_PLAN_CHUNKS = 2**26
"""Most chunks a plan may hold (four int64 columns: 2 GB at the limit). The count is computed
from the lengths before anything is allocated, so a plan beyond it fails at once."""


@dataclass(frozen=True)
class EpisodeSpan:
    """What planning needs of an episode: its index, its first global index and its length."""

    episode_index: int
    dataset_from_index: int
    length: int


class EpisodeSpans(NamedTuple):
    """The episodes to plan, as three int64 arrays of equal length (one row per episode)."""

    episode_index: np.ndarray
    dataset_from_index: np.ndarray
    length: np.ndarray

    @classmethod
    def of(cls, episodes: EpisodeSpans | Sequence[EpisodeSpan]) -> EpisodeSpans:
        """``episodes`` as columns: an :class:`EpisodeSpans` (arrays copied to int64 only when
        needed), a 3-tuple of arrays, or a sequence of :class:`EpisodeSpan`."""
        if isinstance(episodes, EpisodeSpans) or (
            isinstance(episodes, tuple)
            and len(episodes) == 3
            and all(isinstance(a, np.ndarray) for a in episodes)
        ):
            e: np.ndarray
            d: np.ndarray
            n: np.ndarray
            e, d, n = (np.asarray(a, dtype=np.int64).reshape(-1) for a in episodes)
        else:
            e = np.fromiter((s.episode_index for s in episodes), dtype=np.int64)
            d = np.fromiter((s.dataset_from_index for s in episodes), dtype=np.int64)
            n = np.fromiter((s.length for s in episodes), dtype=np.int64)
        if not len(e) == len(d) == len(n):
            raise ValueError(
                f"episode columns must have equal lengths; found {len(e)}, {len(d)}, {len(n)}"
            )
        return cls(e, d, n)


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


def _fits_int32(a: np.ndarray) -> bool:
    return not len(a) or (int(a.min()) >= -(2**31) and int(a.max()) < 2**31)


class Plan:
    """The chunks of a plan as four integer columns, in episode then frame order: int32 when
    every value fits (160 -> 80 MB at 10^6 episodes, 5x10^6 chunks), else int64; the values
    are the same either way (read them with ``int()`` or as int64 arithmetic).

    Row ``i`` is chunk ``i`` (its ``chunk_id`` in the schedule). ``plan[i]`` is a :class:`Chunk`,
    ``plan[a:b]`` a :class:`Plan`; iterating yields :class:`Chunk` s (one object per chunk: for
    small plans and tests). The arrays are read-only and shared, never copied per worker.
    """

    __slots__ = ("_digest", "_fingerprint", "dataset_from_index", "episode_index", "start", "stop")

    def __init__(
        self,
        episode_index: np.ndarray,
        start: np.ndarray,
        stop: np.ndarray,
        dataset_from_index: np.ndarray,
    ) -> None:
        cols = [np.asarray(a).reshape(-1) for a in (episode_index, start, stop, dataset_from_index)]
        if not all(a.dtype == np.int32 for a in cols):  # int32 already (make_chunks): kept
            cols = [a.astype(np.int64, copy=False) for a in cols]
            if len(cols[0]) and all(_fits_int32(a) for a in cols):  # half the memory
                cols = [a.astype(np.int32) for a in cols]
        if len({len(a) for a in cols}) != 1:
            raise ValueError(
                f"plan columns must have equal lengths; found {[len(a) for a in cols]}"
            )
        for a in cols:
            a.flags.writeable = False
        self.episode_index, self.start, self.stop, self.dataset_from_index = cols
        self._fingerprint: str | None = None
        self._digest: str | None = None

    @classmethod
    def from_chunks(cls, chunks: Plan | Sequence[Chunk]) -> Plan:
        """``chunks`` as a :class:`Plan` (a plan is returned as it is)."""
        if isinstance(chunks, Plan):
            return chunks
        return cls(
            *(
                np.fromiter((getattr(c, k) for c in chunks), dtype=np.int64, count=len(chunks))
                for k in ("episode_index", "start", "stop", "dataset_from_index")
            )
        )

    @property
    def lengths(self) -> np.ndarray:
        """Frames per chunk (``stop - start``), a new int64 array."""
        return np.subtract(self.stop, self.start, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Plan(
                self.episode_index[i], self.start[i], self.stop[i], self.dataset_from_index[i]
            )
        return Chunk(
            int(self.episode_index[i]),
            int(self.start[i]),
            int(self.stop[i]),
            int(self.dataset_from_index[i]),
        )

    def __iter__(self) -> Iterator[Chunk]:
        cols = (self.episode_index, self.start, self.stop, self.dataset_from_index)
        for e, a, b, d in zip(*(c.tolist() for c in cols), strict=True):
            yield Chunk(e, a, b, d)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return len(self) == len(other) and all(
            np.array_equal(getattr(self, k), getattr(other, k))
            for k in ("episode_index", "start", "stop", "dataset_from_index")
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Plan({len(self)} chunks, {int(self.lengths.sum())} frames)"

    def fingerprint(self) -> str:
        """:func:`plan_fingerprint` of the plan (computed once)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_columns(
                (self.episode_index, self.start, self.stop, self.dataset_from_index)
            )
        return self._fingerprint

    def digest(self) -> str:
        """:func:`plan_digest` of the plan (computed once)."""
        if self._digest is None:
            self._digest = _digest_columns(
                (self.episode_index, self.start, self.stop, self.dataset_from_index)
            )
        return self._digest


def make_chunks(
    episodes: EpisodeSpans | Sequence[EpisodeSpan],
    chunk_frames: int,
    *,
    cut_points: Mapping[int, Sequence[int] | np.ndarray] | None = None,
) -> Plan:
    """Cut episodes into chunks of about ``chunk_frames`` frames; the :class:`Plan`.

    ``episodes``: :class:`EpisodeSpans` columns (or :class:`EpisodeSpan` s), in plan order.
    Without ``cut_points`` every chunk is ``chunk_frames`` long (an episode's last one shorter).
    ``cut_points[episode_index]`` (frame indices of the episode, typically its video keyframes;
    values outside ``0 < c < length`` are ignored) makes every chunk of that episode after its
    first start on a cut point: a chunk starting at ``start`` ends at the last cut point ``c``
    with ``start < c <= start + chunk_frames`` (short GOPs: chunks near ``chunk_frames``); with
    none in reach it is extended to the next cut point after ``start`` (long GOPs: chunks up to
    one keyframe interval long), or to the episode's end when there is none. The episode's
    first chunk starts at frame 0 wherever that is in the video. Episodes missing from
    ``cut_points`` are cut evenly. Raises ValueError for a non-positive ``chunk_frames`` or an
    episode with no frames, DatasetFormatError for a plan over :data:`MAX_PLAN_CHUNKS`.
    Pure and vectorised: cost O(chunks) in numpy, plus one numpy pass per chunk of the longest
    episode when there are cut points.
    """
    if not isinstance(chunk_frames, int) or chunk_frames < 1:
        raise ValueError(f"chunk_frames must be a positive int; found {chunk_frames!r}")
    spans = EpisodeSpans.of(episodes)
    lengths = spans.length
    per = -(-np.maximum(lengths, 0) // chunk_frames)
    count = int(per.sum())  # at least this many
    if count > MAX_PLAN_CHUNKS:
        longest = int(np.argmax(lengths))
        raise DatasetFormatError(
            describe(
                "The plan would be too large to hold",
                expected=f"at most {MAX_PLAN_CHUNKS} chunks",
                found=f"at least {count} chunks (episode lengths / chunk_frames={chunk_frames}; "
                f"the longest episode has {int(lengths[longest])} frames)",
                episode=int(spans.episode_index[longest]),
                fix="check the episode lengths in meta/ (a damaged length?), or raise chunk_frames",
            )
        )
    bad = np.flatnonzero(lengths <= 0)
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"Episode {int(spans.episode_index[i])} has {int(lengths[i])} frames; expected at "
            "least 1. Fix: leave it out with episodes=[...]."
        )
    if not cut_points:
        return _even_chunks(spans, per, count, chunk_frames)
    keys, cut = _cut_keys(spans, cut_points)
    if not cut.any():
        return _even_chunks(spans, per, count, chunk_frames)
    row, start, stop = _cut_chunks(lengths, chunk_frames, keys, cut)
    return Plan(spans.episode_index[row], start, stop, spans.dataset_from_index[row] + start)


def _even_chunks(spans: EpisodeSpans, per: np.ndarray, count: int, chunk_frames: int) -> Plan:
    """Chunks without cut points: episode ``i`` gives ``per[i]`` chunks of ``chunk_frames``
    frames (its last one shorter). The columns are repeats of the episodes' values, computed in
    int32 when every value fits (what :class:`Plan` would store anyway: at 10^6 episodes,
    5x10^6 chunks, no int64 copy to narrow afterwards)."""
    n = len(spans.length)
    top = int((spans.dataset_from_index + spans.length).max()) if n else 0
    small = n and max(count, top, int(spans.length.max()) + chunk_frames) < 2**31
    small = small and _fits_int32(spans.episode_index) and int(spans.dataset_from_index.min()) >= 0
    dt = np.int32 if small else np.int64
    first = np.cumsum(per) - per  # the episode's first chunk number
    start: np.ndarray = np.arange(count, dtype=dt)
    start -= np.repeat(first.astype(dt), per)  # chunk number within its episode
    start *= chunk_frames
    stop = start + dt(chunk_frames)
    np.minimum(stop, np.repeat(spans.length.astype(dt), per), out=stop)
    frame = np.repeat(spans.dataset_from_index.astype(dt), per)
    frame += start
    return Plan(np.repeat(spans.episode_index.astype(dt), per), start, stop, frame)


def _cut_keys(
    spans: EpisodeSpans, cut_points: Mapping[int, Sequence[int] | np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, cut)``: the cut points that can start a chunk (``0 < c < length``) as sorted
    global keys ``offset[row] + c`` (``offset``: the cumulative lengths), one array for all
    episodes, and per row whether the episode has cut points at all (is in ``cut_points``)."""
    offset = np.cumsum(spans.length) - spans.length
    cut = np.zeros(len(spans.length), dtype=bool)
    rows = {int(e): i for i, e in enumerate(spans.episode_index.tolist()) if int(e) in cut_points}
    parts = []
    for e, i in rows.items():
        cut[i] = True
        c = np.asarray(list(cut_points[e]), dtype=np.int64).reshape(-1)
        c = c[(c > 0) & (c < spans.length[i])]
        parts.append(c + offset[i])
    keys = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    return keys, cut


def _cut_chunks(
    lengths: np.ndarray, chunk_frames: int, keys: np.ndarray, cut: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunks with cut points (rule: :func:`make_chunks`): every episode advances one chunk per
    round (vectorised over the episodes still open), so the rounds are the chunks of the
    longest episode. ``cut[row]``: the episode has cut points (else it is cut evenly)."""
    offset = np.cumsum(lengths) - lengths
    rows_out, starts_out, stops_out = [], [], []
    rows: np.ndarray = np.arange(len(lengths))
    start: np.ndarray = np.zeros(len(lengths), dtype=np.int64)
    last = len(keys) - 1
    while len(rows):
        n, off = lengths[rows], offset[rows]
        limit = np.minimum(start + chunk_frames, n)
        stop = limit.copy()
        inner = limit < n
        if last >= 0:
            j = np.searchsorted(keys, off + limit, side="right") - 1
            at = keys[np.maximum(j, 0)]
            ok = inner & (j >= 0) & (at > off + start)  # a cut point in reach: the last one
            stop[ok] = at[ok] - off[ok]
            # none in reach: the next one after the reach (this episode's keys are < off + n)
            far = inner & ~ok & cut[rows]
            nxt = keys[np.minimum(j + 1, last)]
            has = far & (j < last) & (nxt < off + n)
            stop[has] = nxt[has] - off[has]
            end = far & ~has
            stop[end] = n[end]
        else:  # no cut point anywhere: episodes in cut_points are one chunk each
            stop[inner & cut[rows]] = n[inner & cut[rows]]
        rows_out.append(rows)
        starts_out.append(start)
        stops_out.append(stop)
        more = stop < n
        rows, start = rows[more], stop[more]
    row = np.concatenate(rows_out)
    start = np.concatenate(starts_out)
    stop = np.concatenate(stops_out)
    order = np.lexsort((start, row))  # episode then frame order
    return row[order], start[order], stop[order]


PLAN_DIGEST_PREFIX = "c1:"
"""Start of a :func:`plan_digest` value; a plan fingerprint without it is the older
:func:`plan_fingerprint` (16 hex digits), which resume states carried before."""


def plan_digest(chunks: Plan | Sequence[Chunk]) -> str:
    """Stable digest of the chunk list: ``"c1:"`` and 32 hex digits (changes when any chunk
    changes); what dataset fingerprints and resume states carry as ``"plan"``.

    The BLAKE2b of the four columns' bytes (each as little-endian int32 when all its values fit,
    else int64; the width and row count are hashed first, so two plans give the same digest
    only if their columns are equal): one hash over the columns' bytes, far faster than the
    text digest of :func:`plan_fingerprint`.
    """
    if isinstance(chunks, Plan):
        return chunks.digest()
    return Plan.from_chunks(chunks).digest()


def _digest_columns(cols: Sequence[np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"plan-columns;{len(cols[0])};".encode())
    for c in cols:
        small = not len(c) or (int(c.min()) >= -(2**31) and int(c.max()) < 2**31)
        col = c.astype("<i4") if small else c.astype("<i8", copy=False)
        h.update(b"4;" if small else b"8;")
        h.update(memoryview(np.ascontiguousarray(col)).cast("B"))
    return PLAN_DIGEST_PREFIX + h.hexdigest()


def plan_fingerprint(chunks: Plan | Sequence[Chunk]) -> str:
    """Stable sha256 hex digest of the chunk list (changes when any chunk changes).

    The digest of the text ``"{episode_index},{start},{stop},{dataset_from_index};"`` per chunk,
    in plan order: the ``"plan"`` value (its first 16 digits) that resume states carried
    before :func:`plan_digest`; kept to check such states. Computed from the columns in blocks,
    without a Python object or string per chunk.
    """
    if isinstance(chunks, Plan):
        return chunks.fingerprint()
    return Plan.from_chunks(chunks).fingerprint()


_BLOCK = 1 << 16  # rows per hashed block: a few MB of text at a time
_DIGITS4 = np.frombuffer(
    "".join(f"{i:04d}" for i in range(10_000)).encode(), dtype=np.uint8
).reshape(10_000, 4)
_POW10 = 10 ** np.arange(1, 19, dtype=np.int64)


def fingerprint_columns(cols: Sequence[np.ndarray]) -> str:
    h = hashlib.sha256()
    if any(len(c) and int(c.min()) < 0 for c in cols):  # never in a real plan: the plain way
        for row in zip(*(c.tolist() for c in cols), strict=True):
            h.update(("{},{},{},{};".format(*row)).encode())
        return h.hexdigest()
    pieces = [
        max(1, -(-(1 + int(np.searchsorted(_POW10, c.max(), "right"))) // 4)) if len(c) else 1
        for c in cols
    ]
    width = sum(4 * p + 1 for p in pieces)
    seps = np.frombuffer(b",,,;", dtype=np.uint8)
    for lo in range(0, len(cols[0]), _BLOCK):
        block = [c[lo : lo + _BLOCK].astype(np.int64) for c in cols]
        n = len(block[0])
        text = np.empty((n, width), dtype=np.uint8)
        keep = np.ones((n, width), dtype=bool)
        at = 0
        for k, (v, p) in enumerate(zip(block, pieces, strict=True)):
            for q in range(p):
                part = (v // 10 ** (4 * (p - 1 - q))) % 10_000
                text[:, at + 4 * q : at + 4 * q + 4] = _DIGITS4[part]
            digits = 1 + np.searchsorted(_POW10, v, side="right")
            keep[:, at : at + 4 * p] = np.arange(4 * p) >= (4 * p - digits)[:, None]
            at += 4 * p
            text[:, at] = seps[k]
            at += 1
        h.update(text[keep].tobytes())
    return h.hexdigest()
