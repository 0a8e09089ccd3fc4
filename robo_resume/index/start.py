"""Resume start points: batches consumed -> each stream's ``(epoch, position)``. Pure.

What ``resume_step`` is turned into (:func:`resume_point`), and how a DataLoader hands out
batches round-robin over its workers (:func:`worker_batches_done`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .groups import Group
from .schedule import Schedule
from .topology import positive_int

__all__ = [
    "ResumeAt",
    "ResumePoint",
    "StartPoint",
    "StreamStart",
    "StreamView",
    "resume_at",
    "resume_point",
    "worker_batches_done",
]


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
    positive_int("batches", batches, 0)
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
    resumed = tuple(
        StreamStart(
            epoch,
            min(
                worker_batches_done(s, topo.num_workers, role) * b,
                schedule.length(topo.stream_id(rank, role)),
            ),
        )
        for role in range(w)
    )
    return ResumePoint(s % w, resumed)


class StartPoint(NamedTuple):
    """Where a rank's streams start in the first iteration of a (resumed) run.

    ``rotation``: new worker ``w`` plays role ``(w + rotation) % workers``; ``streams``: one
    entry per role, ``(epoch, position)`` for a dataset or ``(epoch, j, [(epoch, position)] per
    source)`` for a mix; ``batches``: batches this rank had consumed. A tuple, so
    ``rotation, streams, batches = ds.start_point(w)`` reads it too.
    """

    rotation: int
    streams: list
    batches: int


@dataclass(frozen=True)
class ResumeAt:
    """Where a stream continues: ``position`` frames into ``epoch``, which is frame ``frame``
    of episode ``episode`` in chunk ``chunk`` (all three None when the stream's epoch is done).
    """

    stream: int
    epoch: int
    position: int
    chunk: int | None
    frame: int | None
    episode: int | None

    def line(self) -> str:
        """The stream's ``resume:`` log line (what a resumed dataset logs, and what
        ``robo-resume plan`` prints, so that the two can be compared line for line)."""
        if self.chunk is None:
            return f"resume: stream={self.stream} epoch={self.epoch} chunk=- frame=- (epoch done)"
        return (
            f"resume: stream={self.stream} epoch={self.epoch} chunk={self.chunk} "
            f"frame={self.frame} (episode {self.episode}, position {self.position})"
        )


class StreamView(Protocol):
    """A stream-epoch's groups as :func:`resume_at` reads them: a
    :class:`~robo_resume.index.schedule.Schedule`, or ``Layout.view(epoch, stream)``."""

    @property
    def frames_per_stream(self) -> int:
        """Frames the stream yields in the epoch."""
        ...

    def iter_groups(self, epoch: int, stream: int, position: int) -> Iterator[tuple[Group, int]]:
        """The groups from the one holding ``position`` on, with the offset in the first."""
        ...


def resume_at(view: StreamView, stream: int, epoch: int, position: int) -> ResumeAt:
    """The :class:`ResumeAt` of ``stream`` standing at ``(epoch, position)``.

    ``view``: the stream-epoch's groups, an object with ``frames_per_stream`` and
    ``iter_groups(epoch, stream, position)`` (a :class:`~robo_resume.index.schedule.Schedule`,
    or ``Layout.view(epoch, stream)`` for a remainder epoch). Reads no data.
    """
    if position >= view.frames_per_stream:
        return ResumeAt(stream, epoch, position, None, None, None)
    group, offset = next(iter(view.iter_groups(epoch, stream, position)))
    seg, frame = group.frame(offset)
    return ResumeAt(stream, epoch, position, seg.chunk_id, frame, seg.episode_index)
