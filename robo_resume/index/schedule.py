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
4. consecutive segments form *groups* (:mod:`robo_resume.index.groups`): runs of
   ``interleave`` segments whose frames are emitted in a seeded interleaving that keeps every
   segment in frame order (the interleave order: sequential decoding), or, with a ``window``,
   runs of about ``window`` frames emitted in a seeded uniform permutation (the shuffle order,
   the default: a shuffle window of short chunks from anywhere in the epoch).

Positions are found with prefix sums and ``searchsorted``: the cost of locating position ``p``
is bounded by the number of segments of one stream-epoch plus one group, whatever ``p`` is.

Everything is columns (:class:`~robo_resume.index.plan.Plan`,
:class:`~robo_resume.index.segments.Segments`): the epoch's permutation and prefix sums are
computed once per epoch, vectorised, and a stream's segments are a slice of them (about
``chunks / streams`` rows); only a group's few segments become :class:`Segment` objects.
A stream's segments are first ``(chunk_id, lo, hi)`` rows (slices of the layout and one small
permutation), which locating a position needs; the plan's columns are gathered for a group's
rows only, or for all of them when :attr:`Schedule.segments` is asked (elastic resume).

The epoch layout is computed once per epoch and shared: :meth:`Schedule.share_epoch`, which
:class:`~robo_resume.stream.loader.BatchLoader` calls (through the dataset's or the mix's
``share_schedule``) in the main process before its workers start. Forked workers inherit it, spawned
ones receive it with the pickled schedule (8 bytes per chunk while the frames are below 2^31: 40 MB
at 10^6 episodes, 5x10^6 chunks, against a permutation per worker; a dataset's
spawn and forkserver workers map it from shared memory, see
:mod:`robo_resume.stream.shared_arrays`). Its arrays are read-only. A worker computes a layout
itself only for the epochs it reaches on its own (persistent workers, infinite mode) or under a
plain ``DataLoader(ds)``, which has no hook before its workers start. One layout is kept per
process, the newest: memory stays flat across epochs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .groups import (
    GROUP_ORDERS,
    INTERLEAVE_ORDERS,
    Group,
    frame_starts,
    group_bounds,
    group_order,
    make_group,
)
from .plan import Chunk, Plan
from .segments import NO_EPOCH, Segment, Segments
from .topology import Topology, positive_int, ranks_apart, stream_lengths

__all__ = [
    "GROUP_ORDERS",
    "INTERLEAVE_ORDERS",
    "Group",
    "Location",
    "Schedule",
    "ScheduleConfig",
    "Segment",
    "Segments",
    "Topology",
    "group_order",
    "stream_lengths",
]

_PERMUTE, _STREAM, _GROUP = 1, 2, 3  # purpose tags in the seed's spawn key


TAILS = ("drop", "pad", "keep")


@dataclass(frozen=True)
class ScheduleConfig:
    """Options of the schedule (see the module docstring).

    ``window`` 0: groups of ``interleave`` segments; else groups of about ``window`` frames
    (:func:`~robo_resume.index.groups.group_bounds`). ``interleave_order`` is one of
    :data:`~robo_resume.index.groups.GROUP_ORDERS` (the shuffle order: ``"shuffle"`` with a
    ``window``)."""

    seed: int = 0
    batch_size: int = 1
    drop_last: bool = False
    tail: str = "drop"
    interleave: int = 4
    shuffle: bool = True
    interleave_order: str = "random"
    window: int = 0

    def __post_init__(self) -> None:
        positive_int("seed", self.seed, 0)
        positive_int("batch_size", self.batch_size, 1)
        positive_int("interleave", self.interleave, 1)
        positive_int("window", self.window, 0)
        if self.interleave_order not in GROUP_ORDERS:
            raise ValueError(
                f"interleave_order must be one of {GROUP_ORDERS}; found {self.interleave_order!r}"
            )
        if self.tail not in TAILS:
            raise ValueError(f"tail must be one of {TAILS}; found {self.tail!r}")
        if self.tail == "keep" and self.drop_last:
            raise ValueError(
                "tail='keep' yields every frame exactly once, which drop_last=True contradicts "
                "(it drops each stream's short last batch); found tail='keep' with "
                "drop_last=True. Fix: use drop_last=False for evaluation, or tail='drop'/'pad'."
            )


