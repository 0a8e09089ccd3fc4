"""Where a ChunkedEpisodeDataset's streams stand: plan, schedule, resume start points.

:class:`StreamPositions` is pure arithmetic over the index layer: it turns the dataset's
settings and resume state into schedules, layouts and start points, and nothing is read. The
dataset holds one, and so does every view of it (``robo_resume.audit``'s probes).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from ..errors import (
    ResumeStateError,
    describe,
    format_ranges,
)
from ..format.arrow_columns import release_freed_memory
from ..format.keyframes import keyframe_cuts
from ..format.metadata import DatasetMeta
from ..index.elastic import Layout, Level, build_layout, check_positions, replan
from ..index.plan import EpisodeSpans, Plan, make_chunks, plan_digest
from ..index.schedule import (
    Schedule,
    Segment,
    Topology,
)
from ..index.start import (
    StartPoint,
    StreamView,
    resume_at,
    resume_point,
    worker_batches_done,
)
from ..state.fingerprint import expected_for, plan_of_state, value_hash
from ..state.resume import ResumeState, StreamCursor
from .epochs import EpochTable
from .tuning import SHUFFLE_CHUNK_FRAMES, SHUFFLE_CHUNK_FRAMES_TABULAR, StreamTuning

__all__ = ["StreamPositions"]

logger = logging.getLogger("robo_resume")


class StreamPositions:
    """The plan, schedules, resume state and start points of a ChunkedEpisodeDataset.

    Args:
        meta: the dataset's metadata (features already selected).
        episodes: the selected episode indices (sorted int64 array).
        spans: their planning columns (:func:`robo_resume.dataset.episode_spans`).
        batch_size, seed, drop_last, infinite, rank, world_size, resume_step: the dataset's.
        tuning: the :class:`StreamTuning`; ``chunk_frames`` resolved from it and the source,
            ``chunk_frames_given`` whether the source named it.
        window_lookback: frames the first camera's delta window reaches back (keyframe cuts).

    Every method is arithmetic (no frame is read); the only state is the plan (replaced when
    an older resume state's plan or order is adopted), the resume state, and caches of
    schedules and layouts per ``num_workers``.
    """

    def __init__(
        self,
        meta: DatasetMeta,
        episodes: np.ndarray,
        spans: EpisodeSpans,
        *,
        batch_size: int,
        seed: int,
        drop_last: bool,
        infinite: bool,
        rank: int,
        world_size: int,
        resume_step: int,
        tuning: StreamTuning,
        chunk_frames: int,
        chunk_frames_given: bool,
        window_lookback: int,
    ) -> None:
        self.meta, self.episodes, self.spans = meta, episodes, spans
        self.total_frames = int(spans.length.sum())
        self.batch_size, self.seed = batch_size, seed
        self.drop_last, self.infinite = drop_last, infinite
        self.rank, self.world_size = rank, world_size
        self.resume_step = resume_step
        self.chunk_frames_given = chunk_frames_given
        self.window_lookback = window_lookback
        self.make_plan(tuning, chunk_frames)
        self.use_resume_state(None)

    def make_plan(self, tuning: StreamTuning, chunk_frames: int) -> None:
        """Make the plan and the schedule options of ``tuning`` with ``chunk_frames`` (at
        construction, and again when an older resume state's order is adopted)."""
        self.tuning, self.chunk_frames = tuning, chunk_frames
        cut = tuning.cut_at_keyframes
        cuts = None
        if cut is not False:
            cuts = keyframe_cuts(
                self.meta, self.episodes, auto=cut is None, lookback=self.window_lookback
            )
        # whether the plan's chunks start on keyframes (cut_at_keyframes resolved; False
        # after adopting a resume state's plan without them, adopt_even_plan)
        self.keyframe_cuts = cuts is not None
        self.chunks: Plan = make_chunks(self.spans, chunk_frames, cut_points=cuts)
        release_freed_memory()  # planning's temporaries: about 2x the plan at 10^6 episodes
        self.config = tuning.schedule_config(
            seed=self.seed, batch_size=self.batch_size, drop_last=self.drop_last
        )
        self._fingerprint: dict[str, Any] | None = None
        self._schedules: dict[int, Schedule] = {}

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a resume state must match: dataset, selection, plan and schedule options.

        Computed on first use (hashing a plan of 10^6 episodes takes a fraction of a second;
        ``robo-resume plan`` and a run that never saves or loads a state do not need it), then
        kept.
        """
        if self._fingerprint is None:
            self._fingerprint = self._make_fingerprint()
        return self._fingerprint

    @fingerprint.setter
    def fingerprint(self, value: dict[str, Any]) -> None:
        self._fingerprint = value

    def _make_fingerprint(self) -> dict[str, Any]:
        tuning = self.tuning
        return {
            "dataset": self.meta.fingerprint()["episodes_sha256"],
            "total_frames": self.total_frames,
            "episodes": value_hash(self.episodes.tolist()),
            "plan": plan_digest(self.chunks),
            "seed": self.seed,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "tail": tuning.tail,
            "interleave": tuning.interleave,
            "shuffle": tuning.shuffle,
            # only when not the default: states saved before the option keep matching
            **(
                {"interleave_order": tuning.interleave_order}
                if tuning.interleave_order != "random"
                else {}
            ),
            # only for the shuffle order: states saved with the interleave order (robo_resume
            # 0.1 had no other) keep matching a dataset built with StreamTuning.fast()
            **(
                {"order": "shuffle", "shuffle_frames": tuning.shuffle_frames}
                if tuning.resolved_order == "shuffle"
                else {}
            ),
            "mode": "infinite" if self.infinite else "epoch",
            "about": {  # readable facts for refusals (robo_resume.state.ABOUT, never compared)
                "dataset": f"{Path(self.meta.root).name} ({self.meta.num_episodes} episodes, "
                f"{self.meta.total_frames} frames)",
                "episodes": format_ranges(self.episodes, limit=120),
                "plan": f"chunk_frames {self.chunk_frames}"
                + (", cut at keyframes" if self.keyframe_cuts else ""),
                "interleave_order": tuning.interleave_order,
                "order": tuning.resolved_order
                + (
                    f" ({tuning.shuffle_frames} frames a window)"
                    if tuning.resolved_order == "shuffle"
                    else f" ({tuning.interleave} open chunks)"
                ),
            },
        }

    def use_resume_state(
        self, state: Mapping[str, Any] | ResumeState | None, *, strict: bool = True
    ) -> None:
        """Resume from ``state``: parse, adopt an older state's order or plan, check the
        fingerprint (the batch size may differ: elastic resume) and forget layouts made
        without it. ``strict=False`` logs mismatches as warnings instead of raising."""
        self.resume_state: ResumeState | None = None
        if state is not None:
            self.resume_state = ResumeState.from_dict(state)
            self.adopt_interleave_order(self.resume_state.fingerprint)
            self.adopt_even_plan(self.resume_state.fingerprint)
            self.adopt_two_frame_plan(self.resume_state.fingerprint)
            expected = expected_for(self.fingerprint, self.resume_state.fingerprint, self.chunks)
            if self.resume_state.batch_size is not None:  # elastic: the batch size may change
                expected["batch_size"] = self.resume_state.batch_size
            self.resume_state.check_fingerprint(expected, strict=strict)
        self._forget_layouts()
        # (epoch, chunk) -> [(segment start, stop, first skipped frame)] of the state's skips
        self._skip_from: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for r in getattr(self.resume_state, "skipped", ()):
            self._skip_from.setdefault((r["epoch"], r["chunk"]), []).append(
                (r["start"], r["stop"], r["frame"])
            )

    def _forget_layouts(self) -> None:
        self._plans: dict[int, tuple[Layout, int | None, tuple[Level, ...]]] = {}
        self._elastic_starts: dict[int, int] = {}  # num_workers -> epoch all streams start in

    def resuming(self, state: Mapping[str, Any] | ResumeState) -> StreamPositions:
        """A copy of these positions resuming from ``state`` as it is (no adoption, no
        fingerprint check): where a run resumed from ``state`` would start."""
        view = copy.copy(self)
        view.resume_state = ResumeState.from_dict(state)
        view._forget_layouts()
        return view

    # -- pure parts ----------------------------------------------------------------------------
    def schedule(self, num_workers: int) -> Schedule:
        """The pure schedule for this rank's DataLoader with ``num_workers`` workers."""
        s = self._schedules.get(num_workers)
        if s is None:
            s = Schedule(self.chunks, self.config, Topology(self.world_size, num_workers))
            self._schedules[num_workers] = s
        return s

    def share_schedule(self, num_workers: int, table: EpochTable) -> None:
        """Compute the layout of the epoch the next iteration starts in, here, before the
        DataLoader's workers start: they inherit it (fork) or map it from shared memory with
        the dataset's other large arrays (spawn, forkserver:
        :mod:`robo_resume.stream.shared_arrays`) instead of each computing it (CPU time and
        40 MB per worker at 10^6 episodes;
        :meth:`~robo_resume.index.schedule.Schedule.share_epoch`). What
        :class:`~robo_resume.stream.loader.BatchLoader` calls per iteration; a remainder epoch
        (elastic resume) has no layout to share. The frames are the same either way.
        """
        layout = self.layout(num_workers)
        if not table.started:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            epoch = min(e for e, _ in starts)
        else:
            epoch = table.next_epoch
        if epoch != layout.epoch:
            layout.schedule.share_epoch(epoch)

    def batches_per_epoch(self, num_workers: int) -> int:
        """Batches this rank's DataLoader yields per epoch (equal on every rank, except with
        ``StreamTuning(tail="keep")`` when the frames cannot be split so)."""
        return self.schedule(num_workers).rank_batches(self.rank)

    def batches_next_iteration(self, num_workers: int, table: EpochTable) -> int:
        """Batches the next iteration of this rank's DataLoader yields (``len(loader)``).

        The first iteration runs from :meth:`start_point` to the end of its epoch (a partial
        epoch after a resume; the remainder epoch after an elastic resume); later ones are
        whole epochs of :meth:`layout`. Raises TypeError in infinite mode (no end).
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "An infinite ChunkedEpisodeDataset's loader has no len()",
                    expected="infinite=False for a loader with a length",
                    found="infinite=True: one endless iteration over consecutive epochs",
                    fix=f"use dataset.batches_per_epoch(num_workers) "
                    f"({self.batches_per_epoch(num_workers)} here) as the epoch length, or "
                    "count steps yourself",
                )
            )
        wp = max(num_workers, 1)
        layout = self.layout(num_workers)
        topo = Topology(self.world_size, num_workers)
        if not table.started:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
        else:  # every worker starts its next epoch at position 0
            starts = [(table.next_epoch, 0)] * wp
        b = self.batch_size
        total = 0
        for role, (epoch, position) in enumerate(starts):
            left = layout.length(epoch, topo.stream_id(self.rank, role)) - position
            total += -(-max(left, 0) // b)
        return total

    def next_epoch(self, num_workers: int, table: EpochTable) -> int:
        """The epoch the next iteration of this rank's loader (``num_workers``) plays.

        Before the first iteration: the epoch the resume point stands in (0 without a resume;
        after a resume, the interrupted epoch, or the next one when the checkpoint was taken
        at its end; after an elastic resume, the remainder epoch's label, which is the
        interrupted epoch's number). Then one more per iteration the loader started. Epoch
        mode only (an infinite dataset has one endless iteration: TypeError). This is what
        :meth:`BatchLoader.epochs` counts with, whatever topology the checkpoint had.
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "An infinite ChunkedEpisodeDataset has no epochs to count",
                    expected="infinite=False",
                    found="infinite=True: one endless iteration over consecutive epochs",
                    fix="count steps, or use epoch mode and loader.epochs(n)",
                )
            )
        if not table.started:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            return min(e for e, _ in starts)  # epoch mode: every role starts in one epoch
        return table.next_epoch

    def start_point(self, num_workers: int) -> StartPoint:
        """Where this rank's streams start: a :class:`~robo_resume.index.start.StartPoint`
        ``(rotation, [(epoch, position)] per role, batches)``.

        From ``resume_state`` when given (cursors), else from ``resume_step`` (arithmetic). New
        worker ``w`` plays role ``(w + rotation) % workers`` in the first iteration. After a
        topology or batch size change every role starts at position 0 of the remainder epoch
        (see :meth:`layout`), with rotation 0 and a batch count of 0.
        """
        sched = self.schedule(num_workers)
        if self.resume_state is None:
            batches = self.resume_step // self.batch_size
            rp = resume_point(sched, batches, infinite=self.infinite, rank=self.rank)
            return StartPoint(rp.rotation, [(s.epoch, s.position) for s in rp.starts], batches)
        return StartPoint(*self._start_from_cursors(self.resume_state, sched, num_workers))

    def layout(self, num_workers: int) -> Layout:
        """What this rank's streams emit per epoch, with ``num_workers`` workers.

        The schedule's epochs, plus, after an elastic resume (a ``resume_state`` of another
        topology or batch size, or one saved during such a run's first epoch), the *remainder
        epoch*: what the interrupted epoch had left, re-partitioned over this topology.
        """
        return self._plan(num_workers)[0]

    def elastic_origin(self, num_workers: int) -> tuple[int | None, tuple[Level, ...]]:
        """``(remainder epoch label, origin levels)`` a state of this run must carry."""
        _, label, origin = self._plan(num_workers)
        return label, origin

    def _plan(self, num_workers: int) -> tuple[Layout, int | None, tuple[Level, ...]]:
        plan = self._plans.get(num_workers)
        if plan is not None:
            return plan
        st, sched = self.resume_state, self.schedule(num_workers)
        here = (self.world_size, num_workers, self.batch_size)
        if st is None:
            plan = (Layout(sched), None, ())
        elif (st.world_size, st.num_workers, st.batch_size) == here:
            if st.elastic_epoch is None:
                plan = (Layout(sched), None, ())
            else:
                layout = build_layout(
                    self.chunks, self.config, [*st.origin, st.level], infinite=self.infinite
                )
                plan = (layout, st.elastic_epoch, st.origin)
        else:
            rp = replan(
                self.chunks,
                self.config,
                [*st.origin, st.level],
                Level(*here),
                infinite=self.infinite,
            )
            plan = (rp.layout, rp.layout.epoch, rp.origin)
            self._elastic_starts[num_workers] = rp.epoch
            if self.rank == 0 and get_worker_info() is None:
                logger.info(
                    "resume: elastic re-partition from world_size=%d num_workers=%d "
                    "batch_size=%s to world_size=%d num_workers=%d batch_size=%d: %s",
                    st.world_size,
                    st.num_workers,
                    st.batch_size,
                    *here,
                    f"{rp.total} frames left in epoch {rp.epoch} form the remainder epoch"
                    if rp.layout.epoch is not None
                    else f"nothing left mid-epoch, starting epoch {rp.epoch}",
                )
            if rp.dropped and get_worker_info() is None:
                logger.warning(
                    "resume: drop_last=True drops %d of the %d frames left in epoch %d on rank "
                    "%d's re-partition (they do not fill a batch on every rank)",
                    rp.dropped,
                    rp.total,
                    rp.epoch,
                    self.rank,
                )
        self._plans[num_workers] = plan
        return plan

    def _start_from_cursors(
        self, st: ResumeState, sched: Schedule, num_workers: int
    ) -> tuple[int, list[tuple[int, int]], int]:
        wp = max(num_workers, 1)
        layout = self.layout(num_workers)
        if (st.world_size, st.num_workers, st.batch_size) != (
            self.world_size,
            num_workers,
            self.batch_size,
        ):
            return 0, [(self._elastic_starts[num_workers], 0)] * wp, 0
        topo = Topology(self.world_size, num_workers)
        mine = {c.role: c for c in st.cursors if c.rank == self.rank}
        if sorted(mine) != list(range(wp)):
            raise ResumeStateError(
                describe(
                    "The resume state lacks cursors of this rank's streams",
                    expected=f"roles 0..{wp - 1} of rank {self.rank}",
                    found=sorted(mine),
                    fix="save the state with CursorTracker.state_dict() (it gathers all ranks)",
                )
            )
        b = self.batch_size
        cur = [mine[r] for r in range(wp)]
        ids = [topo.stream_id(self.rank, r) for r in range(wp)]
        positions = {g: (c.epoch, c.position) for c, g in zip(cur, ids, strict=True)}
        check_positions(layout, positions, topo)
        if self.infinite:
            done = [
                layout.frames_done(c.epoch, g, c.position) // b
                for c, g in zip(cur, ids, strict=True)
            ]
            total = sum(done)
            starts = [(c.epoch, c.position) for c in cur]
        else:
            # A stream that finished epoch e-1 before its first batch of epoch e stands at
            # (e-1, its length of e-1), which is the same place as (e, 0).
            last = max(c.epoch for c in cur)
            cur = [
                StreamCursor(c.rank, c.role, last, 0)
                if c.epoch == last - 1 and c.position >= layout.length(c.epoch, g)
                else c
                for c, g in zip(cur, ids, strict=True)
            ]
            epochs = {c.epoch for c in cur}
            if len(epochs) != 1:
                raise ResumeStateError(
                    describe(
                        "Stream cursors stand in different epochs",
                        expected="all streams of a rank in one epoch (epoch mode)",
                        found=[(c.role, c.epoch, c.position) for c in cur],
                    )
                )
            e = epochs.pop()
            if all(c.position >= layout.length(e, g) for c, g in zip(cur, ids, strict=True)):
                return 0, [(e + 1, 0)] * wp, st.batches
            done = [-(-c.position // b) for c in cur]
            total = sum(done)
            starts = [(c.epoch, c.position) for c in cur]
        expect = [worker_batches_done(total, num_workers, r) for r in range(wp)]
        if done != expect:
            raise ResumeStateError(
                describe(
                    "Stream cursors are not a DataLoader round-robin prefix",
                    expected=f"batches per stream {expect}",
                    found=f"{done}",
                    fix="record cursors with CursorTracker.consume on every batch, in order",
                )
            )
        return total % wp, starts, st.batches

    def adopt_interleave_order(self, theirs: Any) -> None:
        """A state saved with the interleave order (robo_resume 0.1's only order, and
        :meth:`StreamTuning.fast`) resumes in that order when this dataset was built with the
        default order (``order`` None, no interleave setting): the state's interleave settings,
        and with ``chunk_frames`` None that order's chunk length (64), are adopted, so the run
        goes on exactly as it would have (one INFO line; a plan that still differs is refused
        by the fingerprint check, naming the plan). An explicit ``order`` is honoured (or
        refused)."""
        if not isinstance(theirs, Mapping) or "order" in theirs:
            return
        if self.tuning.order is not None or self.tuning.resolved_order != "shuffle":
            return
        order: dict[str, Any] = {"interleave": int(theirs.get("interleave", 4))}
        if "interleave_order" in theirs:
            order["interleave_order"] = str(theirs["interleave_order"])
        tuning = dataclasses.replace(self.tuning, order="interleave", **order)
        chunk_frames = self.chunk_frames if self.chunk_frames_given else None
        self.make_plan(tuning, tuning.chunk_frames(chunk_frames))
        logger.info(
            "resume: the state was saved with the interleave order (%d open chunks of %d frames, "
            "robo_resume's default before the shuffle order): resuming in that order; pass "
            "tuning=StreamTuning.fast() to say so, or start a new run for the shuffle order",
            tuning.interleave,
            self.chunk_frames,
        )

    def adopt_even_plan(self, theirs: Any) -> None:
        """A state saved before chunks started on keyframes (``cut_at_keyframes=None`` became
        the default) carries the digest of the even plan: when this plan has keyframe cuts and
        the state's plan is not it but the even one, use the even plan, so the state resumes
        exactly (one INFO line). Only with the automatic setting (``None``); any other mismatch
        is left to the fingerprint check."""
        auto = self.tuning.cut_at_keyframes is None  # an explicit True is honoured (or refused)
        if not (auto and self.keyframe_cuts) or not isinstance(theirs, Mapping):
            return
        if theirs.get("plan") in (self.fingerprint["plan"], None):
            return
        made: list[Plan] = []

        def even() -> Plan:
            made.append(
                make_chunks(EpisodeSpans(*self.meta.spans(self.episodes)), self.chunk_frames)
            )
            return made[-1]

        if plan_of_state(theirs, {"even": even}) is None:
            return
        self.chunks = even_plan = made[-1]
        self.keyframe_cuts = False
        self._fingerprint = None
        self._schedules = {}
        self._forget_layouts()
        logger.info(
            "resume: the state was saved with chunks of %d frames not cut at keyframes (%d "
            "chunks, robo_resume before keyframe chunks became the default): resuming that plan; "
            "pass StreamTuning(cut_at_keyframes=False) to say so",
            self.chunk_frames,
            len(even_plan),
        )

    def adopt_two_frame_plan(self, theirs: Any) -> None:
        """A state saved before streams without video read single frames (their default
        ``chunk_frames`` was :data:`~robo_resume.stream.tuning.SHUFFLE_CHUNK_FRAMES`, 2) carries
        the digest of that plan: when this plan is the single-frame default and the state's
        plan is the 2-frame one, use 2-frame chunks, so the state resumes exactly (one INFO
        line). Only with ``chunk_frames`` None; any other mismatch is left to the fingerprint
        check."""
        if self.chunk_frames_given or self.tuning.resolved_order != "shuffle":
            return
        if self.chunk_frames != SHUFFLE_CHUNK_FRAMES_TABULAR or not isinstance(theirs, Mapping):
            return
        if theirs.get("plan") in (self.fingerprint["plan"], None):
            return
        made: list[Plan] = []

        def two_frames() -> Plan:
            made.append(make_chunks(self.spans, SHUFFLE_CHUNK_FRAMES))
            return made[-1]

        if plan_of_state(theirs, {"two frames": two_frames}) is None:
            return
        self.make_plan(self.tuning, SHUFFLE_CHUNK_FRAMES)
        self._forget_layouts()
        logger.info(
            "resume: the state was saved with chunks of %d frames (robo_resume's default for "
            "streams without video before they read single frames): resuming that plan; pass "
            "chunk_frames=%d to say so, or start a new run for single frames",
            SHUFFLE_CHUNK_FRAMES,
            SHUFFLE_CHUNK_FRAMES,
        )

    def skipped_from(self, epoch: int, seg: Segment) -> int:
        """First frame of ``seg`` (of ``epoch``) the resume state recorded as skipped, else stop.

        A record covers frames ``frame .. stop - 1`` of a segment that began at ``start``; a
        segment of a remainder epoch (elastic resume) is a later piece of such a segment
        (``start <= seg.start < stop``) and carries the epoch it was left over from.
        """
        e = epoch if seg.epoch is None else seg.epoch
        for start, stop, frame in self._skip_from.get((e, seg.chunk_id), ()):
            if start <= seg.start < stop:
                return max(frame, seg.start)
        return seg.stop

    def log_resume(
        self, sched: StreamView, stream: int, epoch: int, position: int, label: str = ""
    ) -> None:
        """Log the stream's one `resume:` line: where it continues (chunk, frame, episode);
        ``label`` ends the line (a mix names the source, `` source=1 (b)``)."""
        logger.info("%s%s", resume_at(sched, stream, epoch, position).line(), label)
