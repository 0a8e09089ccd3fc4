"""Which source each mix batch comes from, and how many batches an epoch has."""

from __future__ import annotations

import numpy as np

from ..errors import describe
from .source import _MIX


class _MixOrder:
    """Which source each mix batch comes from, and how many batches an epoch has.

    A mixin of :class:`robo_resume.mix.MixedDataset`: arithmetic over the seeded rounds.
    """

    # -- the pure mix order ----------------------------------------------------------------------
    def round_sources(self, epoch: int, stream: int, round_index: int) -> np.ndarray:
        """Sources of the ``period`` batches of a round of a mix stream (a pure function)."""
        key = (epoch, stream, round_index)
        got = self._round_cache.get(key)
        if got is None:
            ss = np.random.SeedSequence(
                entropy=self.seed, spawn_key=(_MIX, epoch, stream, round_index)
            )
            base = np.repeat(np.arange(len(self.sources), dtype=np.int64), self.counts)
            got = np.random.default_rng(ss).permutation(base)
            if len(self._round_cache) > 64:
                self._round_cache.clear()
            self._round_cache[key] = got
        return got

    def source_at(self, epoch: int, stream: int, j: int) -> int:
        """Source of batch ``j`` of mix stream ``stream`` in ``epoch`` (epoch 0 with "cycle")."""
        r, k = divmod(j, self.period)
        return int(self.round_sources(epoch, stream, r)[k])

    def counts_before(self, epoch: int, stream: int, j: int) -> np.ndarray:
        """Batches each source gave mix stream ``stream`` before its batch ``j`` (prefix sums)."""
        r, k = divmod(j, self.period)
        part = np.bincount(self.round_sources(epoch, stream, r)[:k], minlength=len(self.sources))
        return r * self.counts + part

    def epoch_batches(self, epoch: int, num_workers: int) -> int | None:
        """``J``: batches every mix stream yields in ``epoch`` ("stop"); None with "cycle"."""
        return self.level(num_workers).epoch_end(epoch)

    def batches_next_iteration(self, num_workers: int) -> int:
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
        if not self.epochs.started:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            return sum(
                max(int(self.epoch_batches(epoch, num_workers)) - j, 0) for epoch, j, _ in starts
            )
        return int(self.epoch_batches(self.epochs.next_epoch, num_workers)) * wp

    def next_epoch(self, num_workers: int) -> int:
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
        if not self.epochs.started:
            _, starts, _ = self.start_point(num_workers)
            return min(e for e, _, _ in starts)
        return self.epochs.next_epoch

    def share_schedule(self, num_workers: int) -> None:
        """Compute each source's layout of the source epoch the next iteration starts in, here,
        before the DataLoader's workers start (as
        :meth:`~robo_resume.dataset.ChunkedEpisodeDataset.share_schedule` does for one
        dataset): forked workers inherit them, spawn and forkserver workers map
        them from shared memory, instead of each worker permuting every source's epoch. What
        :class:`~robo_resume.stream.loader.BatchLoader` calls. A source epoch a worker reaches
        on its own (``exhausted="cycle"``) it still computes itself; the frames are the same.
        """
        if not self.epochs.started:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            firsts = [min(role[2][i][0] for role in starts) for i in range(len(self.datasets))]
        else:  # every role starts the next mix epoch, each source at its epoch of that number
            firsts = [self.epochs.next_epoch] * len(self.datasets)
        for ds, epoch in zip(self.datasets, firsts, strict=True):
            layout = ds.layout(num_workers)
            if epoch != layout.epoch:  # a remainder epoch (elastic resume) has no layout to share
                layout.schedule.share_epoch(epoch)

    def batches_per_epoch(self, num_workers: int) -> int | None:
        """Batches this rank's DataLoader yields in mix epoch 0 ("stop"); None with "cycle"."""
        j = self.epoch_batches(0, num_workers)
        return None if j is None else j * max(num_workers, 1)
