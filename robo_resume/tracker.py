"""CursorTracker: records, in the main process, what the training loop has really consumed.

Every item of a :class:`~robo_resume.dataset.ChunkedEpisodeDataset` carries a cursor
``[rank, role, num_workers, epoch, position]``. Pass each batch through
:meth:`CursorTracker.consume`: it keeps the newest cursor of each stream, counts batches, and
returns the batch without the cursor key (so models see exactly lerobot's keys). Prefetched
batches that never reached the loop are not recorded, so the saved state never skips them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .errors import ResumeStateError, describe
from .state import ResumeState, StreamCursor

if TYPE_CHECKING:
    from .dataset import ChunkedEpisodeDataset

__all__ = ["CursorTracker"]


class CursorTracker:
    """Newest consumed cursor per stream of one rank, and the batch count.

    ``state_dict()`` returns a JSON-safe :class:`ResumeState` dict; give it to
    ``ChunkedEpisodeDataset(..., resume_state=...)`` to continue exactly. Under DDP,
    ``state_dict()`` is a collective: every rank must call it (it gathers all ranks' cursors).
    """

    def __init__(self, dataset: ChunkedEpisodeDataset) -> None:
        from .dataset import CURSOR_KEY

        self.dataset = dataset
        self.key = CURSOR_KEY
        self.num_workers: int | None = None
        self.cursors: dict[int, tuple[int, int]] = {}
        self.batches = 0

    def _init(self, num_workers: int) -> None:
        _, starts, batches = self.dataset.start_point(num_workers)
        self.num_workers = num_workers
        self.cursors = dict(enumerate(starts))
        self.batches = batches

    def update(self, batch: Mapping[str, Any]) -> None:
        """Record the cursor of a batch the training loop consumed."""
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
        if rank != self.dataset.rank:
            raise ValueError(
                describe("A batch from another rank", expected=self.dataset.rank, found=rank)
            )
        if self.num_workers is None:
            self._init(num_workers)
        elif num_workers != self.num_workers:
            raise ValueError(
                describe(
                    "Batches from DataLoaders with different num_workers reached one tracker",
                    expected=f"num_workers={self.num_workers}",
                    found=f"num_workers={num_workers}",
                    fix="use one tracker per DataLoader configuration",
                )
            )
        position = int(cur[-1, 4])
        n = cur.shape[0]
        q = self.dataset.schedule(num_workers).frames_per_stream
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

    def consume(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`update`, then return the batch without the cursor key."""
        self.update(batch)
        return {k: v for k, v in batch.items() if k != self.key}

    @property
    def resume_step(self) -> int:
        """``batches * batch_size``: the arithmetic resume position of this rank."""
        return self.batches * self.dataset.batch_size

    def state(self, *, gather: bool = True) -> ResumeState:
        """The :class:`ResumeState` (all ranks' cursors when DDP is initialised and gather)."""
        if self.num_workers is None:
            raise ResumeStateError(
                describe(
                    "The tracker has not seen a batch yet",
                    expected="at least one consume(batch) before state_dict()",
                    found="no batch",
                    fix="save the state after the first step, or use resume_step=0",
                )
            )
        local = ResumeState(
            fingerprint=self.dataset.fingerprint,
            world_size=self.dataset.world_size,
            num_workers=self.num_workers,
            batches=self.batches,
            cursors=tuple(
                StreamCursor(self.dataset.rank, role, e, p)
                for role, (e, p) in sorted(self.cursors.items())
            ),
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
        """JSON-safe resume state (see :meth:`state`)."""
        return self.state(gather=gather).to_dict()