class EpochCache:
    """``fn(epoch, stream)`` remembered for the newest epoch asked only, and for at most
    ``streams`` streams of it (the least recently used is forgotten first): flat memory across
    epochs, whatever the number of streams."""

    def __init__(self, fn, *, streams: int) -> None:
        self._fn = fn
        self._streams = streams
        self._epoch: int | None = None
        self._values: dict[int, object] = {}

    def __call__(self, epoch: int, stream: int):
        if epoch != self._epoch:
            self._epoch, self._values = epoch, {}
        if stream in self._values:
            value = self._values.pop(stream)
        else:
            value = self._fn(epoch, stream)
            while len(self._values) >= self._streams:
                self._values.pop(next(iter(self._values)))
        self._values[stream] = value
        return value

    @property
    def currsize(self) -> int:
        """Entries held."""
        return len(self._values)


@dataclass(frozen=True)
class Location:
    """Where position ``p`` of a stream-epoch lies: group, offset in it, frames done per segment
    of it (a place in the schedule; a *cursor* is what a stream delivered, see docs/concepts.md)."""

    group: int
    offset: int
    done: tuple[int, ...]
    """Frames of each segment of the group emitted before the position (with the shuffle
    order not necessarily its first ones: :meth:`Group.frame` names the position's frame)."""


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

    def __init__(self, chunks: Plan | Sequence[Chunk], config: ScheduleConfig, topology: Topology):
        self.chunks = Plan.from_chunks(chunks)
        if not len(self.chunks):
            raise ValueError("the plan has no chunks; expected at least one episode")
        self.config = config
        self.topology = topology
        self.total_frames = int(self.chunks.lengths.sum())
        s = topology.num_streams
        b = config.batch_size
        if config.tail == "keep":
            lengths = stream_lengths(self.total_frames, topology, b, infinite=False)
            if lengths is None:  # ranks cannot all get the same batch count: as near as can be
                lengths = ranks_apart(self.total_frames, topology, b)
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
        self._caches()

    def _caches(self) -> None:
        # Bounded, so memory stays flat across epochs: the epoch layout (a permutation and the
        # prefix sums, 8 bytes per chunk, 16 past 2^31 frames) of the newest epoch only; of that
        # epoch only, a few streams' segments (a worker reads one; robo-resume plan and the
        # elastic leftover visit the streams one after another).
        self._rows = EpochCache(self._rows_uncached, streams=4)
        self.segments = EpochCache(self._segments, streams=4)
        self._group_starts = EpochCache(self._group_starts_uncached, streams=4)
        self._layout: tuple[int, tuple[np.ndarray, np.ndarray]] | None = None

    def __getstate__(self):
        state = self.__dict__.copy()
        for k in ("_rows", "segments", "_group_starts"):
            state.pop(k)
        return state  # with the newest epoch layout, if any (see share_epoch)

    def __setstate__(self, state):
        layout = state.pop("_layout", None)
        self.__dict__.update(state)
        self._caches()
        self._layout = layout

    def twin(self) -> Schedule:
        """A schedule equal to this one, sharing its arrays, with caches of its own: for
        another thread walking the same stream (the caches are not thread-safe, and keep one
        epoch at a time)."""
        new = object.__new__(type(self))
        new.__setstate__(self.__getstate__())
        return new

    def share_epoch(self, epoch: int) -> None:
        """Compute epoch ``epoch``'s layout (its permutation and prefix sums) now, in this
        process, so that the processes made from it do not: what a DataLoader's main process
        calls before its workers start. Forked workers inherit it (pages shared, never
        written); a pickled schedule (spawn, forkserver workers) carries it. Like every
        layout, it is kept until another epoch's is computed (one at a time: flat memory).
        """
        self._check(epoch, 0)
        self._epoch_layout(epoch)

    def _epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The newest epoch's layout, computed once (see :meth:`_epoch_layout_uncached`)."""
        if self._layout is None or self._layout[0] != epoch:
            self._layout = None  # the old one goes first: one layout in memory at a time
            self._layout = (epoch, self._epoch_layout_uncached(epoch))
        return self._layout[1]

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
        offsets = np.zeros(n + 1, dtype=np.int64)
        plan = self.chunks  # one gather (of the plan's own dtype), not two
        np.cumsum((plan.stop - plan.start)[perm], out=offsets[1:])
        if n < 2**31:  # half the memory; the values are the same
            perm = perm.astype(np.int32)
        if self.total_frames < 2**31:  # 20 MB less at 10^6 episodes (3x10^8 frames); the
            offsets = offsets.astype(np.int32)  # positions asked are below it (Python ints)
        for a in (perm, offsets):  # shared by the workers (pages or shared memory): never written
            a.flags.writeable = False
        return perm, offsets

    def _rows_uncached(self, epoch: int, stream: int) -> tuple[np.ndarray, ...]:
        """The stream's segments for an epoch as ``(chunk_id, lo, hi)``, after the per-stream
        shuffle: frames ``[lo, hi)`` of the chunk (relative to its start). Contiguous slices of
        the epoch layout and one small permutation: no gather from the plan's columns, which
        :meth:`_segments` does (for all rows) and :meth:`group` (for a group's rows only)."""
        self._check(epoch, stream)
        perm, offsets = self._epoch_layout(epoch)
        t, n = self.total_frames, len(perm)
        pieces = []
        a, b = int(self._stream_starts[stream]), int(self._stream_starts[stream + 1])
        while a < b:  # positions past T wrap around (tail="pad")
            x = a % t
            take = min(b - a, t - x)
            pieces.append((x, x + take))
            a += take
        rows, los, his = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        typed = offsets.dtype.type  # else searchsorted copies int32 offsets
        for x, y in pieces:  # rows k with offsets[k] < y and offsets[k + 1] > x
            k0 = int(np.searchsorted(offsets, typed(x), side="right")) - 1
            k1 = int(np.searchsorted(offsets[:n], typed(y), side="left"))
            at = offsets[k0:k1]
            rows.append(np.arange(k0, k1))
            los.append(np.maximum(x, at) - at)
            his.append(np.minimum(y, offsets[k0 + 1 : k1 + 1]) - at)
        row, lo, hi = (np.concatenate(c) for c in (rows, los, his))
        if self.config.shuffle:
            order = self._rng(epoch, _STREAM, stream).permutation(len(row))
            row, lo, hi = row[order], lo[order], hi[order]
        return perm[row].astype(np.int64), lo, hi

    def _take(self, cid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Segments:
        plan = self.chunks
        first = plan.start[cid].astype(np.int64)  # the plan's columns may be int32
        return Segments._raw(
            [
                cid,
                plan.episode_index[cid].astype(np.int64),
                first + lo,
                first + hi,
                plan.dataset_from_index[cid] + lo,
                np.full(len(cid), NO_EPOCH, dtype=np.int64),
            ]
        )

    def _segments(self, epoch: int, stream: int) -> Segments:
        """The stream's segments for an epoch, after the per-stream shuffle."""
        return self._take(*self._rows(epoch, stream))

    def _group_starts_uncached(self, epoch: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
        """``(segment bounds, stream positions)`` where each group of a stream-epoch starts."""
        _, lo, hi = self._rows(epoch, stream)
        lengths = hi - lo
        bounds = group_bounds(lengths, interleave=self.config.interleave, window=self.config.window)
        return bounds, frame_starts(lengths, bounds)

    def length(self, stream: int) -> int:
        """Frames stream ``stream`` yields per epoch (``frames_per_stream`` unless tail "keep")."""
        return self.stream_frames[stream]

    def rank_batches(self, rank: int) -> int:
        """Batches rank ``rank``'s DataLoader yields per epoch."""
        return self._rank_batches[rank]

    def num_groups(self, epoch: int, stream: int) -> int:
        """Number of groups in a stream-epoch."""
        return len(self._group_starts(epoch, stream)[0]) - 1

    def group(self, epoch: int, stream: int, index: int) -> Group:
        """Group ``index`` of a stream-epoch, with its seeded order of frames."""
        bounds, starts = self._group_starts(epoch, stream)
        if not 0 <= index < len(bounds) - 1:
            raise IndexError(f"group {index} out of range ({len(bounds) - 1})")
        a, b = int(bounds[index]), int(bounds[index + 1])
        members = self._take(*(c[a:b] for c in self._rows(epoch, stream))).objects(0, b - a)
        rng = self._rng(epoch, _GROUP, stream, index) if self.config.shuffle else None
        return make_group(members, self.config.interleave_order, rng, int(starts[index]))

    def group_segments(self, epoch: int, stream: int, index: int) -> tuple[int, int]:
        """Rows ``[a, b)`` of :meth:`segments` that group ``index`` holds."""
        bounds = self._group_starts(epoch, stream)[0]
        return int(bounds[index]), int(bounds[index + 1])

    def locate(self, epoch: int, stream: int, position: int) -> Location:
        """Where position ``0 <= position < length(stream)`` of a stream-epoch is."""
        self._check(epoch, stream)
        if not 0 <= position < self.length(stream):
            raise ValueError(f"position must be in [0, {self.length(stream)}); found {position}")
        starts = self._group_starts(epoch, stream)[1]
        g = int(np.searchsorted(starts, position, side="right")) - 1
        grp = self.group(epoch, stream, g)
        offset = position - int(starts[g])
        done = np.bincount(grp.order[:offset], minlength=len(grp.segments))
        return Location(g, offset, tuple(int(d) for d in done))

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
