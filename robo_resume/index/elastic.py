"""Elastic resume: re-partition what an interrupted epoch has left over a new topology. Pure.

A run can resume with another number of DataLoader workers, ranks or another batch size than
the run that saved the state. Nothing is read or decoded; everything is arithmetic over the
schedule (:mod:`robo_resume.index.schedule`):

1. **Leftover.** The saved state holds the cursor ``(epoch, position)`` of every stream of the
   interrupted run (all ranks, after the tracker's gather). Let ``X`` be the newest epoch a
   cursor stands in. What a stream has left is a pure function of its cursor: the frames of
   its stream-epoch from ``position`` on (in a partially emitted group, per segment the frames
   not yet emitted, :meth:`~robo_resume.index.groups.Group.leftover`, then every later group),
   and, when the stream stands before ``X`` (infinite mode, or a stream that finished epoch
   ``X - 1`` before its first batch of ``X``), all of its stream-epochs up to ``X``. The
   leftovers of all old streams, in global stream order, form one sequence of segments
   ``(episode, start, stop)``: every frame the interrupted epoch(s) have not delivered, once.
2. **Remainder epoch.** That sequence is cut into contiguous pieces, one per new stream
   (global stream id order, see :func:`stream_lengths` for the lengths), and each piece is
   shuffled and interleaved like a normal stream (seeded by ``(seed, X, level, stream)``). The
   new run's first iteration is this *remainder epoch*, labelled ``X``; its cursors count
   frames of the remainder stream. Epochs ``X + 1, ...`` are normal epochs of the new topology
   and batch size.
3. **Resumable.** A remainder epoch can itself be interrupted and resumed, with the same or yet
   another topology: the state carries the chain of :class:`Level` s it came from (topology,
   batch size and cursors of each earlier run), so every remainder plan is recomputed from
   the state alone. The chain is dropped as soon as no stream stands in a remainder epoch
   (epoch mode) and is never longer than the number of topology changes inside one epoch.

Equal batch counts (epoch mode): every DDP rank must yield the same number of batches, and
a batch may be short only at the end of a stream. :func:`stream_lengths` gives every rank the
same number ``N`` of batches: in each rank the first ``m`` worker roles yield ``K`` batches and
the others ``K - 1`` (the DataLoader's round-robin then ends with a partial round of the first
roles, so the usual per-batch resume arithmetic still holds). Each stream ends with at most one
short batch. This is exact whenever ``N`` batches of at most ``batch_size`` frames can hold the
leftover with at least one frame in each stream's last batch; it always can with one rank, and
with several ranks, 2+ workers and batch size 2+ whenever at least one frame per rank is left.
Otherwise (e.g. fewer leftover frames than ranks, or one worker per rank with an unlucky
remainder) the resume is refused with the fix: finish the epoch with the recorded topology.
With ``drop_last=True`` every batch is full: the remainder holds ``N`` full batches per rank and
the fewer than ``world_size * batch_size`` frames that do not fill a batch on every rank are
dropped (as ``drop_last`` drops a short last batch), with a WARNING naming how many. In
infinite mode batches run on into the next epoch, so the pieces are simply as equal as
possible.

The leftover, its re-partition, the remainder epoch's layout and the checks that the saved
cursors are a possible DataLoader prefix all rest on the same definitions (:class:`Level`,
:class:`Remainder`, :class:`Layout`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ResumeStateError, describe
from .groups import Group, frame_starts, group_bounds, make_group
from .plan import Chunk, Plan
from .schedule import (
    Schedule,
    ScheduleConfig,
    Segment,
    Topology,
    stream_lengths,
)
from .segments import NO_EPOCH, Segments

__all__ = [
    "Layout",
    "Level",
    "Remainder",
    "check_positions",
    "leftover",
    "replan",
    "split_segments",
    "stream_lengths",
]

_REMAINDER, _REMAINDER_GROUP = 4, 5  # purpose tags, after the schedule's 1..3


@dataclass(frozen=True)
class Level:
    """One run of a chain: its topology, batch size, cursors, and remainder epoch label.

    ``cursors`` are ``(rank, role, epoch, position)`` of every stream; ``epoch`` is the label
    of the level's remainder epoch (None: the level has normal epochs only; the first level
    of a chain never has one).
    """

    world_size: int
    num_workers: int
    batch_size: int
    cursors: tuple[tuple[int, int, int, int], ...] = ()
    epoch: int | None = None

    @property
    def topology(self) -> Topology:
        """The level's :class:`Topology`."""
        return Topology(self.world_size, self.num_workers)


