"""Topology (ranks x DataLoader workers = streams) and how many frames each stream gets.

Pure arithmetic; :func:`stream_lengths` is the one rule for every ``tail`` mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Topology", "stream_lengths"]


def positive_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; found {value!r}")


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks x ``num_workers`` DataLoader workers (0 = the main process)."""

    world_size: int = 1
    num_workers: int = 0

    def __post_init__(self) -> None:
        positive_int("world_size", self.world_size, 1)
        positive_int("num_workers", self.num_workers, 0)

    @property
    def workers_per_rank(self) -> int:
        """Streams per rank: ``max(num_workers, 1)``."""
        return max(self.num_workers, 1)

    @property
    def num_streams(self) -> int:
        """Streams in all: ``world_size * workers_per_rank``."""
        return self.world_size * self.workers_per_rank

    def stream_id(self, rank: int, worker_id: int) -> int:
        """Global stream id ``rank * workers_per_rank + worker_id``."""
        if not (0 <= rank < self.world_size and 0 <= worker_id < self.workers_per_rank):
            raise ValueError(
                f"rank {rank} / worker {worker_id} outside the topology "
                f"({self.world_size} ranks x {self.workers_per_rank} workers)"
            )
        return rank * self.workers_per_rank + worker_id


def _spread(total: int, lows: Sequence[int], highs: Sequence[int]) -> list[int]:
    """Values in ``[lows[i], highs[i]]`` summing to ``total``, as equal as possible."""
    out = list(lows)
    left = total - sum(out)
    while left > 0:
        room = [i for i in range(len(out)) if out[i] < highs[i]]
        share = max(left // len(room), 1)
        for i in room:
            d = min(share, highs[i] - out[i], left)
            out[i] += d
            left -= d
            if not left:
                break
    return out


def _round_robin_shape(n: int, workers: int, batch_size: int) -> tuple[list[int], list[int]]:
    """Per role of one rank: (fewest, most) frames for ``n`` batches in all, roles ``< m``
    yielding ``K`` batches and the others ``K - 1`` (``n = (K-1)*workers + m``), every batch
    full except a role's last one: the DataLoader's round-robin then ends with a partial round
    of the first roles, so :func:`worker_batches_done` still holds."""
    k = -(-n // workers)
    m = n - (k - 1) * workers
    batches = [k if j < m else k - 1 for j in range(workers)]
    highs = [c * batch_size for c in batches]
    lows = [(c - 1) * batch_size + 1 if c else 0 for c in batches]
    return lows, highs


def stream_lengths(
    total: int, topology: Topology, batch_size: int, *, infinite: bool, drop_last: bool = False
) -> tuple[int, ...] | None:
    """Frames per stream (global stream order) that hold ``total`` frames; None if impossible.

    Used by tail "keep" (every frame of an epoch once) and by the elastic remainder epoch.
    Infinite mode: as equal as possible. Epoch mode: every rank yields the same number ``N``
    of batches, ``N = ceil(total / (world_size * batch_size))`` (floor with ``drop_last``);
    per rank, roles ``< m`` yield ``K`` batches and the others ``K - 1`` (``N = (K-1)*W + m``,
    ``1 <= m <= W`` workers per rank), every batch full except a stream's last one. With
    ``drop_last`` all batches are full and the sum may fall short of ``total`` (the dropped
    frames). None when no such split holds exactly ``total`` frames (it always exists with one
    rank; with several ranks, 2+ workers and batch size 2+ whenever ``total >= world_size``).
    """
    s, wp, ranks, b = (
        topology.num_streams,
        topology.workers_per_rank,
        topology.world_size,
        batch_size,
    )
    if infinite:
        return tuple(total // s + (g < total % s) for g in range(s))
    n = total // (ranks * b) if drop_last else -(-total // (ranks * b))
    if n == 0:
        return (0,) * s if (total == 0 or drop_last) else None
    lows, highs = _round_robin_shape(n, wp, b)
    if drop_last:
        return tuple(highs) * ranks
    lo, hi = sum(lows), sum(highs)
    if ranks * lo > total:
        return None
    per_rank = _spread(total, [lo] * ranks, [hi] * ranks)
    out: list[int] = []
    for frames in per_rank:
        out.extend(_spread(frames, lows, highs))
    return tuple(out)


def ranks_apart(total: int, topology: Topology, batch_size: int) -> tuple[int, ...]:
    """Tail "keep" when :func:`stream_lengths` finds no equal batch count per rank: the ranks
    get ``total // world_size`` frames each (the first ``total % world_size`` one more), and
    each rank splits its frames in the round-robin shape (always possible on one rank)."""
    ranks, wp = topology.world_size, topology.workers_per_rank
    out: list[int] = []
    for r in range(ranks):
        frames = total // ranks + (r < total % ranks)
        if frames == 0:
            out.extend([0] * wp)
            continue
        lows, highs = _round_robin_shape(-(-frames // batch_size), wp, batch_size)
        out.extend(_spread(frames, lows, highs))
    return tuple(out)
