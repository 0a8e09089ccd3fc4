"""The epoch table: which epoch each DataLoader worker's next iteration plays.

Every ``iter()`` over a DataLoader is one epoch, and DataLoader workers (persistent or not)
learn which one from this table, which lives in shared memory and is owned by the dataset:
there is no ``set_epoch`` to forget. The main process reads it to count (``len(loader)``,
``loader.epochs()``); a worker marks its row when its stream starts an epoch.
"""

from __future__ import annotations

import torch

from ..state.resume import MAX_WORKERS

__all__ = ["EpochTable", "WorkerEpoch"]


class WorkerEpoch:
    """One worker's row of an :class:`EpochTable`: whether its stream started, and the epoch
    its next iteration plays."""

    __slots__ = ("_row",)

    def __init__(self, row: torch.Tensor) -> None:
        self._row = row

    @property
    def started(self) -> bool:
        """Whether this worker's stream has started (in any iteration)."""
        return bool(self._row[1])

    @property
    def next_epoch(self) -> int:
        """The epoch this worker's next iteration plays (meaningful once :attr:`started`)."""
        return int(self._row[0])

    def playing(self, epoch: int) -> None:
        """Record that the stream plays ``epoch`` now: started, and the next iteration plays
        ``epoch + 1``."""
        self._row[0] = epoch + 1
        self._row[1] = 1


class EpochTable:
    """A shared-memory table with one :class:`WorkerEpoch` row per DataLoader worker.

    ``shared=False`` makes a private table (a stream played outside the DataLoader's epoch
    protocol, such as a mix's source, must not touch its dataset's table). Pickles with its
    shared memory, so forked and spawned workers write the table the main process reads.
    """

    def __init__(self, rows: int = MAX_WORKERS, *, shared: bool = True) -> None:
        table = torch.zeros((rows, 2), dtype=torch.int64)
        self._table = table.share_memory_() if shared else table

    def worker(self, worker: int) -> WorkerEpoch:
        """Worker ``worker``'s row (the main process's stream is worker 0)."""
        return WorkerEpoch(self._table[worker])

    @property
    def started(self) -> bool:
        """Whether any iteration has started (worker 0 always plays one when any does)."""
        return bool(self._table[0, 1])

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration plays, once one has started (every worker's next
        iteration plays the same epoch: worker 0's row is read)."""
        return int(self._table[0, 0])

    def fresh(self) -> EpochTable:
        """A new, unstarted table of the same size (a view of the dataset that resumes anew)."""
        return EpochTable(self._table.shape[0], shared=self._table.is_shared())

    def reset(self) -> None:
        """Forget every iteration: the next one starts from the resume point again."""
        self._table.zero_()
