"""The schedule: which frames each stream emits, in which order. Pure functions, no I/O.

Everything here is a function of ``(chunks, seed, epoch, topology, options)``. Random draws use
``numpy.random.SeedSequence(entropy=seed, spawn_key=(epoch, PURPOSE, ...))``: a fresh generator
per question, never one that advances between calls, with a purpose tag so that the seeds of the
epoch permutation, the per-stream shuffle and the interleave never collide.

Per epoch ``e``:

1. the chunks are permuted from ``(seed, e)`` and concatenated into one sequence of ``T`` frames;
2. stream ``s`` of ``S`` owns positions ``[s*Q, (s+1)*Q)`` of it, where ``Q`` is the same for all
   streams (``T // S`` rounded down to whole batches with ``drop_last``; ``tail="pad"`` rounds up
   and wraps around to the start instead). ``tail="keep"`` (evaluation) gives every frame to
   exactly one stream instead: consecutive pieces of :func:`stream_lengths` frames, which may
   differ by up to a batch (see there). Chunks cut by a stream boundary become two *segments*;
3. each stream's segments are shuffled from ``(seed, e, s)`` (the per-worker shuffle);
4. consecutive runs of ``interleave`` segments form a *group*; a group's frames are emitted in a
   seeded random interleaving that keeps every segment in frame order (sequential decoding).

Positions are found with prefix sums and ``searchsorted``: the cost of locating position ``p``
is bounded by the number of segments of one stream-epoch plus one group, whatever ``p`` is.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .plan import Chunk

__all__ = [
    "Cursor",
    "Group",
    "ResumePoint",
    "Schedule",
    "ScheduleConfig",
    "Segment",
    "StreamStart",
    "Topology",
    "resume_point",
    "stream_lengths",
    "worker_batches_done",
]

_PERMUTE, _STREAM, _GROUP = 1, 2, 3  # purpose tags in the seed's spawn key
TAILS = ("drop", "pad", "keep")


def _positive_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; found {value!r}")


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks x ``num_workers`` DataLoader workers (0 = the main process)."""

    world_size: int = 1
    num_workers: int = 0

    def __post_init__(self) -> None:
        _positive_int("world_size", self.world_size, 1)
        _positive_int("num_workers", self.num_workers, 0)

    @property
    def workers_per_rank(self) -> int:
        """Streams per rank: ``max(num_workers, 1)``."""
        return max(self.num_workers, 1)

    @property
    def num_streams(self) -> int:
        """Streams in all: ``world_size * workers_per_rank``."""
        return self.world_size * self.workers_per_rank

    def stream_id(self, rank: int, worker_id: int) -> int:
        """Global stream id ``rank * workers_per_rank + worker_id``."""
        if not (0 <= rank < self.world_size and 0 <= worker_id < self.workers_per_rank):
            raise ValueError(
                f"rank {rank} / worker {worker_id} outside the topology "
                f"({self.world_size} ranks x {self.workers_per_rank} workers)"
            )
        return rank * self.workers_per_rank + worker_id


@dataclass(frozen=True)
class ScheduleConfig:
    """Options of the schedule (see the module docstring)."""

    seed: int = 0
    batch_size: int = 1
    drop_last: bool = False
    tail: str = "drop"
    interleave: int = 4
    shuffle: bool = True

    def __post_init__(self) -> None:
        _positive_int("seed", self.seed, 0)
        _positive_int("batch_size", self.batch_size, 1)
        _positive_int("interleave", self.interleave, 1)
        if self.tail not in TAILS:
            raise ValueError(f"tail must be one of {TAILS}; found {self.tail!r}")
        if self.tail == "keep" and self.drop_last:
            raise ValueError(
                "tail='keep' yields every frame exactly once, which drop_last=True contradicts "
                "(it drops each stream's short last batch); found tail='keep' with "
                "drop_last=True. Fix: use drop_last=False for evaluation, or tail='drop'/'pad'."
            )


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


