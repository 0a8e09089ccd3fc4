"""The state of a :class:`robo_resume.mix.MixedDataset`: one position per mix stream, and each
source's own dataset state nested inside.

Same format as a single dataset's state (``format`` ``robo_resume.state``, :data:`STATE_VERSION`),
with ``kind`` ``"mix"``; its ``sources`` are complete dataset states (kind ``"dataset"``), as a
weighted sampler's state nests its children's. A mix state of the format before version 4
(``format`` ``robo_resume.mix_state``, its own ``version`` 1) is migrated on load, with one INFO
line; the frames it resumes are the same.

The checks take the mix duck-typed (its ``fingerprint``, ``datasets``, ``rank``, ``world_size``,
``infinite``, ``sources``, ``batch_size``, ``epoch_batches`` and ``counts_before``), so this
module imports nothing above the state layer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ResumeStateError, describe
from ..index.schedule import Topology, worker_batches_done
from .resume import (
    KIND_MIX,
    OLD_MIX_FORMAT,
    STATE_FORMAT,
    STATE_VERSION,
    ResumeState,
    library_version,
)

if TYPE_CHECKING:  # annotations only
    from ..mix import MixedDataset

__all__ = ["OLD_MIX_VERSION", "MixState"]

logger = logging.getLogger("robo_resume")

OLD_MIX_VERSION = 1
"""The ``version`` of the last mix state format of its own (``robo_resume.mix_state``)."""


def _migrate(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A ``robo_resume.mix_state`` version 1 dict as a version 4 mix state, or a refusal."""
    version = data.get("version")
    if version != OLD_MIX_VERSION or isinstance(version, bool):
        raise ResumeStateError(
            describe(
                "Unsupported mix state version",
                expected=f"{OLD_MIX_FORMAT!r} version {OLD_MIX_VERSION}, or {STATE_FORMAT!r} "
                f"version {STATE_VERSION}",
                found=f"{OLD_MIX_FORMAT!r} version {version!r}",
                fix="resume with the robo_resume version that wrote the state",
            )
        )
    logger.info(
        "resume: migrated a mix state from format %r version %d to %r version %d (the frames "
        "are the same)",
        OLD_MIX_FORMAT,
        OLD_MIX_VERSION,
        STATE_FORMAT,
        STATE_VERSION,
    )
    return {**data, "format": STATE_FORMAT, "version": STATE_VERSION, "kind": KIND_MIX}


