"""One group of a stream read block by block: its chunks' frames decoded into the batch, their
reads on the decoding threads (one block ahead in the main process), failures raised or
skipped at the frames where they happen."""

from __future__ import annotations

import itertools
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..index.schedule import Group
from ..items.builder import ItemBuilder
from .blocks import BatchTarget, Block, discard, skip_record, streaming_error
from .read_ahead import take_ahead
from .tuning import REMOTE_ERRORS, SKIP_ERRORS


class _AfterFailure(Exception):
    """A segment's read not made because an earlier read of the segment failed."""


class _Lanes:
    """The reads of a group's segments in order, one at a time per segment, across blocks.

    With two blocks in flight (``BatchTarget.depth`` 2) a segment's next read may be picked
    by one decoding thread while its previous read still runs on another; :meth:`run` makes
    it wait for its turn (the order :meth:`ticket` s were given in, on the stream's thread).
    Once a read of a segment failed, its later reads do not run (they raise
    :class:`_AfterFailure`): the caller skips or raises on the first failure, and a failed
    reader is closed while no read of it runs. Deadlock-free: a read waits only for reads
    handed to the thread pool before it (whose threads took them in that order).
    """

    def __init__(self, segments: int) -> None:
        self._cv = threading.Condition()
        self._given = [0] * segments
        self._done = [0] * segments
        self.failed = [False] * segments  # set under the lock; read without it
        self._waiting = 0

    def ticket(self, j: int) -> int:
        """The next read's turn on segment ``j`` (the stream's thread, in planning order)."""
        t = self._given[j]
        self._given[j] += 1
        return t

    def fail(self, j: int) -> None:
        """Segment ``j`` failed outside a read (its reader did not open)."""
        with self._cv:
            self.failed[j] = True

    def run(self, j: int, turn: int, fn: Callable[[], Any]) -> Any:
        """``fn()`` when the segment's earlier reads have ended (and none failed)."""
        cv = self._cv
        if self._done[j] != turn:
            with cv:
                self._waiting += 1
                while self._done[j] != turn:
                    cv.wait()
                self._waiting -= 1
        try:
            if self.failed[j]:
                raise _AfterFailure(f"segment {j}: an earlier read failed")
            return fn()
        except BaseException:
            with cv:
                self.failed[j] = True
            raise
        finally:
            with cv:
                self._done[j] += 1
                if self._waiting:
                    cv.notify_all()


