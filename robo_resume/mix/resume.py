"""Where a mix resumes: from a MixState, a resume_step or a StatefulDataLoader state."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..errors import ResumeStateError, describe
from ..index.elastic import build_layout
from ..index.schedule import Topology
from ..index.start import StartPoint, worker_batches_done
from ..state.mix import MixState
from ..state.records import check_resume_step
from ..state.resume import StreamCursor
from .levels import _Level


class _MixResume:
    """Where a mix resumes: from a MixState, a resume_step or a StatefulDataLoader state, on
    the same or another topology (elastic).

    A mixin of :class:`robo_resume.mix.MixedDataset`.
    """

    def _check_resume_step(self, step: Any, state: Any) -> int:
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
        return step

    # -- resume ----------------------------------------------------------------------------------
    def _install(self, state: MixState, strict: bool) -> None:
        """Hand each source its part of ``state``, its cursors put where the mix says.

        The positions are checked against the arithmetic of the run that saved the state
        (:meth:`_Level.source_positions`); in "stop" mode a source cursor left in an earlier
        epoch (the source gave that stream nothing yet this epoch) becomes ``(epoch, 0)``,
        and after a finished mix epoch every cursor is the next epoch's start. So the sources'
        own elastic re-partition (:mod:`robo_resume.index.elastic`) sees what each source has
        really left.
        """
        old = self._state_level(state)
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

    def _state_level(self, state: MixState) -> _Level:
        """The arithmetic of the run that saved ``state`` (its topology, batch size, layouts)."""
        layouts = tuple(
            build_layout(ds.chunks, ds.config, [*st.origin, st.level], infinite=self.infinite)
            for ds, st in zip(self.datasets, state.sources, strict=True)
        )
        topo = Topology(state.world_size, state.num_workers)
        return _Level(self, topo, state.batch_size, layouts, state.source_starts)

    def _elastic(self, num_workers: int) -> bool:
        st = self.resume_state
        return st is not None and st.topology != (self.world_size, num_workers, self.batch_size)

    def level(self, num_workers: int) -> _Level:
        """This run's mix arithmetic with ``num_workers`` workers (see :class:`_Level`)."""
        lv = self._levels.get(num_workers)
        if lv is None:
            layouts = tuple(ds.layout(num_workers) for ds in self.datasets)
            st = self.resume_state
            if st is None:
                starts = (0,) * len(self.datasets)
            elif self._elastic(num_workers):  # where each source's re-partition starts
                starts = tuple(ds.start_point(num_workers)[1][0][0] for ds in self.datasets)
            else:
                starts = st.source_starts
            topo = Topology(self.world_size, num_workers)
            lv = self._levels[num_workers] = _Level(self, topo, self.batch_size, layouts, starts)
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
            return 0, [(0, 0, [(0, 0)] * len(self.sources)) for _ in range(wp)], 0
        if st is None:
            return lv.step_start(self.rank, self.resume_step // self.batch_size)
        if self._elastic(num_workers):
            last = max(e for *_, e, _ in st.mix)
            old = self._state_level(st)
            if self.infinite:
                label = last + 1  # "cycle": the mix epoch counts topology changes
            else:
                done = all(j >= old.epoch_end(last) for *_, e, j in st.mix if e == last)
                label = last + 1 if done else last
            return 0, [(label, 0, [(s, 0) for s in lv.starts]) for _ in range(wp)], 0
        mine, done = lv.positions(st, ranks=(self.rank,))
        if done is not None:
            n = len(self.sources)
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
            sources = [ds.resume_state for ds in self.datasets]
            recorded = [
                {(c.rank, c.role): c for c in s.cursors}.get((self.rank, role)) for s in sources
            ]
            starts.append((e, j, lv.source_positions(e, g, j, recorded, role=role)))
        return total % wp, starts, st.batches

    # -- StatefulDataLoader protocol -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This worker's mix stream (what it has yielded), for torchdata's StatefulDataLoader:
        ``rank, role, num_workers, epoch, j`` and each source stream's ``(epoch, position)``."""
        live = dict(self._live)
        live["sources"] = [list(p) for p in live["sources"]]
        return live

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` in the next ``iter()`` (StatefulDataLoader hook).

        The position is checked against the mix arithmetic (each source stream's position must
        be what ``j`` batches of the mix order leave it at), so a state of another mix,
        topology or batch size is refused instead of replaying or losing frames; an elastic
        resume needs :class:`MixTracker`'s state.
        """
        need = ("rank", "role", "num_workers", "epoch", "j", "sources")
        if not isinstance(state, Mapping) or any(k not in state for k in need):
            raise ResumeStateError(
                describe(
                    "Invalid mix dataset state",
                    expected=f"keys {need} (MixedDataset.state_dict())",
                    found=sorted(state) if isinstance(state, Mapping) else type(state).__name__,
                    fix="pass the unmodified StatefulDataLoader state_dict()",
                )
            )
        if int(state["rank"]) != self.rank:
            raise ResumeStateError(
                describe(
                    "Mix dataset state of another rank",
                    expected=f"rank {self.rank}",
                    found=f"rank {state['rank']}",
                )
            )
        role, nw = int(state["role"]), int(state["num_workers"])
        epoch, j = int(state["epoch"]), int(state["j"])
        sources = [(int(e), int(p)) for e, p in state["sources"]]
        lv = self.level(nw)
        g = lv.topology.stream_id(self.rank, role)
        recorded = [StreamCursor(self.rank, role, e, p) for e, p in sources]
        try:
            fits = len(sources) == len(self.sources) and lv.source_positions(
                epoch, g, j, recorded, role=role
            ) == [max(p, (epoch, 0)) if not self.infinite else p for p in sources]
            why = ""
        except ResumeStateError as exc:
            fits, why = False, f" ({str(exc).split('. Fix:')[0]})"
        if not fits:
            raise ResumeStateError(
                describe(
                    "The mix dataset state does not fit this mix",
                    expected=f"{len(self.sources)} source positions matching mix batch {j} of "
                    f"epoch {epoch}",
                    found=f"{sources}{why}",
                    fix="load the state into the same mix, topology and batch size it was saved "
                    "with (for another topology resume from MixTracker.state_dict())",
                )
            )
        self._loaded = {"role": role, "epoch": epoch, "j": j, "sources": sources}
        self._live.update(role=role, num_workers=nw, epoch=epoch, j=j, sources=sources)

    def epochs_started(self, state: Mapping[str, Any] | MixState, num_workers: int) -> int:
        """Mix epochs the interrupted run finished ("stop"; 0 with "cycle").

        Prefer ``for epoch in loader.epochs(n)`` (:meth:`next_epoch` counts for you)."""
        if self.infinite:
            return 0
        st = MixState.from_dict(state)
        last = max(e for _, _, e, _ in st.mix)
        done = self._state_level(st).epoch_end(last)
        return last + 1 if all(e == last and j >= done for _, _, e, j in st.mix) else last