@dataclass(frozen=True)
class MixState:
    """Where a mix stands: each role's mix position and each source's own resume state.

    Attributes:
        fingerprint: :attr:`MixedDataset.fingerprint` of the run that made it.
        world_size, num_workers, batches: topology and batches this rank consumed.
        mix: ``(rank, role, epoch, j)`` per mix stream: ``j`` batches of ``epoch`` consumed.
        sources: one :class:`ResumeState` per source (its streams' frame cursors).
    """

    fingerprint: Mapping[str, Any]
    world_size: int
    num_workers: int
    batches: int
    mix: tuple[tuple[int, int, int, int], ...]
    sources: tuple[ResumeState, ...]
    library_version: str = field(default_factory=library_version)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (same keys at every step)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "kind": KIND_MIX,
            "library_version": self.library_version,
            "fingerprint": dict(self.fingerprint),
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batches": self.batches,
            "mix": [list(m) for m in sorted(self.mix)],
            "sources": [s.to_dict() for s in self.sources],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | MixState) -> MixState:
        """Parse and validate a :meth:`to_dict` value."""
        if isinstance(data, MixState):
            return data
        if isinstance(data, Mapping) and data.get("format") == STATE_FORMAT:
            if data.get("kind") != KIND_MIX:
                raise ResumeStateError(
                    describe(
                        "This is the state of one dataset, not of a MixedDataset",
                        expected="a mix state (kind 'mix', from MixTracker.state_dict())",
                        found=f"kind {data.get('kind', 'dataset')!r} (from CursorTracker."
                        "state_dict() of a ChunkedEpisodeDataset)",
                        fix="resume the ChunkedEpisodeDataset it was saved from with it",
                    )
                )
            if data.get("version") != STATE_VERSION or isinstance(data.get("version"), bool):
                raise ResumeStateError(
                    describe(
                        "Unsupported mix state version",
                        expected=f"version {STATE_VERSION} (or a mix_state of version "
                        f"{OLD_MIX_VERSION})",
                        found=f"version {data.get('version')!r}",
                        fix="resume with the robo_resume version that wrote the state",
                    )
                )
        elif isinstance(data, Mapping) and data.get("format") == OLD_MIX_FORMAT:
            data = _migrate(data)
        else:
            raise ResumeStateError(
                describe(
                    "This is not a robo_resume mix state",
                    expected=f"a dict with format={STATE_FORMAT!r} and kind={KIND_MIX!r} "
                    "(from MixTracker.state_dict())",
                    found=repr(data)[:120],
                    fix="pass the value saved from the MixTracker of a MixedDataset (a single "
                    "dataset's state resumes a ChunkedEpisodeDataset)",
                )
            )
        try:
            mix = tuple(tuple(int(x) for x in m) for m in data["mix"])
            if any(len(m) != 4 or min(m) < 0 for m in mix):
                raise ValueError(mix)
            return cls(
                fingerprint=dict(data["fingerprint"]),
                world_size=int(data["world_size"]),
                num_workers=int(data["num_workers"]),
                batches=int(data["batches"]),
                mix=mix,
                sources=tuple(ResumeState.from_dict(s) for s in data["sources"]),
                library_version=str(data.get("library_version", "unknown")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ResumeStateError):
                raise
            raise ResumeStateError(
                describe(
                    "The mix state is malformed",
                    expected="the unmodified dict from MixTracker.state_dict()",
                    found=f"{type(exc).__name__}: {exc}"[:160],
                )
            ) from exc

    def check(self, mix: MixedDataset, *, strict: bool = True) -> None:
        """Refuse a state made for another mix (weights, sources, ...) or source options."""
        first = ("weights", "sources", "keys", "exhausted", "seed")  # the likely causes first
        keys = sorted(set(mix.fingerprint) | set(self.fingerprint))
        for key in [k for k in first if k in keys] + [k for k in keys if k not in first]:
            want, got = mix.fingerprint.get(key), self.fingerprint.get(key)
            if want != got:
                fix = {
                    "weights": "resume with the weights the run was saved with; the mix position "
                    "says how many batches each source gave under those weights, so other "
                    "weights would replay or skip frames. To change the mix, start a new run",
                    "period": "pass the same period (or weights) as the run that saved the state",
                    "sources": "pass the same sources, in the same order",
                    "keys": "pass the same key mappings as the run that saved the state",
                }.get(key, f"pass the same {key} as the run that saved the state")
                raise ResumeStateError(
                    describe(
                        f"The mix resume state was made with different '{key}'",
                        expected=f"{key}={want!r} (this mix)",
                        found=f"{key}={got!r} (the state)",
                        fix=fix,
                    )
                )
        if len(self.sources) != len(mix.datasets):
            raise ResumeStateError(describe("Mix state of another number of sources"))
        for st, ds in zip(self.sources, mix.datasets, strict=True):
            st.check_fingerprint(ds.fingerprint, strict=strict)

    def start_point(self, mix: MixedDataset, num_workers: int):
        """See :meth:`MixedDataset.start_point`; checks the cursors against the arithmetic."""
        if (self.world_size, self.num_workers) != (mix.world_size, num_workers):
            raise ResumeStateError(
                describe(
                    "The mix resume state was recorded with a different topology",
                    expected=f"world_size={mix.world_size}, num_workers={num_workers} (this run)",
                    found=f"world_size={self.world_size}, num_workers={self.num_workers}",
                    fix="resume with the same number of ranks and DataLoader workers",
                )
            )
        wp = max(num_workers, 1)
        mine = {role: (e, j) for rank, role, e, j in self.mix if rank == mix.rank}
        if sorted(mine) != list(range(wp)):
            raise ResumeStateError(
                describe(
                    "The mix state lacks positions of this rank's streams",
                    expected=f"roles 0..{wp - 1} of rank {mix.rank}",
                    found=sorted(mine),
                )
            )
        cur = [mine[r] for r in range(wp)]
        if not mix.infinite:
            last = max(e for e, _ in cur)
            done = mix.epoch_batches(last - 1, num_workers) if last else None
            cur = [(last, 0) if e == last - 1 and j >= (done or 0) else (e, j) for e, j in cur]
            if len({e for e, _ in cur}) != 1:
                raise ResumeStateError(describe("Mix streams stand in different epochs", found=cur))
            if all(j >= mix.epoch_batches(last, num_workers) for _, j in cur):
                n = len(mix.sources)
                return 0, [(last + 1, 0, [(last + 1, 0)] * n) for _ in range(wp)], self.batches
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
        topo = Topology(mix.world_size, num_workers)
        starts = []
        for role, (e, j) in enumerate(cur):
            counts = mix.counts_before(e, topo.stream_id(mix.rank, role), j)
            positions = []
            for i, (st, ds) in enumerate(zip(self.sources, mix.datasets, strict=True)):
                c = {x.role: x for x in st.cursors if x.rank == mix.rank}.get(role)
                q = ds.schedule(num_workers).frames_per_stream
                want = int(counts[i]) * mix.batch_size
                if mix.infinite:
                    ok = c is not None and c.epoch * q + c.position == want
                    pos = (c.epoch, c.position) if c is not None else (0, 0)
                elif want == 0:
                    ok, pos = c is None or (c.epoch, c.position) <= (e, 0), (e, 0)
                else:
                    ok = c is not None and (c.epoch, c.position) == (e, min(want, q))
                    pos = (e, min(want, q))
                if not ok:
                    raise ResumeStateError(
                        describe(
                            f"Source {i}'s cursor does not match the mix position",
                            expected=f"role {role}: {want} frames of source {i} consumed at mix "
                            f"position (epoch {e}, batch {j})",
                            found=None if c is None else f"epoch {c.epoch}, position {c.position}",
                            fix="pass the unmodified state from MixTracker.state_dict()",
                        )
                    )
                positions.append(pos)
            starts.append((e, j, positions))
        return total % wp, starts, self.batches
