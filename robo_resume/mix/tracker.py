"""MixTracker: records, in the main process, what the training loop consumed from a mix."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from ..errors import ResumeStateError, describe
from ..index.start import StartPoint
from ..keys import CURSOR_KEY, SKIPPED_KEY
from ..state.mix import MixState
from ..state.resume import ResumeState
from ..tracker import CursorTracker, TrackedDataset, check_batch_origin
from .levels import MixLevel
from .resume import MixPositions
from .source import MIX_KEY


class TrackedMix(Protocol):
    """What a :class:`MixTracker` needs of the mix whose batches it records.

    A :class:`~robo_resume.mix.MixedDataset`, which builds on this module (so a protocol, not
    an import). The tracker only reads these members, in the main process; they must be the
    ones the mix's streams use, or the positions it records do not describe what they emitted.
    """

    @property
    def rank(self) -> int:
        """This process's rank (batches of another rank are refused)."""
        ...

    @property
    def world_size(self) -> int:
        """The number of ranks (above 1, states are gathered over them)."""
        ...

    @property
    def datasets(self) -> Sequence[TrackedDataset]:
        """The sources' datasets, in source order (one :class:`CursorTracker` each)."""
        ...

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a mix state of this mix must match (copied into the state)."""
        ...

    @property
    def resume_state(self) -> MixState | None:
        """The mix state the mix resumes from, or None."""
        ...

    @property
    def positions(self) -> MixPositions:
        """The mix's resume arithmetic (whether a topology is an elastic resume)."""
        ...

    def level(self, num_workers: int) -> MixLevel:
        """The mix arithmetic with ``num_workers`` workers (its source start points)."""
        ...

    def start_point(self, num_workers: int) -> StartPoint:
        """Where the rank's mix streams start: per role ``(epoch, j, source cursors)``."""
        ...

    def source_name(self, i: int) -> str:
        """How messages name source ``i``."""
        ...


