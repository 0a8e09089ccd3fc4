"""CursorTracker: records, in the main process, what the training loop has really consumed.

Every item of a :class:`~robo_resume.dataset.ChunkedEpisodeDataset` carries a cursor
``[rank, role, num_workers, epoch, position]``. Pass each batch through
:meth:`CursorTracker.consume`: it keeps the newest cursor of each stream, counts batches, and
returns the batch without the cursor key (so models see exactly lerobot's keys). Prefetched
batches that never reached the loop are not recorded, so the saved state never skips them.

After an elastic resume (:mod:`robo_resume.index.elastic`) the cursors of the first epoch count
frames of the *remainder epoch*; the state then carries the chain it is recomputed from, until
(in epoch mode) every stream has finished that epoch. ``batches`` counts from the elastic
resume (the new topology's own count).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from .errors import ResumeStateError, describe
from .index.elastic import Layout, Level
from .index.schedule import Topology
from .index.start import StartPoint
from .keys import CURSOR_KEY, SKIPPED_KEY
from .state.resume import ResumeState, StreamCursor

__all__ = ["CursorTracker", "check_batch_origin"]

logger = logging.getLogger("robo_resume")


class TrackedDataset(Protocol):
    """What a :class:`CursorTracker` needs of the dataset whose batches it records.

    A :class:`~robo_resume.dataset.ChunkedEpisodeDataset`, which builds on this module (so a
    protocol, not an import). The tracker only reads these members, in the main process; the
    values must be the ones the dataset's streams use (same topology, batch size and
    schedule), or the cursors it records do not describe what the streams emitted.
    """

    @property
    def rank(self) -> int:
        """This process's rank (batches of another rank are refused)."""
        ...

    @property
    def world_size(self) -> int:
        """The number of ranks (stream ids and, above 1, the gathering of states)."""
        ...

    @property
    def batch_size(self) -> int:
        """The batch size every batch has (a smaller last one only at an epoch end)."""
        ...

    @property
    def infinite(self) -> bool:
        """True: one endless iteration over consecutive epochs (no epoch end)."""
        ...

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this dataset must match (copied into the state)."""
        ...

    @property
    def resume_state(self) -> ResumeState | None:
        """The state the dataset resumes from (its skip records are carried over), or None."""
        ...

    def layout(self, num_workers: int) -> Layout:
        """What the rank's streams emit per epoch with ``num_workers`` workers."""
        ...

    def elastic_origin(self, num_workers: int) -> tuple[int | None, tuple[Level, ...]]:
        """``(remainder epoch label, origin levels)``; ``(None, ())`` without an elastic resume."""
        ...

    def start_point(self, num_workers: int) -> StartPoint:
        """Where the rank's streams start: ``(rotation, (epoch, position) per role, batches)``."""
        ...