@dataclass(frozen=True, eq=False)
class Group:
    """Segments read together; ``order[i]`` is the segment that emits the group's i-th frame."""

    segments: tuple[Segment, ...]
    order: np.ndarray
    position: int

    def global_indices(self) -> np.ndarray:
        """The dataset ``index`` of every frame of the group, in emission order."""
        out = np.empty(len(self.order), dtype=np.int64)
        for j, seg in enumerate(self.segments):
            mask = self.order == j
            out[mask] = seg.dataset_from_index + np.arange(int(mask.sum()))
        return out


@dataclass(frozen=True)
class Cursor:
    """Position ``p`` of a stream-epoch: group, offset in it, frames done per segment of it."""

    group: int
    offset: int
    done: tuple[int, ...]


class Schedule:
    """The pure schedule of one plan, config and topology. Cheap to build; caches per epoch.

    Attributes:
        stream_frames: frames each stream yields per epoch, per global stream id (all ``Q``
            with tail "drop" and "pad"; see :func:`stream_lengths` for "keep").
        frames_per_stream: ``Q``, frames each stream yields per epoch (the most any stream
            yields with tail "keep"; use :meth:`length` for one stream).
        batches_per_stream: batches each stream yields per epoch (the most, with "keep").
        batches_per_rank: batches one rank's DataLoader yields per epoch (equal on every rank
            except with tail "keep" when the frames cannot be split so: then the most; see
            :meth:`rank_batches`).
    """

    def __init__(self, chunks: Sequence[Chunk], config: ScheduleConfig, topology: Topology):
        if not chunks:
            raise ValueError("the plan has no chunks; expected at least one episode")
        self.chunks = tuple(chunks)
        self.config = config
        self.topology = topology
        self._lengths = np.fromiter((c.length for c in self.chunks), dtype=np.int64)
        self.total_frames = int(self._lengths.sum())
        s = topology.num_streams
        b = config.batch_size
        if config.tail == "keep":
            lengths = stream_lengths(self.total_frames, topology, b, infinite=False)
            if lengths is None:  # ranks cannot all get the same batch count: as near as can be
                lengths = _ranks_apart(self.total_frames, topology, b)
            self.stream_frames = lengths
        else:
            unit = b if config.drop_last else 1
            if config.tail == "drop":
                q = (self.total_frames // (s * unit)) * unit
            else:
                q = -(-self.total_frames // (s * unit)) * unit
            if q == 0:
                raise ValueError(
                    f"The plan has {self.total_frames} frames but {s} streams x {unit} frames "
                    f"(batch_size with drop_last) need at least {s * unit}. Fix: use fewer "
                    "workers or ranks, a smaller batch_size, drop_last=False, or tail='pad'."
                )
            self.stream_frames = (q,) * s
        self._stream_starts = np.concatenate(([0], np.cumsum(self.stream_frames, dtype=np.int64)))
        self.frames_per_stream = max(self.stream_frames)
        per_stream = [-(-n // b) for n in self.stream_frames]
        self.batches_per_stream = max(per_stream)
        wp = topology.workers_per_rank
        self.batches_per_rank = max(
            sum(per_stream[r * wp : (r + 1) * wp]) for r in range(topology.world_size)
        )
        self._rank_batches = tuple(
            sum(per_stream[r * wp : (r + 1) * wp]) for r in range(topology.world_size)
        )
        self.segments = functools.lru_cache(maxsize=64)(self._segments)
        self._group_starts = functools.lru_cache(maxsize=64)(self._group_starts_uncached)
        self._epoch_layout = functools.lru_cache(maxsize=4)(self._epoch_layout_uncached)

    def __getstate__(self):
        state = self.__dict__.copy()
        for k in ("segments", "_group_starts", "_epoch_layout"):
            state.pop(k)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.segments = functools.lru_cache(maxsize=64)(self._segments)
        self._group_starts = functools.lru_cache(maxsize=64)(self._group_starts_uncached)
        self._epoch_layout = functools.lru_cache(maxsize=4)(self._epoch_layout_uncached)

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence(entropy=self.config.seed, spawn_key=tuple(int(k) for k in key))
        )

    def _check(self, epoch: int, stream: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0; found {epoch}")
        if not 0 <= stream < self.topology.num_streams:
            raise ValueError(f"stream must be in [0, {self.topology.num_streams}); found {stream}")

    def _epoch_layout_uncached(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.chunks)
        perm = self._rng(epoch, _PERMUTE).permutation(n) if self.config.shuffle else np.arange(n)
        offsets = np.concatenate(([0], np.cumsum(self._lengths[perm])))
        return perm, offsets

    def _segments(self, epoch: int, stream: int) -> tuple[Segment, ...]:
        """The stream's segments for an epoch, after the per-stream shuffle."""
        self._check(epoch, stream)
        perm, offsets = self._epoch_layout(epoch)
        t = self.total_frames
        pieces = []
        a, b = int(self._stream_starts[stream]), int(self._stream_starts[stream + 1])
        while a < b:  # positions past T wrap around (tail="pad")
            x = a % t
            take = min(b - a, t - x)
            pieces.append((x, x + take))
            a += take
        segs: list[Segment] = []
        for x, y in pieces:
            k = int(np.searchsorted(offsets, x, side="right")) - 1
            while k < len(perm) and offsets[k] < y:
                cid = int(perm[k])
                c = self.chunks[cid]
                lo = max(x, int(offsets[k])) - int(offsets[k])
                hi = min(y, int(offsets[k + 1])) - int(offsets[k])
                segs.append(
                    Segment(
                        cid, c.episode_index, c.start + lo, c.start + hi, c.dataset_from_index + lo
                    )
                )
                k += 1
        if self.config.shuffle:
            order = self._rng(epoch, _STREAM, stream).permutation(len(segs))
            segs = [segs[i] for i in order]
        return tuple(segs)

    def _group_starts_uncached(self, epoch: int, stream: int) -> np.ndarray:
        segs = self.segments(epoch, stream)
        size = self.config.interleave
        lengths = [sum(s.length for s in segs[i : i + size]) for i in range(0, len(segs), size)]
        return np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))

    def length(self, stream: int) -> int:
        """Frames stream ``stream`` yields per epoch (``frames_per_stream`` unless tail "keep")."""
        return self.stream_frames[stream]

    def rank_batches(self, rank: int) -> int:
        """Batches rank ``rank``'s DataLoader yields per epoch."""
        return self._rank_batches[rank]

    def num_groups(self, epoch: int, stream: int) -> int:
        """Number of groups in a stream-epoch."""
        return len(self._group_starts(epoch, stream)) - 1

    def group(self, epoch: int, stream: int, index: int) -> Group:
        """Group ``index`` of a stream-epoch, with its seeded interleave order."""
        segs = self.segments(epoch, stream)
        size = self.config.interleave
        members = segs[index * size : (index + 1) * size]
        if not members:
            raise IndexError(f"group {index} out of range ({self.num_groups(epoch, stream)})")
        order = np.repeat(np.arange(len(members), dtype=np.int64), [s.length for s in members])
        if self.config.shuffle and len(members) > 1:
            order = self._rng(epoch, _GROUP, stream, index).permutation(order)
        start = int(self._group_starts(epoch, stream)[index])
        return Group(members, order, start)

    def locate(self, epoch: int, stream: int, position: int) -> Cursor:
        """Where position ``0 <= position < length(stream)`` of a stream-epoch is."""
        self._check(epoch, stream)
        if not 0 <= position < self.length(stream):
            raise ValueError(f"position must be in [0, {self.length(stream)}); found {position}")
        starts = self._group_starts(epoch, stream)
        g = int(np.searchsorted(starts, position, side="right")) - 1
        grp = self.group(epoch, stream, g)
        offset = position - int(starts[g])
        done = np.bincount(grp.order[:offset], minlength=len(grp.segments))
        return Cursor(g, offset, tuple(int(d) for d in done))

    def iter_groups(
        self, epoch: int, stream: int, position: int = 0
    ) -> Iterator[tuple[Group, int]]:
        """Groups from the one holding ``position`` on; the int is the offset in the first."""
        if position >= self.length(stream):
            return
        first = self.locate(epoch, stream, position)
        yield self.group(epoch, stream, first.group), first.offset
        for g in range(first.group + 1, self.num_groups(epoch, stream)):
            yield self.group(epoch, stream, g), 0

    def frame_indices(
        self, epoch: int, stream: int, start: int = 0, stop: int | None = None
    ) -> np.ndarray:
        """Dataset ``index`` values the stream emits at positions ``[start, stop)`` of an epoch."""
        n = self.length(stream)
        stop = n if stop is None else min(stop, n)
        parts = []
        for grp, offset in self.iter_groups(epoch, stream, start):
            if grp.position >= stop:
                break
            idx = grp.global_indices()
            parts.append(idx[offset : stop - grp.position])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def worker_batches_done(batches: int, num_workers: int, worker_id: int) -> int:
    """Batches worker ``worker_id`` delivered after the DataLoader delivered ``batches``.

    ``torch.utils.data.DataLoader`` takes batch ``k`` from worker ``k % W`` while every worker has
    data (and ours all have the same number of batches per epoch), so the answer is
    ``batches // W + (worker_id < batches % W)`` with ``W = max(num_workers, 1)``.
    """
    w = max(num_workers, 1)
    return batches // w + (worker_id < batches % w)


@dataclass(frozen=True)
class StreamStart:
    """A stream resumes at ``position`` frames into ``epoch``."""

    epoch: int
    position: int


@dataclass(frozen=True)
class ResumePoint:
    """Where each worker role of a rank resumes, and the worker rotation of the first iteration.

    ``starts[role]`` is indexed by the role a worker played in the interrupted run. A new
    DataLoader iterator takes its first batch from worker 0, while the uninterrupted run would
    have continued with role ``batches % W``; so new worker ``w`` plays role
    ``(w + rotation) % W`` in the first iteration (later epochs use identity roles).
    """

    rotation: int
    starts: tuple[StreamStart, ...]


def resume_point(schedule: Schedule, batches: int, *, infinite: bool, rank: int = 0) -> ResumePoint:
    """Turn ``batches`` delivered by rank ``rank``'s DataLoader into per-role start positions.

    Assumes the DataLoader's default round-robin order, the schedule's batch size, and that the
    loader restarted epochs at every ``iter()`` (epoch mode) or streamed epochs back to back
    (``infinite``). Cost: O(workers), independent of ``batches``. With tail "keep" (epoch mode
    only) the first roles of a rank may yield one batch more than the others, which keeps the
    round-robin count exact.
    """
    _positive_int("batches", batches, 0)
    topo, b, q = schedule.topology, schedule.config.batch_size, schedule.frames_per_stream
    w = topo.workers_per_rank
    if infinite:
        if schedule.config.tail == "keep":
            raise ValueError(
                "tail='keep' (one pass, every frame once) has no infinite mode; found "
                "infinite=True. Fix: use tail='drop' or 'pad' for endless streaming."
            )
        starts = []
        for role in range(w):
            f = worker_batches_done(batches, topo.num_workers, role) * b
            starts.append(StreamStart(f // q, f % q))
        return ResumePoint(batches % w, tuple(starts))
    per_epoch = schedule.rank_batches(rank)
    if per_epoch == 0:  # tail "keep" with fewer frames than ranks: this rank has none
        if batches:
            raise ValueError(
                f"rank {rank} yields no batch per epoch (fewer frames than ranks with "
                f"tail='keep'); found {batches} batches delivered. Fix: resume from 0 batches."
            )
        return ResumePoint(0, tuple(StreamStart(0, 0) for _ in range(w)))
    epoch, s = divmod(batches, per_epoch)
    starts = tuple(
        StreamStart(
            epoch,
            min(
                worker_batches_done(s, topo.num_workers, role) * b,
                schedule.length(topo.stream_id(rank, role)),
            ),
        )
        for role in range(w)
    )
    return ResumePoint(s % w, starts)


def _spread(total: int, lows: Sequence[int], highs: Sequence[int]) -> list[int]:
    """Values in ``[lows[i], highs[i]]`` summing to ``total``, as equal as possible."""
    out = list(lows)
    left = total - sum(out)
    while left > 0:
        room = [i for i in range(len(out)) if out[i] < highs[i]]
        share = max(left // len(room), 1)
        for i in room:
            d = min(share, highs[i] - out[i], left)
            out[i] += d
            left -= d
            if not left:
                break
    return out


def _round_robin_shape(n: int, workers: int, batch_size: int) -> tuple[list[int], list[int]]:
    """Per role of one rank: (fewest, most) frames for ``n`` batches in all, roles ``< m``
    yielding ``K`` batches and the others ``K - 1`` (``n = (K-1)*workers + m``), every batch
    full except a role's last one: the DataLoader's round-robin then ends with a partial round
    of the first roles, so :func:`worker_batches_done` still holds."""
    k = -(-n // workers)
    m = n - (k - 1) * workers
    batches = [k if j < m else k - 1 for j in range(workers)]
    highs = [c * batch_size for c in batches]
    lows = [(c - 1) * batch_size + 1 if c else 0 for c in batches]
    return lows, highs


def stream_lengths(
    total: int, topology: Topology, batch_size: int, *, infinite: bool, drop_last: bool = False
) -> tuple[int, ...] | None:
    """Frames per stream (global stream order) that hold ``total`` frames; None if impossible.

    Used by tail "keep" (every frame of an epoch once) and by the elastic remainder epoch.
    Infinite mode: as equal as possible. Epoch mode: every rank yields the same number ``N``
    of batches, ``N = ceil(total / (world_size * batch_size))`` (floor with ``drop_last``);
    per rank, roles ``< m`` yield ``K`` batches and the others ``K - 1`` (``N = (K-1)*W + m``,
    ``1 <= m <= W`` workers per rank), every batch full except a stream's last one. With
    ``drop_last`` all batches are full and the sum may fall short of ``total`` (the dropped
    frames). None when no such split holds exactly ``total`` frames (it always exists with one
    rank; with several ranks, 2+ workers and batch size 2+ whenever ``total >= world_size``).
    """
    s, wp, ranks, b = (
        topology.num_streams,
        topology.workers_per_rank,
        topology.world_size,
        batch_size,
    )
    if infinite:
        return tuple(total // s + (g < total % s) for g in range(s))
    n = total // (ranks * b) if drop_last else -(-total // (ranks * b))
    if n == 0:
        return (0,) * s if (total == 0 or drop_last) else None
    lows, highs = _round_robin_shape(n, wp, b)
    if drop_last:
        return tuple(highs) * ranks
    lo, hi = sum(lows), sum(highs)
    if ranks * lo > total:
        return None
    per_rank = _spread(total, [lo] * ranks, [hi] * ranks)
    out: list[int] = []
    for frames in per_rank:
        out.extend(_spread(frames, lows, highs))
    return tuple(out)


def _ranks_apart(total: int, topology: Topology, batch_size: int) -> tuple[int, ...]:
    """Tail "keep" when :func:`stream_lengths` finds no equal batch count per rank: the ranks
    get ``total // world_size`` frames each (the first ``total % world_size`` one more), and
    each rank splits its frames in the round-robin shape (always possible on one rank)."""
    ranks, wp = topology.world_size, topology.workers_per_rank
    out: list[int] = []
    for r in range(ranks):
        frames = total // ranks + (r < total % ranks)
        if frames == 0:
            out.extend([0] * wp)
            continue
        lows, highs = _round_robin_shape(-(-frames // batch_size), wp, batch_size)
        out.extend(_spread(frames, lows, highs))
    return tuple(out)
