"""Where each mix stream and each source stands in a mix epoch: the arithmetic of a resumed mix.

:class:`MixLevel` is one run's topology over the mix order; a resume (same or other topology)
asks it where the streams start and how far each source got.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ResumeStateError, describe
from ..index.elastic import Layout
from ..index.schedule import Topology
from ..index.start import worker_batches_done
from ..state.mix import MixState
from .order import MixOrder


@dataclass(eq=False)
class MixLevel:
    """The mix arithmetic of one run, over the mix ``order``: its topology, batch size, and per
    source the layout of its streams (:class:`~robo_resume.index.elastic.Layout`: a remainder
    epoch after an elastic resume) and the epoch its streams started the run in (``starts``; a
    source has nothing in earlier epochs). Pure: no I/O."""

    order: MixOrder
    topology: Topology
    batch_size: int
    layouts: tuple[Layout, ...]
    starts: tuple[int, ...]
    _ends: dict[int, int] = field(default_factory=dict)

    def length(self, i: int, epoch: int, g: int) -> int:
        """Frames source ``i``'s stream ``g`` has in ``epoch``."""
        return 0 if epoch < self.starts[i] else self.layouts[i].length(epoch, g)

    def epoch_end(self, epoch: int) -> int | None:
        """``J`` of ``epoch`` ("stop"): the smallest mix position, over every stream of every
        rank, at which a source would need a batch past its stream-epoch. None with "cycle"."""
        return None if self.order.infinite else self.stop_end(epoch)

    def stop_end(self, epoch: int) -> int:
        """:meth:`epoch_end` of a mix that stops (``exhausted="stop"``; callers check)."""
        mix = self.order
        if epoch not in self._ends:
            best: int | None = None
            for g in range(self.topology.num_streams):
                for i, c in enumerate(mix.counts.tolist()):
                    if c == 0:
                        continue
                    n = -(-self.length(i, epoch, g) // self.batch_size)
                    r, k = divmod(n, c)
                    first = np.flatnonzero(mix.round_sources(epoch, g, r) == i)[k]
                    at = r * mix.period + int(first)
                    best = at if best is None else min(best, at)
            assert best is not None  # a mix has a source with a nonzero count
            self._ends[epoch] = best
        return self._ends[epoch]

    def positions(
        self, state: MixState, *, ranks: Sequence[int] | None
    ) -> tuple[dict[int, tuple[int, int]], int | None]:
        """Stream id -> ``(epoch, j)`` of ``state`` (of ``ranks``; None: every rank it has), and
        the epoch to start when every stream has finished its mix epoch ("stop"), else None.

        "stop": a stream that finished epoch ``e - 1`` before its first batch of ``e`` stands
        at ``(e, 0)``; streams in other epochs are refused.
        """
        topo, wp = self.topology, self.topology.workers_per_rank
        have = {
            topo.stream_id(r, role): (e, j)
            for r, role, e, j in state.mix
            if ranks is None or r in ranks
        }
        for r in ranks or ():
            roles = sorted(g - r * wp for g in have if g // wp == r)
            if roles != list(range(wp)):
                raise ResumeStateError(
                    describe(
                        "The mix state lacks positions of this rank's streams",
                        expected=f"roles 0..{wp - 1} of rank {r}",
                        found=roles,
                        fix="save the state with MixTracker.state_dict() (it gathers all ranks)",
                    )
                )
        if self.order.infinite or not have:
            return have, None
        last = max(e for e, _ in have.values())
        for g, (e, j) in have.items():
            if e == last - 1 and j >= self.stop_end(e):
                have[g] = (last, 0)
            elif e != last:
                raise ResumeStateError(
                    describe(
                        "Mix streams stand in different epochs",
                        expected=f"every stream in epoch {last} (or at the end of {last - 1})",
                        found=sorted(have.items()),
                        fix="pass the unmodified dict from MixTracker.state_dict()",
                    )
                )
        if all(j >= self.stop_end(last) for _, j in have.values()):
            return {g: (last + 1, 0) for g in have}, last + 1
        return have, None

    def source_positions(
        self, epoch: int, g: int, j: int, recorded: Sequence[Any], *, role: int
    ) -> list[tuple[int, int]]:
        """Where each source's stream ``g`` stands after ``j`` batches of mix ``epoch``, checked
        against ``recorded`` (each source's cursor of that stream, or None).

        Source ``i`` gave the stream ``counts_before(epoch, g, j)[i]`` batches of
        ``batch_size`` frames since its start ("cycle": from ``(starts[i], 0)``, whatever the
        source's epochs; "stop": from ``(epoch, 0)``, a short last batch at the stream-epoch's
        end). A recorded cursor that disagrees is refused.
        """
        counts = self.order.counts_before(epoch, g, j)
        out = []
        for i, c in enumerate(recorded):
            want = int(counts[i]) * self.batch_size
            lay = self.layouts[i]
            if self.order.infinite:
                s = self.starts[i]
                if c is None:
                    ok, pos = want == 0, (s, 0)
                else:
                    pos = (c.epoch, c.position)
                    ok = (c.epoch, c.position) >= (s, 0) and lay.frames_done(
                        c.epoch, g, c.position
                    ) - lay.frames_done(s, g, 0) == want
            elif want == 0:
                ok, pos = c is None or (c.epoch, c.position) <= (epoch, 0), (epoch, 0)
            else:
                pos = (epoch, min(want, self.length(i, epoch, g)))
                ok = c is not None and (c.epoch, c.position) == pos
            if not ok:
                raise ResumeStateError(
                    describe(
                        f"Source {i}'s cursor does not match the mix position",
                        expected=f"role {role}: {want} frames of source {i} consumed at mix "
                        f"position (epoch {epoch}, batch {j})",
                        found=None if c is None else f"epoch {c.epoch}, position {c.position}",
                        fix="pass the unmodified state from MixTracker.state_dict()",
                    )
                )
            out.append(pos)
        return out

    def step_start(self, rank: int, batches: int):
        """:meth:`MixedDataset.start_point` after ``batches`` batches of this rank's loader
        (``resume_step // batch_size``), counted from the start of the run: the DataLoader's
        round-robin per mix epoch ("stop": each epoch yields ``J * W`` batches; found by
        summing the epochs, so the cost grows with the epoch, not with the batch)."""
        mix, topo = self.order, self.topology
        wp = topo.workers_per_rank
        epoch, rem = 0, batches
        while not mix.infinite:
            per = self.stop_end(epoch) * wp
            if per == 0:
                raise ResumeStateError(
                    describe(
                        "resume_step cannot be placed: a mix epoch of this topology is empty",
                        found=f"epoch {epoch} yields no batch",
                        fix="resume from MixTracker.state_dict() instead",
                    )
                )
            if rem < per:
                break
            rem, epoch = rem - per, epoch + 1
        starts = []
        for role in range(wp):
            j = worker_batches_done(rem, topo.num_workers, role)
            g = topo.stream_id(rank, role)
            counts = mix.counts_before(epoch, g, j)
            pos = []
            for i, c in enumerate(counts.tolist()):
                f = c * self.batch_size
                if mix.infinite:
                    pos.append(divmod(f, self.layouts[i].length(0, g)))
                else:
                    pos.append((epoch, min(f, self.length(i, epoch, g))))
            starts.append((epoch, j, pos))
        return rem % wp, starts, batches