class Remainder:
    """The remainder epoch ``epoch`` of a topology: per stream, the segments it emits."""

    def __init__(
        self,
        epoch: int,
        streams: Sequence[Segments | Sequence[Segment]],
        config: ScheduleConfig,
        level: int,
    ) -> None:
        self.epoch = epoch
        self.config = config
        self.level = level
        self._streams = tuple(Segments.of(s) for s in streams)
        self.lengths = tuple(s.frames() for s in self._streams)
        self._caches()

    def _caches(self) -> None:
        self.segments = functools.lru_cache(maxsize=16)(self._segments)
        self._starts = functools.lru_cache(maxsize=16)(self._starts_uncached)

    def __getstate__(self):
        state = self.__dict__.copy()
        for k in ("segments", "_starts"):
            state.pop(k)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._caches()

    def twin(self) -> Remainder:
        """An equal remainder sharing its arrays, with caches of its own (another thread's)."""
        new = object.__new__(type(self))
        new.__setstate__(self.__getstate__())
        return new

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence(entropy=self.config.seed, spawn_key=(self.epoch, *key))
        )

    def _segments(self, stream: int) -> Segments:
        segs = self._streams[stream]
        if self.config.shuffle and len(segs) > 1:
            segs = segs[self._rng(_REMAINDER, self.level, stream).permutation(len(segs))]
        return segs

    def _starts_uncached(self, stream: int) -> tuple[np.ndarray, np.ndarray]:
        """``(segment bounds, stream positions)`` where each group of the stream starts."""
        lengths = self.segments(stream).lengths
        bounds = group_bounds(lengths, interleave=self.config.interleave, window=self.config.window)
        return bounds, frame_starts(lengths, bounds)

    def group(self, stream: int, index: int) -> Group:
        """Group ``index`` of the stream, with its seeded order of frames."""
        bounds, starts = self._starts(stream)
        a, b = int(bounds[index]), int(bounds[index + 1])
        members = self.segments(stream).objects(a, b)
        rng = (
            self._rng(_REMAINDER_GROUP, self.level, stream, index) if self.config.shuffle else None
        )
        return make_group(members, self.config.interleave_order, rng, int(starts[index]))

    def group_segments(self, stream: int, index: int) -> tuple[int, int]:
        """Rows ``[a, b)`` of :meth:`segments` that group ``index`` holds."""
        bounds = self._starts(stream)[0]
        return int(bounds[index]), int(bounds[index + 1])

    def iter_groups(self, stream: int, position: int) -> Iterator[tuple[Group, int]]:
        """Groups from the one holding ``position`` on; the int is the offset in the first."""
        if position >= self.lengths[stream]:
            return
        starts = self._starts(stream)[1]
        g = int(np.searchsorted(starts, position, side="right")) - 1
        yield self.group(stream, g), position - int(starts[g])
        for k in range(g + 1, len(starts) - 1):
            yield self.group(stream, k), 0


