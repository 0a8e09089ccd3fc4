"""Which source each mix batch comes from: the seeded rounds of a mix (pure)."""

from __future__ import annotations

import numpy as np

from .source import MIX_SPAWN_KEY

__all__ = ["MixOrder"]


class MixOrder:
    """Which source each mix batch comes from: arithmetic over seeded rounds.

    Args:
        seed: the mix seed.
        counts: batches per source in a round of ``period`` batches (int64 array).
        period: batches per round.
        infinite: True for ``exhausted="cycle"`` (one endless mix epoch 0).

    Round ``r`` of mix stream ``g`` in ``epoch`` is a seeded permutation of ``counts[i]``
    copies of each source ``i``; nothing else is random.
    """

    def __init__(self, seed: int, counts: np.ndarray, period: int, *, infinite: bool) -> None:
        self.seed, self.counts, self.period, self.infinite = seed, counts, period, infinite
        self._round_cache: dict[tuple[int, int, int], np.ndarray] = {}

    @property
    def num_sources(self) -> int:
        """How many sources the mix has."""
        return len(self.counts)

    # -- the pure mix order ----------------------------------------------------------------------
    def round_sources(self, epoch: int, stream: int, round_index: int) -> np.ndarray:
        """Sources of the ``period`` batches of a round of a mix stream (a pure function)."""
        key = (epoch, stream, round_index)
        got = self._round_cache.get(key)
        if got is None:
            ss = np.random.SeedSequence(
                entropy=self.seed, spawn_key=(MIX_SPAWN_KEY, epoch, stream, round_index)
            )
            base = np.repeat(np.arange(self.num_sources, dtype=np.int64), self.counts)
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
        part = np.bincount(self.round_sources(epoch, stream, r)[:k], minlength=self.num_sources)
        return r * self.counts + part