class CursorTracker:
    """Newest consumed cursor per stream of one rank, and the batch count.

    ``state_dict()`` returns a JSON-safe :class:`ResumeState` dict; give it to
    ``ChunkedEpisodeDataset(..., resume_state=...)`` to continue exactly. Under DDP,
    ``state_dict()`` is a collective: every rank must call it (it gathers all ranks' cursors).

    Args:
        dataset: the :class:`~robo_resume.dataset.ChunkedEpisodeDataset` whose batches this
            tracker records (:meth:`ChunkedEpisodeDataset.tracker` makes one); the skips of
            its resume state are carried over.
    """

    def __init__(self, dataset: TrackedDataset) -> None:
        self.dataset = dataset
        self.key = CURSOR_KEY
        self.num_workers: int | None = None
        self.cursors: dict[int, tuple[int, int]] = {}
        self.batches = 0
        # chunks skipped with on_error="skip" (from the resume state, then from batches)
        state = dataset.resume_state
        self._skipped: list[dict[str, Any]] = [dict(r) for r in getattr(state, "skipped", ())]

    def _init(self, num_workers: int) -> None:
        _, starts, batches = self.dataset.start_point(num_workers)
        self.start(num_workers, dict(enumerate(starts)), batches)

    def start(self, num_workers: int, cursors: Mapping[int, tuple[int, int]], batches: int) -> None:
        """Start recording from given cursors instead of the dataset's own start point.

        For a caller that decides itself where the dataset's streams start (a
        :class:`~robo_resume.mix.MixedDataset` for each of its sources); call it before the
        first :meth:`update`.

        Args:
            num_workers: the DataLoader's workers.
            cursors: role -> ``(epoch, position)`` where each stream starts.
            batches: the batch count to start from.
        """
        self.num_workers = num_workers
        self.cursors = dict(cursors)
        self.batches = batches

    def update(self, batch: Mapping[str, Any]) -> None:
        """Record the cursor of a batch the training loop consumed.

        Args:
            batch: a batch of the dataset's DataLoader, with its ``CURSOR_KEY``.

        Raises:
            ValueError: the batch carries no cursor, mixes frames of several streams, comes
                from another rank or ``num_workers`` than earlier batches, or has another
                batch size than the dataset's.
        """
        cur = batch.get(self.key) if isinstance(batch, Mapping) else None
        if not isinstance(cur, torch.Tensor) or cur.ndim != 2 or cur.shape[1] != 5:
            raise ValueError(
                describe(
                    "The batch carries no robo_resume cursor",
                    expected=f"batch['{self.key}'] of shape (batch, 5)",
                    found=None if cur is None else getattr(cur, "shape", type(cur).__name__),
                    fix="pass batches of a ChunkedEpisodeDataset DataLoader with the default "
                    "collate, before removing keys",
                )
            )
        head = cur[:, :3]  # rank, role, workers (the epoch may change inside an infinite batch)
        if not bool((head == head[0]).all()):
            raise ValueError(
                describe(
                    "A batch mixes frames of several streams",
                    expected="every row of one batch from one worker",
                    found=torch.unique(head, dim=0).tolist(),
                    fix="do not re-batch or mix ChunkedEpisodeDataset batches before consume()",
                )
            )
        rank, role, num_workers = (int(x) for x in head[0])
        epoch = int(cur[-1, 3])
        check_batch_origin(self.dataset.rank, rank, self.num_workers, num_workers)
        if self.num_workers is None:
            self._init(num_workers)
        position = int(cur[-1, 4])
        n = cur.shape[0]
        stream = Topology(self.dataset.world_size, num_workers).stream_id(rank, role)
        q = self.dataset.layout(num_workers).length(epoch, stream)  # a remainder epoch differs
        b = self.dataset.batch_size
        if n != b and not (self.dataset.infinite is False and position == q and n < b):
            raise ValueError(
                describe(
                    "The DataLoader's batch size differs from the dataset's",
                    expected=f"batches of {b} (a smaller last batch only at an epoch end)",
                    found=f"a batch of {n} ending at position {position} of {q}",
                    fix="build the loader with dataset.dataloader(...) or pass "
                    "batch_size=dataset.batch_size and drop_last=dataset.drop_last",
                )
            )
        self.cursors[role] = (epoch, position)
        self.batches += 1
        self._record_skips(batch)

    def _record_skips(self, batch: Mapping[str, Any]) -> None:
        for r in batch.get(SKIPPED_KEY) or ():
            r = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in r.items()}
            self._skipped.append(r)  # logged by the loader (robo_resume.state.skips), not here

    @property
    def skipped(self) -> tuple[dict[str, Any], ...]:
        """Chunks skipped with ``on_error="skip"`` that the training loop got past.

        One dict per skipped chunk (per epoch it was skipped in): ``epoch``, ``chunk``,
        ``episode``, frames ``frame`` .. ``stop - 1`` skipped (``start`` is where the chunk's
        segment began), the stream (``rank``, ``role``), the ``file`` named by the error and
        the ``error`` text. Includes the skips the resume state carried; saved in
        :meth:`state_dict`.
        """
        return tuple(self._skipped)

    def skip_report(self) -> str:
        """A human-readable summary of :attr:`skipped`.

        Returns:
            A header line and one line per skipped chunk, or a line saying none was skipped.
        """
        if not self._skipped:
            return "robo_resume: no chunk skipped"
        frames = sum(r["stop"] - r["frame"] for r in self._skipped)
        episodes = sorted({r["episode"] for r in self._skipped})
        lines = [
            f"robo_resume: {len(self._skipped)} chunk(s) skipped ({frames} frames) in "
            f"episodes {episodes}:"
        ]
        for r in self._skipped:
            lines.append(
                f"  epoch {r['epoch']} episode {r['episode']} frames {r['frame']}..{r['stop'] - 1}"
                f" (chunk {r['chunk']}): {r['file']}: {r['error']}"
            )
        return "\n".join(lines)

    def consume(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`update`, then return the batch without the cursor key (and skip records).

        With ``on_error="skip"`` a batch can hold fewer frames than ``batch_size``, even
        none (``len(batch["index"]) == 0``): skip such a batch in the training step.

        Args:
            batch: a batch of the dataset's DataLoader, with its ``CURSOR_KEY``.

        Returns:
            A new dict: the batch without ``CURSOR_KEY`` and ``SKIPPED_KEY``.

        Raises:
            ValueError: as :meth:`update`.
        """
        self.update(batch)
        return {k: v for k, v in batch.items() if k != self.key and k != SKIPPED_KEY}

    @property
    def resume_step(self) -> int:
        """``batches * batch_size``: the arithmetic resume position of this rank."""
        return self.batches * self.dataset.batch_size

    def state(self, *, gather: bool = True, settle: bool = True) -> ResumeState:
        """The resume state of what the training loop consumed.

        Args:
            gather: under initialised DDP, gather and merge all ranks' cursors (a collective:
                every rank must call it).
            settle: (epoch mode) once every stream of this rank has finished a remainder
                epoch, write the cursors as the next epoch's start and drop the elastic chain.
                A mix passes False: its sources' streams do not finish their epochs together,
                and the ranks' states must keep one chain to merge.

        Returns:
            The :class:`ResumeState` (all ranks' cursors when DDP is initialised and
            ``gather``).

        Raises:
            ResumeStateError: no batch was consumed yet.
        """
        if self.num_workers is None:
            raise ResumeStateError(
                describe(
                    "The tracker has not seen a batch yet",
                    expected="at least one consume(batch) before state_dict()",
                    found="no batch",
                    fix="save the state after the first step, or use resume_step=0",
                )
            )
        label, origin = self.dataset.elastic_origin(self.num_workers)
        cursors = dict(self.cursors)
        if label is not None and not self.dataset.infinite and settle:
            # Epoch mode: once every stream has finished the remainder epoch, (label, its
            # length) is (label + 1, 0) and the state no longer needs the elastic chain.
            layout = self.dataset.layout(self.num_workers)
            topo = Topology(self.dataset.world_size, self.num_workers)
            ids = {r: topo.stream_id(self.dataset.rank, r) for r in cursors}
            if all(e > label or p >= layout.length(e, ids[r]) for r, (e, p) in cursors.items()):
                cursors = {r: (e + 1, 0) if e == label else (e, p) for r, (e, p) in cursors.items()}
                label, origin = None, ()
        local = ResumeState(
            fingerprint=self.dataset.fingerprint,
            world_size=self.dataset.world_size,
            num_workers=self.num_workers,
            batches=self.batches,
            cursors=tuple(
                StreamCursor(self.dataset.rank, role, e, p)
                for role, (e, p) in sorted(cursors.items())
            ),
            skipped=tuple(self._skipped),
            elastic_epoch=label,
            origin=origin,
        )
        if gather and self.dataset.world_size > 1:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                parts: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(parts, local.to_dict())
                merged = ResumeState.from_dict(parts[0])
                for p in parts[1:]:
                    merged = merged.merged(ResumeState.from_dict(p))
                return merged
        return local

    def state_dict(self, *, gather: bool = True) -> dict[str, Any]:
        """The JSON-safe resume state (see :meth:`state`).

        Args:
            gather: as for :meth:`state` (a collective under DDP).

        Returns:
            :meth:`ResumeState.to_dict` of :meth:`state`.

        Raises:
            ResumeStateError: no batch was consumed yet.
        """
        return self.state(gather=gather).to_dict()


def check_batch_origin(
    expected_rank: int, rank: int, known_workers: int | None, num_workers: int
) -> None:
    """Refuse a batch of another rank, or of a DataLoader of other ``num_workers``.

    ``known_workers`` is the ``num_workers`` of the first batch a tracker saw (None: no batch
    yet). Shared by :class:`CursorTracker` and :class:`robo_resume.mix.MixTracker`; raises
    ValueError.
    """
    if rank != expected_rank:
        raise ValueError(describe("A batch from another rank", expected=expected_rank, found=rank))
    if known_workers is not None and num_workers != known_workers:
        raise ValueError(
            describe(
                "Batches from DataLoaders with different num_workers reached one tracker",
                expected=f"num_workers={known_workers}",
                found=f"num_workers={num_workers}",
                fix="use one tracker per DataLoader configuration",
            )
        )