class Layout:
    """What each stream of one topology emits: normal epochs, plus an optional remainder epoch.

    Duck-compatible with the parts of :class:`~robo_resume.index.schedule.Schedule` the dataset
    uses per epoch (:meth:`length`, :meth:`iter_groups`).
    """

    def __init__(self, schedule: Schedule, remainder: Remainder | None = None) -> None:
        self.schedule = schedule
        self.remainder = remainder

    def twin(self) -> Layout:
        """An equal layout whose schedule and remainder have caches of their own: for another
        thread walking the same streams (see :meth:`Schedule.twin`)."""
        rem = None if self.remainder is None else self.remainder.twin()
        return Layout(self.schedule.twin(), rem)

    @property
    def epoch(self) -> int | None:
        """Label of the remainder epoch (None: normal epochs only)."""
        return None if self.remainder is None else self.remainder.epoch

    def length(self, epoch: int, stream: int) -> int:
        """Frames the stream emits in ``epoch``."""
        if self.remainder is not None and epoch == self.remainder.epoch:
            return self.remainder.lengths[stream]
        return self.schedule.length(stream)

    def iter_groups(self, epoch: int, stream: int, position: int) -> Iterator[tuple[Group, int]]:
        """The stream's groups of ``epoch`` from ``position`` on (nothing past the end)."""
        if self.remainder is not None and epoch == self.remainder.epoch:
            return self.remainder.iter_groups(stream, position)
        return self.schedule.iter_groups(epoch, stream, position)

    def frames_done(self, epoch: int, stream: int, position: int) -> int:
        """Frames the stream emitted from the layout's start to ``(epoch, position)``.

        The start is epoch 0 without a remainder, else the start of the remainder epoch (the
        new run began there); used to check cursors against the DataLoader's round-robin.
        """
        q = self.schedule.length(stream)
        if self.remainder is None:
            return epoch * q + position
        x = self.remainder.epoch
        if epoch == x:
            return position
        return self.remainder.lengths[stream] + (epoch - x - 1) * q + position

    def rest(self, epoch: int, stream: int, position: int, through: int) -> Segments:
        """Segments the stream has left from ``(epoch, position)`` to the end of ``through``."""
        return Segments.concat(
            [
                self._rest_of(e, stream, position if e == epoch else 0)
                for e in range(epoch, through + 1)
            ]
        )

    def _rest_of(self, epoch: int, stream: int, position: int) -> Segments:
        """What a stream-epoch has left from ``position``: in the group holding it, per segment
        the runs of frames not yet emitted (:meth:`Group.leftover`); then every later segment.
        Each segment carries the epoch it belongs to (its own label in a remainder)."""
        if position >= self.length(epoch, stream):
            return Segments.empty()
        if self.remainder is not None and epoch == self.remainder.epoch:
            rem = self.remainder
            segs, (bounds, starts) = rem.segments(stream), rem._starts(stream)
            group = functools.partial(rem.group, stream)
        else:
            sched = self.schedule
            segs = sched.segments(epoch, stream)
            bounds, starts = sched._group_starts(epoch, stream)
            group = functools.partial(sched.group, epoch, stream)
        g = int(np.searchsorted(starts, position, side="right")) - 1
        grp = group(g)
        rows = Segments.concat(
            [grp.leftover(position - int(starts[g])), segs[int(bounds[g + 1]) :]]
        )
        return rows.replace(epoch=np.where(rows.epoch == NO_EPOCH, epoch, rows.epoch))

    def view(self, epoch: int, stream: int) -> _View:
        """An object with ``frames_per_stream`` and ``iter_groups`` for one stream-epoch."""
        return _View(self, epoch, stream)


@dataclass(frozen=True)
class _View:
    layout: Layout
    epoch: int
    stream: int

    @property
    def frames_per_stream(self) -> int:
        return self.layout.length(self.epoch, self.stream)

    def iter_groups(self, epoch: int, stream: int, position: int) -> Iterator[tuple[Group, int]]:
        return self.layout.iter_groups(epoch, stream, position)


def split_segments(
    segments: Segments | Sequence[Segment], lengths: Sequence[int]
) -> list[Segments]:
    """Cut the sequence into consecutive pieces of ``lengths`` frames (the rest is dropped)."""
    segs = Segments.of(segments)
    ends = np.cumsum(segs.lengths)
    firsts = ends - segs.lengths  # frame offset of each segment in the sequence
    bounds = np.concatenate(([0], np.cumsum(np.asarray(lengths, dtype=np.int64))))
    if bounds[-1] > (ends[-1] if len(ends) else 0):
        raise ValueError(f"pieces of {int(bounds[-1])} frames from {int(ends[-1])} frames")
    lo_rows = np.searchsorted(ends, bounds[:-1], side="right")
    hi_rows = np.searchsorted(firsts, bounds[1:], side="left")
    out: list[Segments] = []
    for i, (r0, r1) in enumerate(zip(lo_rows.tolist(), hi_rows.tolist(), strict=True)):
        if bounds[i] == bounds[i + 1]:
            out.append(Segments.empty())
            continue
        piece = segs[r0:r1]
        at = firsts[r0:r1]
        cut_lo = np.maximum(bounds[i] - at, 0)
        cut_hi = np.minimum(bounds[i + 1] - at, piece.lengths)
        out.append(
            piece.replace(
                start=piece.start + cut_lo,
                stop=piece.start + cut_hi,
                dataset_from_index=piece.dataset_from_index + cut_lo,
            )
        )
    return out


