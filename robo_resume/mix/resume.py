"""Where a mix's streams stand: levels, start points, resume (same or other topology), epochs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..errors import ResumeStateError, describe
from ..index.elastic import build_layout
from ..index.schedule import Topology
from ..index.start import StartPoint, worker_batches_done
from ..state.mix import MixState
from ..state.records import check_resume_step
from ..state.resume import ResumeState, StreamCursor
from ..stream.epochs import EpochTable
from .levels import MixLevel
from .order import MixOrder

if TYPE_CHECKING:
    from ..dataset import ChunkedEpisodeDataset


class MixPositions:
    """Where a mix's streams stand: its levels, start points and resume, on the same or
    another topology (elastic), and how many batches its epochs have.

    Args:
        order: the mix's :class:`~robo_resume.mix.order.MixOrder`.
        datasets: the sources' datasets (each resumes from its part of a mix state).
        batch_size, rank, world_size, on_error: the mix's.
        resume_step: checked here (:meth:`check_resume_step`) before it is kept.

    Arithmetic only (no frame is read), over the mix order and the sources' layouts.
    """

    def __init__(
        self,
        order: MixOrder,
        datasets: Sequence[ChunkedEpisodeDataset],
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        on_error: str,
    ) -> None:
        self.order, self.datasets = order, list(datasets)
        self.infinite = order.infinite
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.on_error = on_error
        self.resume_step = 0
        self.resume_state: MixState | None = None
        self._levels: dict[int, MixLevel] = {}
        self._starts: dict[int, StartPoint] = {}

    def check_resume_step(self, step: Any, state: Any) -> int:
        """Check ``resume_step`` against a ``resume_state`` and the skip policy; keep it."""
        check_resume_step(step, self.batch_size)
        if step and state is not None:
            raise ValueError(
                describe(
                    "Pass resume_step or resume_state, not both",
                    expected="one resume position",
                    found=f"resume_step={step} and a resume_state",
                    fix="pass only resume_state (it is exact across topology changes)",
                )
            )
        if step and self.on_error == "skip":
            raise ValueError(
                describe(
                    "resume_step cannot be exact with on_error='skip'",
                    expected="resume_state=MixTracker.state_dict() (it carries the skipped chunks)",
                    found=f"resume_step={step}, on_error='skip'",
                    fix="resume from the tracker's state: a step count does not say which "
                    "chunks were skipped, so they would be read again and skipped records lost",
                )
            )
        self.resume_step = step
        return step

    # -- resume ----------------------------------------------------------------------------------
    def install(self, state: MixState, strict: bool) -> None:
        """Hand each source its part of ``state``, its cursors put where the mix says.

        The positions are checked against the arithmetic of the run that saved the state
        (:meth:`MixLevel.source_positions`); in "stop" mode a source cursor left in an earlier
        epoch (the source gave that stream nothing yet this epoch) becomes ``(epoch, 0)``,
        and after a finished mix epoch every cursor is the next epoch's start. So the sources'
        own elastic re-partition (:mod:`robo_resume.index.elastic`) sees what each source has
        really left.
        """
        old = self.state_level(state)
        positions, _ = old.positions(state, ranks=None)
        topo = old.topology
        normal: list[list[StreamCursor]] = [[] for _ in self.datasets]
        for g, (e, j) in sorted(positions.items()):
            rank, role = divmod(g, topo.workers_per_rank)
            recorded = [
                {(c.rank, c.role): c for c in st.cursors}.get((rank, role)) for st in state.sources
            ]
            for i, (ep, p) in enumerate(old.source_positions(e, g, j, recorded, role=role)):
                normal[i].append(StreamCursor(rank, role, ep, p))
        for ds, st, cur in zip(self.datasets, state.sources, normal, strict=True):
            ds.use_resume_state(dataclasses.replace(st, cursors=tuple(cur)), strict=strict)
        self.resume_state = state

    def state_level(self, state: MixState) -> MixLevel:
        """The arithmetic of the run that saved ``state`` (its topology, batch size, layouts)."""
        layouts = tuple(
            build_layout(ds.chunks, ds.config, [*st.origin, st.level], infinite=self.infinite)
            for ds, st in zip(self.datasets, state.sources, strict=True)
        )
        topo = Topology(state.world_size, state.num_workers)
        return MixLevel(self.order, topo, state.batch_size, layouts, state.source_starts)

    def elastic(self, num_workers: int) -> bool:
        """Whether this run resumes a state of another topology or batch size."""
        st = self.resume_state
        return st is not None and st.topology != (self.world_size, num_workers, self.batch_size)

    def level(self, num_workers: int) -> MixLevel:
        """This run's mix arithmetic with ``num_workers`` workers (see :class:`MixLevel`)."""
        lv = self._levels.get(num_workers)
        if lv is None:
            layouts = tuple(ds.layout(num_workers) for ds in self.datasets)
            st = self.resume_state
            if st is None:
                starts = (0,) * len(self.datasets)
            elif self.elastic(num_workers):  # where each source's re-partition starts
                starts = tuple(ds.start_point(num_workers)[1][0][0] for ds in self.datasets)
            else:
                starts = st.source_starts
            topo = Topology(self.world_size, num_workers)
            lv = MixLevel(self.order, topo, self.batch_size, layouts, starts)
            self._levels[num_workers] = lv
        return lv

    def start_point(self, num_workers: int) -> StartPoint:
        """A :class:`~robo_resume.index.start.StartPoint` ``(rotation, [(epoch, j, [(epoch,
        position)] per source)] per role, batches)``.

        New worker ``w`` plays role ``(w + rotation) % W`` in the first iteration. From the
        resume state (same topology: each role goes on where it stood; another topology or
        batch size: every role starts the *remainder mix epoch* at ``j = 0``, see the module
        docstring), from ``resume_step`` (arithmetic), or from the start.
        """
        got = self._starts.get(num_workers)
        if got is None:
            got = self._starts[num_workers] = StartPoint(*self._start_point(num_workers))
        return got

    def _start_point(self, num_workers: int):
        wp = max(num_workers, 1)
        lv = self.level(num_workers)
        st = self.resume_state
        if st is None and self.resume_step == 0:
            return 0, [(0, 0, [(0, 0)] * self.order.num_sources) for _ in range(wp)], 0
        if st is None:
            return lv.step_start(self.rank, self.resume_step // self.batch_size)
        if self.elastic(num_workers):
            last = max(e for *_, e, _ in st.mix)
            old = self.state_level(st)
            if self.infinite:
                label = last + 1  # "cycle": the mix epoch counts topology changes
            else:
                ended = all(j >= old.stop_end(last) for *_, e, j in st.mix if e == last)
                label = last + 1 if ended else last
            return 0, [(label, 0, [(s, 0) for s in lv.starts]) for _ in range(wp)], 0
        mine, done = lv.positions(st, ranks=(self.rank,))
        if done is not None:
            n = self.order.num_sources
            return 0, [(done, 0, [(done, 0)] * n) for _ in range(wp)], st.batches
        cur = [mine[lv.topology.stream_id(self.rank, r)] for r in range(wp)]
        total = sum(j for _, j in cur)
        expect = [worker_batches_done(total, num_workers, r) for r in range(wp)]
        if [j for _, j in cur] != expect:
            raise ResumeStateError(
                describe(
                    "Mix positions are not a DataLoader round-robin prefix",
                    expected=f"batches per stream {expect}",
                    found=[j for _, j in cur],
                    fix="record batches with MixTracker.consume on every batch, in order",
                )
            )
        starts = []
        for role, (e, j) in enumerate(cur):
            g = lv.topology.stream_id(self.rank, role)
            # a resumed mix resumes every source (use_resume_state gives each its state)
            sources = cast("list[ResumeState]", [ds.resume_state for ds in self.datasets])
            recorded = [
                {(c.rank, c.role): c for c in s.cursors}.get((self.rank, role)) for s in sources
            ]
            starts.append((e, j, lv.source_positions(e, g, j, recorded, role=role)))
        return total % wp, starts, st.batches

    def epochs_started(self, state: Mapping[str, Any] | MixState, num_workers: int) -> int:
        """Mix epochs the interrupted run finished ("stop"; 0 with "cycle").

        Prefer ``for epoch in loader.epochs(n)`` (:meth:`next_epoch` counts for you)."""
        if self.infinite:
            return 0
        st = MixState.from_dict(state)
        last = max(e for _, _, e, _ in st.mix)
        done = self.state_level(st).stop_end(last)
        return last + 1 if all(e == last and j >= done for _, _, e, j in st.mix) else last

    # -- epochs --------------------------------------------------------------------------------
    def epoch_batches(self, epoch: int, num_workers: int) -> int | None:
        """``J``: batches every mix stream yields in ``epoch`` ("stop"); None with "cycle"."""
        return self.level(num_workers).epoch_end(epoch)

    def batches_next_iteration(self, num_workers: int, table: EpochTable) -> int:
        """Batches the next iteration of this rank's DataLoader yields (``len(loader)``).

        ``exhausted="stop"``: the first iteration runs from :meth:`start_point` (after a
        resume, what is left of the interrupted mix epoch) to the epoch's end ``J`` of every
        role; later ones are whole mix epochs. ``"cycle"`` has no end: TypeError.
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "A cycling mix's loader has no len()",
                    expected="exhausted='stop' for a loader with a length",
                    found="exhausted='cycle': one endless iteration",
                    fix="count steps yourself (the mix cycles through its sources' epochs)",
                )
            )
        wp = max(num_workers, 1)
        if not table.started:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            return sum(
                max(self.level(num_workers).stop_end(epoch) - j, 0) for epoch, j, _ in starts
            )
        return self.level(num_workers).stop_end(table.next_epoch) * wp

    def next_epoch(self, num_workers: int, table: EpochTable) -> int:
        """The mix epoch the next iteration of this rank's loader plays ("stop" only).

        As :meth:`ChunkedEpisodeDataset.next_epoch`: the resume point's epoch (the next one
        when the checkpoint was taken at an epoch's end), then one more per iteration; what
        :meth:`~robo_resume.stream.loader.BatchLoader.epochs` counts with. TypeError with "cycle".
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "A cycling mix has no epochs to count",
                    expected="exhausted='stop' for epochs",
                    found="exhausted='cycle': one endless iteration",
                    fix="count steps (the mix cycles through its sources' epochs)",
                )
            )
        if not table.started:
            _, starts, _ = self.start_point(num_workers)
            return min(e for e, _, _ in starts)
        return table.next_epoch

    def share_schedule(self, num_workers: int, table: EpochTable) -> None:
        """Compute each source's layout of the source epoch the next iteration starts in, here,
        before the DataLoader's workers start (as
        :meth:`~robo_resume.dataset.ChunkedEpisodeDataset.share_schedule` does for one
        dataset): forked workers inherit them, spawn and forkserver workers map
        them from shared memory, instead of each worker permuting every source's epoch. What
        :class:`~robo_resume.stream.loader.BatchLoader` calls. A source epoch a worker reaches
        on its own (``exhausted="cycle"``) it still computes itself; the frames are the same.
        """
        if not table.started:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            firsts = [min(role[2][i][0] for role in starts) for i in range(len(self.datasets))]
        else:  # every role starts the next mix epoch, each source at its epoch of that number
            firsts = [table.next_epoch] * len(self.datasets)
        for ds, epoch in zip(self.datasets, firsts, strict=True):
            layout = ds.layout(num_workers)
            if epoch != layout.epoch:  # a remainder epoch (elastic resume) has no layout to share
                layout.schedule.share_epoch(epoch)

    def batches_per_epoch(self, num_workers: int) -> int | None:
        """Batches this rank's DataLoader yields in mix epoch 0 ("stop"); None with "cycle"."""
        j = self.epoch_batches(0, num_workers)
        return None if j is None else j * max(num_workers, 1)