class MixTracker:
    """Records, in the main process, what the training loop consumed from a mix.

    One :class:`~robo_resume.tracker.CursorTracker` per source records that source's frame
    cursors, checks its batches and keeps its skip records (``on_error="skip"``); this class
    adds each role's mix position. :meth:`consume` returns the batch without the cursor keys;
    :meth:`state_dict` is the JSON-safe :class:`MixState` to put into the checkpoint (a
    collective under DDP: every rank must call it).

    Args:
        mix: the :class:`~robo_resume.mix.MixedDataset` whose batches this tracker records
            (:meth:`MixedDataset.tracker` makes one).
    """

    def __init__(self, mix: TrackedMix) -> None:
        self.mix = mix
        self.num_workers: int | None = None
        self.positions: dict[int, tuple[int, int]] = {}
        self.trackers = [CursorTracker(ds) for ds in mix.datasets]
        self.batches = 0
        self.last_source: int | None = None

    def _init(self, num_workers: int) -> None:
        _, starts, batches = self.mix.start_point(num_workers)
        self.num_workers = num_workers
        self.positions = {r: (e, j) for r, (e, j, _) in enumerate(starts)}
        prev = None if self.mix.positions.elastic(num_workers) else self.mix.resume_state
        for i, t in enumerate(self.trackers):
            cursors = {r: tuple(s[2][i]) for r, s in enumerate(starts)}
            t.start(num_workers, cursors, prev.sources[i].batches if prev else 0)
        self.batches = batches

    def update(self, batch: Mapping[str, Any]) -> None:
        """Record a batch the training loop consumed.

        Args:
            batch: a batch of the mix's DataLoader, with its ``MIX_KEY`` and ``CURSOR_KEY``.

        Raises:
            ValueError: the batch carries no mix cursor, comes from another rank or
                ``num_workers`` than earlier batches, or fails its source's checks
                (:meth:`CursorTracker.update`).
        """
        m = batch.get(MIX_KEY) if isinstance(batch, Mapping) else None
        if not isinstance(m, torch.Tensor) or m.shape != (6,):
            raise ValueError(
                describe(
                    "The batch carries no mix cursor",
                    expected=f"batch['{MIX_KEY}'] of shape (6,) and batch['{CURSOR_KEY}']",
                    found=None if m is None else getattr(m, "shape", type(m).__name__),
                    fix="pass batches of MixedDataset.dataloader() unchanged to consume()",
                )
            )
        rank, role, num_workers, epoch, j, i = (int(x) for x in m)
        check_batch_origin(self.mix.rank, rank, self.num_workers, num_workers)
        if self.num_workers is None:
            self._init(num_workers)
        self.trackers[i].update(batch)  # the source's cursor, batch checks and skip records
        self.positions[role] = (epoch, j)
        self.batches += 1
        self.last_source = i

    def consume(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`update`, then the batch without the cursor keys and skip records.

        With ``on_error="skip"`` a batch can hold fewer frames than ``batch_size``, even
        none: skip such a batch in the training step.

        Args:
            batch: a batch of the mix's DataLoader.

        Returns:
            A new dict: the batch without ``MIX_KEY``, ``CURSOR_KEY`` and ``SKIPPED_KEY``.

        Raises:
            ValueError: as :meth:`update`.
        """
        self.update(batch)
        return {k: v for k, v in batch.items() if k not in (MIX_KEY, CURSOR_KEY, SKIPPED_KEY)}

    @property
    def skipped(self) -> tuple[dict[str, Any], ...]:
        """Chunks skipped with ``on_error="skip"`` (see ``CursorTracker.skipped``).

        Each record holds the ``source`` it belongs to; saved per source in :meth:`state_dict`.
        """
        return tuple({"source": i, **r} for i, t in enumerate(self.trackers) for r in t.skipped)

    def skip_report(self) -> str:
        """A human-readable summary of :attr:`skipped`, per source.

        Returns:
            Each source's :meth:`CursorTracker.skip_report`, or a line saying none was skipped.
        """
        if not any(t.skipped for t in self.trackers):
            return "robo_resume: no chunk skipped"
        return "\n".join(
            f"source {i} ({self.mix.source_name(i)}): {t.skip_report()}"
            for i, t in enumerate(self.trackers)
            if t.skipped
        )

    def state(self, *, gather: bool = True) -> MixState:
        """The mix state of what the training loop consumed.

        Args:
            gather: under initialised DDP, gather and merge all ranks' positions (a
                collective: every rank must call it).

        Returns:
            The :class:`MixState` (all ranks' positions when DDP is initialised and
            ``gather``).

        Raises:
            ResumeStateError: no batch was consumed yet.
        """
        if self.num_workers is None:
            raise ResumeStateError(
                describe(
                    "The mix tracker has not seen a batch yet",
                    expected="at least one consume(batch) before state_dict()",
                    found="no batch",
                )
            )
        mix, rank = self.mix, self.mix.rank
        local = MixState(
            fingerprint=mix.fingerprint,
            world_size=mix.world_size,
            num_workers=self.num_workers,
            batches=self.batches,
            mix=tuple((rank, r, e, j) for r, (e, j) in sorted(self.positions.items())),
            sources=tuple(t.state(gather=False, settle=False) for t in self.trackers),
            source_starts=mix.level(self.num_workers).starts,
        )
        if gather and mix.world_size > 1:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                parts: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(parts, local.to_dict())
                states = [MixState.from_dict(p) for p in parts]
                return dataclasses.replace(
                    local,
                    batches=max(s.batches for s in states),
                    mix=tuple(sorted(m for s in states for m in s.mix)),
                    sources=tuple(
                        _merge([s.sources[i] for s in states]) for i in range(len(mix.datasets))
                    ),
                )
        return local

    def state_dict(self, *, gather: bool = True) -> dict[str, Any]:
        """The JSON-safe mix state (see :meth:`state`).

        Args:
            gather: as for :meth:`state` (a collective under DDP).

        Returns:
            :meth:`MixState.to_dict` of :meth:`state`.

        Raises:
            ResumeStateError: no batch was consumed yet.
        """
        return self.state(gather=gather).to_dict()


def _merge(states: list[ResumeState]) -> ResumeState:
    out = states[0]
    for s in states[1:]:
        out = out.merged(s)
    return out