class Overlap:
    """Whether a ``num_workers=0`` stream reads its next block in the background now.

    With one decoding thread (frames below ``THREADS_FROM_PIXELS``) the background read pays
    only while the consumer works between batches (a training step): in a loop that takes
    batches and does little else the two threads mostly hand the GIL to each other, and
    reading on the calling thread is faster. ``adaptive``: every :data:`WINDOW` batches
    :meth:`batch` decides from the consumer's median share of the time between batches
    (background from :data:`SHARE` on; the median, so that one pause, a checkpoint
    say, does not decide); otherwise the stream always reads ahead. The batches are the same
    either way, only when their frames are decoded changes.
    """

    WINDOW = 8
    SHARE = 0.2

    def __init__(self, adaptive: bool) -> None:
        self.on = True  # read the next block in the background (the first window decides)
        self.adaptive = adaptive
        self._shares: list[float] = []

    def batch(self, consumer_s: float, period_s: float) -> None:
        """One batch: ``consumer_s`` seconds spent by the consumer, of ``period_s`` since the
        previous batch."""
        if not self.adaptive:
            return
        self._shares.append(consumer_s / period_s if period_s > 0 else 0.0)
        if len(self._shares) == self.WINDOW:
            self.on = sorted(self._shares)[self.WINDOW // 2] >= self.SHARE
            self._shares.clear()


class GroupRead:
    """The blocks of one group's frames from ``offset`` on (numpy parts, emission order).

    Iterating yields :class:`~robo_resume.stream.blocks.Block` s; each holds at most
    ``block_frames`` frames per open segment and never crosses the batch ``target`` (a
    :class:`~robo_resume.stream.blocks.BatchTarget`) fills: camera frames are decoded into
    its buffers at the block's positions in the batch and left out of the parts. ``items`` is
    the dataset's :class:`~robo_resume.items.builder.ItemBuilder`; ``head`` the cursor's
    ``(rank, role, num_workers, epoch)``; ``bad[j]`` the first frame of segment ``j`` not to
    read (its stop, or where the resume state recorded a skip); ``ahead`` the frames a read
    decodes ahead (:func:`~robo_resume.stream.read_ahead.frames_ahead`).

    A read that fails with one of :data:`SKIP_ERRORS` raises the same error type with the
    streamed frames added (``skip`` False, ``on_error="raise"``), or skips the segment from
    that read on: its remaining frames keep their positions and cursor rows but are neither
    read nor yielded, and the block carries a skip record. Segments the resume state recorded
    as skipped are skipped from the recorded frame on without a retry. Assumes a broken file
    fails at the same read when read again from an earlier frame (block cuts after a resume
    position are the uninterrupted run's).

    With ``target.depth`` 2 (the main process), the next block is planned and its reads queued
    on the decoding threads before a block's reads are waited for (while ``target.overlap``
    says so: with one decoding thread, only while the consumer works between batches), so the
    threads never run dry between blocks and decode while the consumer uses the block (a
    block planned otherwise reads on this thread); a segment's reads still
    run in order, one at a time (:class:`_Lanes`), and each block's
    outcome is handled in order when it is asked for. Abandoning the iterator waits for the
    reads in flight, then closes the readers.
    """

    _finalizing = staticmethod(sys.is_finalizing)  # kept by the class, not the module

    def __init__(
        self,
        items: ItemBuilder,
        group: Group,
        offset: int,
        *,
        head: tuple[int, int, int, int],
        target: BatchTarget,
        skip: bool,
        bad: list[int],
        ahead: int,
        block_frames: int,
    ) -> None:
        self.items, self.group, self.offset, self.target = items, group, offset, target
        self.segs = segs = group.segments
        k = len(segs)
        self.nxt = [s.start for s in segs]  # each segment's next frame to plan
        for j, c in enumerate(np.bincount(group.order[:offset], minlength=k)):
            self.nxt[j] += int(c)
        self.skip, self.bad, self.ahead = skip, bad, ahead
        self.readers: list[Any] = [None] * k
        self.held: list[tuple[int, dict[str, np.ndarray]] | None] = [None] * k  # read ahead
        self.position = group.position + offset
        self.most = block_frames * k
        self.head = np.array(head, dtype=np.int64)
        self.early = target.depth > 1  # may read a block early (target.overlap: now?)
        self.overlap = target.overlap
        self.lanes = _Lanes(k) if self.early else None

    def __iter__(self) -> Iterator[Block]:
        order = self.group.order
        flight: deque = deque()  # planned blocks whose reads may still run
        try:
            i = self.offset
            while True:
                ahead = self.early and (self.overlap is None or self.overlap.on)
                while i < len(order) and len(flight) < (2 if ahead else 1):
                    flight.append(self._plan(i, ahead))
                    i += flight[-1][0]
                if not flight:
                    break
                n, jobs, opened, todo, wait = flight.popleft()
                yield self._finish(n, jobs, opened, todo, wait())
        finally:  # no module globals here: it may run at interpreter exit, after their teardown
            # Reads in flight end before their readers close. At interpreter exit the decoding
            # threads have already been joined (nothing is in flight), and a Future must not
            # be waited for: concurrent.futures' own globals may be gone, and result() then
            # waits forever.
            for planned in () if self._finalizing() else flight:
                try:
                    planned[-1]()
                except Exception:  # the consumer left: nothing reads the outcome
                    pass
            for r in self.readers:
                if r is not None:
                    r.close()

    def _read(self, job) -> dict[str, np.ndarray]:
        """One segment's frames of a block (on a decoding thread)."""
        j, _, frames, dest, _ = job
        reader, held = self.readers[j], self.held[j]
        if held is None and len(frames) >= self.ahead:  # decoded into the batch
            return reader.raw(frames, dest)
        # a few frames at a time: decode ahead, keep the rest
        stop = min(self.segs[j].stop, frames.start + max(len(frames), self.ahead))
        raw, self.held[j] = take_ahead(reader, held, frames, stop, dest)
        return raw

    def _in_lane(self, job) -> dict[str, np.ndarray]:
        assert self.lanes is not None  # the reader of a block with lanes
        return self.lanes.run(job[0], job[4], lambda: self._read(job))

    def _plan(self, i: int, background: bool):
        """The block from group position ``i``: its jobs, readers opened, reads started
        (``background``: on the decoding threads even with one, see ``submit_reads``).

        Returns ``(size, jobs, open failures, jobs started, wait)``; ``wait()`` gives the
        started jobs' ``(columns, None)`` or ``(None, exception)``."""
        target, segs, nxt, bad, lanes = self.target, self.segs, self.nxt, self.bad, self.lanes
        labels = self.group.order[i : i + min(self.most, target.room())]
        n = len(labels)
        jobs = []  # (j, rows of the block, frames read, dest, turn)
        # each open segment's positions in the block, in order (one sort, not a search per
        # segment: a wide interleave has about one position per segment)
        by = np.argsort(labels, kind="stable")
        cuts = [0, *(np.flatnonzero(np.diff(labels[by])) + 1).tolist(), n] if n else []
        for a, z in itertools.pairwise(cuts):
            rows = by[a:z]
            j = int(labels[rows[0]])
            failed = lanes is not None and lanes.failed[j]
            good = 0 if failed else min(len(rows), max(0, bad[j] - nxt[j]))
            dest = None
            if good:
                bufs, base = target()
                at = rows[:good] + base
                dest = {cam: (buf, at) for cam, buf in bufs.items()}
            jobs.append((j, rows, range(nxt[j], nxt[j] + good), dest, 0))
            nxt[j] += len(rows)
        target.filled(n)
        # Open the chunks' readers here (parquet tables are read on this thread), then decode
        # the chunks on the decoding threads, each with its own decoders.
        opened: dict[int, Exception] = {}
        for j, _, frames, _, _ in jobs:
            if len(frames) and self.readers[j] is None:
                try:
                    self.readers[j] = self.items.episode_reader(
                        segs[j].episode_index, frames.start, segs[j].stop
                    )
                except (*SKIP_ERRORS, *REMOTE_ERRORS) as exc:
                    opened[j] = exc
                    if lanes is not None:
                        lanes.fail(j)
        todo = [job for job in jobs if len(job[2]) and job[0] not in opened]
        if lanes is not None:
            todo = [(j, r, f, d, lanes.ticket(j)) for j, r, f, d, _ in todo]
        wait = self.items.submit_reads(
            self._in_lane if lanes is not None else self._read,
            todo,
            [len(job[2]) for job in todo],
            background=background,
        )
        return n, jobs, opened, todo, wait

    def _finish(self, n, jobs, opened, todo, outcome) -> Block:
        """The block of a plan whose reads ended: raise or skip failures, close segments."""
        segs, bad, readers, position = self.segs, self.bad, self.readers, self.position
        epoch, rank, role = int(self.head[3]), int(self.head[0]), int(self.head[1])
        outcome = dict(zip((job[0] for job in todo), outcome, strict=True))
        parts = []
        keep: np.ndarray | None = None  # positions of the block that are read
        events: list[dict[str, Any]] = []
        for j, rows, frames, _, _ in jobs:
            seg = segs[j]
            c, good, first = len(rows), len(frames), frames.start
            raw, exc = outcome.get(j, (None, opened.get(j)))
            if good and first >= bad[j]:  # an earlier block's read of it failed: not read
                good = 0
            elif good:
                if exc is not None and not isinstance(exc, (*SKIP_ERRORS, *REMOTE_ERRORS)):
                    raise exc
                if exc is not None:
                    where = (
                        f"frames {first}..{frames.stop - 1} of episode {seg.episode_index} "
                        f"(chunk {seg.chunk_id}, epoch {epoch}, stream position "
                        f"{position + int(rows[0])})"
                    )
                    if isinstance(exc, REMOTE_ERRORS):
                        raise streaming_error(exc, where, skippable=False) from exc
                    if not self.skip:
                        raise streaming_error(exc, where) from exc
                    discard(readers[j])  # its later reads do not run (see _Lanes)
                    readers[j], bad[j], good = None, first, 0
                    skip_epoch = epoch if seg.epoch is None else seg.epoch
                    events.append(skip_record(exc, seg, first, skip_epoch, rank, role))
                else:
                    parts.append((raw, None if good == n else rows[:good]))
            if good < c:
                if keep is None:
                    keep = np.ones(n, dtype=bool)
                keep[rows[good:]] = False
            if first + c >= seg.stop and readers[j] is not None:
                readers[j].close()
                readers[j] = None
        kept = None
        if keep is not None:  # number the read rows 0..kept-1 in block order
            renum = np.cumsum(keep) - 1
            parts = [(raw, renum[r]) for raw, r in parts]
            kept = int(keep.sum())
        cursor = np.empty((n, 5), dtype=np.int64)
        cursor[:, :4] = self.head
        cursor[:, 4] = np.arange(position + 1, position + n + 1)
        self.position = position + n
        return Block(n, parts, cursor, kept, events, keep)