def _config(config: ScheduleConfig, batch_size: int) -> ScheduleConfig:
    return dataclasses.replace(config, batch_size=batch_size)


def _check_cursors(level: Level) -> dict[int, tuple[int, int]]:
    topo = level.topology
    have = {topo.stream_id(r, role): (e, p) for r, role, e, p in level.cursors}
    missing = sorted({g // topo.workers_per_rank for g in range(topo.num_streams) if g not in have})
    if missing:
        raise ResumeStateError(
            describe(
                "Cannot re-partition the interrupted epoch: the resume state lacks cursors of "
                "some ranks",
                expected=f"cursors of all {topo.num_streams} streams ({level.world_size} ranks x "
                f"{topo.workers_per_rank} workers)",
                found=f"none for ranks {missing}",
                fix="save the state with CursorTracker.state_dict() on every rank under DDP (it "
                "gathers all ranks), or merge the ranks' states with ResumeState.merged()",
            )
        )
    return have


def check_positions(
    layout: Layout, cursors: Mapping[int, tuple[int, int]], topology: Topology
) -> None:
    """Refuse a cursor past the end of its stream-epoch (``position > length``): it would make
    the rest of the interrupted epoch vanish silently. ``cursors``: stream id -> (epoch, position).
    """
    wp = topology.workers_per_rank
    for g, (e, p) in sorted(cursors.items()):
        n = layout.length(e, g)
        if p > n:
            raise ResumeStateError(
                describe(
                    "A resume state's cursor stands past the end of its stream",
                    expected=f"position <= {n} (the frames rank {g // wp}, role {g % wp} emits "
                    f"in epoch {e} with this plan)",
                    found=f"position {p}",
                    fix="pass the unmodified state of a run over the same dataset, episodes, "
                    "chunk_frames and batch size (CursorTracker.state_dict())",
                )
            )


def build_layout(
    chunks: Plan | Sequence[Chunk],
    config: ScheduleConfig,
    levels: Sequence[Level],
    *,
    infinite: bool,
) -> Layout:
    """The :class:`Layout` of ``levels[-1]`` (its remainder recomputed from the earlier levels)."""
    top = levels[-1]
    if top.epoch is None or len(levels) == 1:
        return Layout(Schedule(chunks, _config(config, top.batch_size), top.topology))
    below = build_layout(chunks, config, levels[:-1], infinite=infinite)
    have = _check_cursors(levels[-2])
    check_positions(below, have, levels[-2].topology)
    segs = leftover(below, have, top.epoch)
    return _remainder_layout(chunks, config, segs, levels[-2], top, len(levels) - 1, infinite)


def _remainder_layout(
    chunks: Plan | Sequence[Chunk],
    config: ScheduleConfig,
    segs: Segments,
    old: Level,
    top: Level,
    level: int,
    infinite: bool,
) -> Layout:
    assert top.epoch is not None
    total = segs.frames()
    lengths = stream_lengths(
        total, top.topology, top.batch_size, infinite=infinite, drop_last=config.drop_last
    )
    if lengths is None:
        raise _infeasible(total, old, top)
    sched = Schedule(chunks, _config(config, top.batch_size), top.topology)
    return Layout(sched, Remainder(top.epoch, split_segments(segs, lengths), config, level))


def _infeasible(total: int, old: Level, new: Level) -> ResumeStateError:
    return ResumeStateError(
        describe(
            f"Cannot re-partition the {total} frames left in epoch {new.epoch} exactly over "
            f"{new.world_size} ranks with equal batch counts",
            expected=f"a split of {total} frames into the same number of batches of at most "
            f"{new.batch_size} on each of {new.world_size} ranks x "
            f"{new.topology.workers_per_rank} workers (a short batch only at a stream's end)",
            found="no such split (too few frames left for this many ranks, or one worker per "
            "rank with batch_size frames that do not divide evenly)",
            fix=f"resume with the recorded topology (world_size={old.world_size}, "
            f"num_workers={old.num_workers}, batch_size={old.batch_size}) until epoch "
            f"{new.epoch} ends, save the state there and change the topology then; or use 2+ "
            "DataLoader workers and batch_size 2+ per rank",
        )
    )


@dataclass(frozen=True)
class Replan:
    """Where a run with a new topology starts.

    Attributes:
        layout: the new topology's :class:`Layout` (with the remainder epoch, if any).
        epoch: the epoch every new stream starts in, at position 0 (the remainder label, or a
            normal epoch when nothing or everything of the interrupted epoch is left).
        origin: the chain the new run's states carry (empty when there is no remainder).
        total: frames in the remainder epoch's leftover; dropped: of those, not emitted
            (``drop_last``).
    """

    layout: Layout
    epoch: int
    origin: tuple[Level, ...]
    total: int = 0
    dropped: int = 0


def replan(
    chunks: Plan | Sequence[Chunk],
    config: ScheduleConfig,
    chain: Sequence[Level],
    new: Level,
    *,
    infinite: bool,
) -> Replan:
    """Re-partition what ``chain[-1]`` (the interrupted run) has left over ``new``'s topology.

    ``chain[:-1]`` is the interrupted run's own origin (empty unless it was itself elastic).
    ``new.cursors`` and ``new.epoch`` are ignored. Raises
    :class:`~robo_resume.errors.ResumeStateError` when cursors are missing or the leftover
    cannot be split exactly (see the module docstring).
    """
    old = chain[-1]
    try:
        below = build_layout(chunks, config, chain, infinite=infinite)
    except ValueError as exc:
        if isinstance(exc, ResumeStateError):
            raise
        raise ResumeStateError(
            describe(
                "The resume state's topology cannot have run on this plan",
                expected=f"a run whose schedule exists for this dataset ({exc})",
                found=f"world_size={old.world_size}, num_workers={old.num_workers}, "
                f"batch_size={old.batch_size}",
                fix="pass the unmodified state of a run over the same dataset, episodes and "
                "chunk_frames (CursorTracker.state_dict())",
            )
        ) from exc
    have = _check_cursors(old)
    check_positions(below, have, old.topology)
    x = max(e for e, _ in have.values())
    cursors = {g: have[g] for g in range(old.topology.num_streams)}
    # Trim the chain: keep the old run's own origin only while a stream is in its remainder.
    if old.epoch is not None and all(
        e > old.epoch or p >= below.length(e, g) for g, (e, p) in cursors.items()
    ):
        cursors = {g: ((e + 1, 0) if e == old.epoch else (e, p)) for g, (e, p) in cursors.items()}
        wp = old.topology.workers_per_rank
        trimmed = Level(
            old.world_size,
            old.num_workers,
            old.batch_size,
            tuple((g // wp, g % wp, e, p) for g, (e, p) in sorted(cursors.items())),
        )
        return replan(chunks, config, [trimmed], new, infinite=infinite)
    sched = Schedule(chunks, _config(config, new.batch_size), new.topology)
    if all(c == (x, 0) for c in cursors.values()):
        return Replan(Layout(sched), x, ())
    if all(p >= below.length(e, g) for g, (e, p) in cursors.items() if e == x) and all(
        e == x for e, _ in cursors.values()
    ):
        return Replan(Layout(sched), x + 1, ())
    target = Level(new.world_size, new.num_workers, new.batch_size, epoch=x)
    segs = leftover(below, cursors, x)
    layout = _remainder_layout(chunks, config, segs, old, target, len(chain), infinite)
    assert layout.remainder is not None
    total = segs.frames()
    return Replan(layout, x, tuple(chain), total, total - sum(layout.remainder.lengths))


def leftover(layout: Layout, cursors: dict[int, tuple[int, int]], through: int) -> Segments:
    """Every segment the streams of ``layout`` have left up to the end of epoch ``through``,
    stream by stream (global stream order), each stream's epochs in order.

    Computed epoch by epoch (the schedule keeps one epoch's layout at a time), then put in
    stream order.
    """
    parts: dict[tuple[int, int], Segments] = {}
    first = min((e for e, _ in cursors.values()), default=through)
    for e in range(first, through + 1):
        for g in sorted(cursors):
            ce, p = cursors[g]
            if ce <= e:
                parts[g, e] = layout._rest_of(e, g, p if e == ce else 0)
    return Segments.concat(
        [parts[g, e] for g in sorted(cursors) for e in range(cursors[g][0], through + 1)]
    )
