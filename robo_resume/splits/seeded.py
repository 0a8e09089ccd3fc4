"""Seeded, shuffled train/validation splits by episode (:class:`Split`, :func:`split_episodes`).

The rules are in the docstring of :mod:`robo_resume.splits`. Pure arithmetic on indices.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import describe, format_ranges

__all__ = ["PURPOSE", "Split", "split_episodes", "split_sizes"]

PURPOSE = 0x53504C54
"""SeedSequence spawn key of split salts ("SPLT"), apart from the schedule's keys."""

# --------------------------------------------------------------------------- seeded splits


def _check_fractions(fractions: Any) -> tuple[Fraction, ...]:
    """Validate split fractions; return them as exact rationals normalised to sum to 1."""
    if isinstance(fractions, str | bytes) or not isinstance(fractions, Iterable):
        raise ValueError(
            describe(
                "Split fractions must be a sequence of numbers",
                expected="e.g. (0.9, 0.1)",
                found=repr(fractions),
            )
        )
    values = tuple(fractions)
    bad = [
        f
        for f in values
        if isinstance(f, bool)
        or not isinstance(f, numbers.Real)
        or not math.isfinite(float(f))
        or float(f) <= 0
    ]
    if not values or bad:
        raise ValueError(
            describe(
                "Split fractions must be positive numbers",
                expected="one fraction > 0 per part, e.g. (0.9, 0.1)",
                found=f"{values!r}" + (f" (invalid: {bad!r})" if bad else ""),
                fix="drop empty parts and give every part a positive share",
            )
        )
    total = math.fsum(float(f) for f in values)
    if abs(total - 1.0) > 1e-6:
        hint = (
            "fractions are parts of 1: write (0.9, 0.1), not (90, 10)"
            if abs(total - 100.0) < 1e-4
            else "scale them so they sum to 1, e.g. "
            f"{tuple(round(float(f) / total, 4) for f in values)}"
        )
        raise ValueError(
            describe(
                "Split fractions do not sum to 1",
                expected="fractions summing to 1 (within 1e-6)",
                found=f"{values!r}, summing to {total!r}",
                fix=hint,
            )
        )
    exact = [Fraction(float(f)).limit_denominator(1_000_000) for f in values]
    s = sum(exact)
    return tuple(f / s for f in exact)


def split_sizes(n: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Sizes of the parts of ``n`` episodes split by ``fractions`` (largest-remainder rule).

    Part ``i`` first gets ``floor(n * f_i)``; the ``n - sum(floors)`` episodes left go one each
    to the parts with the largest remainders ``n * f_i - floor(n * f_i)`` (ties: lower ``i``).
    The sizes sum to ``n`` exactly; a part can be 0 when ``n * f_i < 1``. Fractions are
    compared as exact rationals (``0.1`` is 1/10), so rounding does not depend on float noise.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(describe("n must be a non-negative int", found=repr(n)))
    weights = _check_fractions(fractions)
    quotas = [w * int(n) for w in weights]
    sizes = [math.floor(q) for q in quotas]
    left = int(n) - sum(sizes)
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_remainder[:left]:
        sizes[i] += 1
    return tuple(sizes)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(
            describe("A split seed must be a non-negative int", expected="e.g. seed=0", found=seed)
        )
    return int(seed)


def _shuffle_keys(episodes: np.ndarray, seed: int) -> np.ndarray:
    """Distinct 64-bit keys, a pure function of (seed, episode index): splitmix64(salt + e)."""
    salt = np.random.SeedSequence(entropy=seed, spawn_key=(PURPOSE,)).generate_state(
        1, dtype=np.uint64
    )[0]
    with np.errstate(over="ignore"):
        x = episodes.astype(np.uint64) + salt
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _episode_ids(source: Any) -> tuple[int, ...]:
    """Sorted unique episode indices of a DatasetMeta (anything with ``.episodes``) or ints."""
    eps = getattr(source, "episodes", None)  # DatasetMeta, LeRobotReader, ChunkedEpisodeDataset
    if eps is not None:
        items: Iterable[Any] = (getattr(e, "episode_index", e) for e in eps)
    elif isinstance(source, str | bytes) or not isinstance(source, Iterable):
        raise ValueError(
            describe(
                "split_episodes needs episodes to split",
                expected="a DatasetMeta (load_metadata(root)) or a sequence of episode indices",
                found=type(source).__name__,
            )
        )
    else:
        items = source
    ids = sorted({int(e) for e in items})
    if not ids:
        raise ValueError(
            describe("There are no episodes to split", expected="at least one episode index")
        )
    return tuple(ids)


def split_episodes(
    source: Any,
    fractions: Sequence[float],
    *,
    seed: int = 0,
    shuffle: bool = True,
    allow_empty: bool = False,
) -> tuple[tuple[int, ...], ...]:
    """Split episodes into disjoint parts that cover them all; return each part's indices.

    Args:
        source: a :class:`~robo_resume.DatasetMeta` or episode indices (deduplicated).
        fractions: one share per part, each > 0, summing to 1, e.g. ``(0.9, 0.1)``.
        seed: non-negative int; the split is a pure function of (seed, episode indices).
        shuffle: False cuts the episodes in index order (first 90% / last 10%).
        allow_empty: return empty parts instead of raising when a part rounds to 0 episodes.

    Returns:
        ``len(fractions)`` tuples, each sorted, with :func:`split_sizes` sizes.

    Raises:
        ValueError: (with the fix) bad fractions or seed, no episodes, or an empty part.
    """
    weights = _check_fractions(fractions)
    seed = _check_seed(seed)
    ids = np.asarray(_episode_ids(source), dtype=np.int64)
    sizes = split_sizes(len(ids), fractions)
    if not allow_empty and 0 in sizes:
        empty = [i for i, s in enumerate(sizes) if s == 0]
        need = max(math.ceil(1 / w) for w in weights)
        raise ValueError(
            describe(
                f"Splitting {len(ids)} episodes by {tuple(fractions)} leaves part(s) {empty} empty",
                expected="at least one episode in every part",
                found=f"part sizes {sizes} (largest-remainder rounding of n * fraction)",
                fix=f"use fewer or larger parts, or split {need} or more episodes (splits are "
                "by episode, never by frame)",
            )
        )
    order = ids[np.argsort(_shuffle_keys(ids, seed), kind="stable")] if shuffle else ids
    cuts = np.cumsum((0, *sizes))
    return tuple(tuple(int(e) for e in np.sort(order[a:b])) for a, b in itertools.pairwise(cuts))


@dataclass(frozen=True)
class Split:
    """One part of a seeded split by episode; pass it as ``episodes=``.

    ``Split((0.9, 0.1), index=0, seed=0)`` is the training 90% and ``index=1`` the held-out
    10%: the two are disjoint and cover all episodes (see :func:`split_episodes`). The
    selection is only indices (zero-copy), and a pure function of the fields and the dataset's
    episode indices. Picklable; ``repr`` names every field.

    ``among`` restricts the split to those episode indices before cutting it, e.g. the
    episodes whose files exist (``among=readable_episodes(root)``, see
    :func:`robo_resume.files.readable_episodes`): parts are then cut from those episodes only,
    so no part holds an unreadable one. Indices the dataset lacks are an error. The split
    depends on the set it is cut from, so the same ``among`` gives the same parts.

    Attributes:
        fractions: one share per part, each > 0, summing to 1, e.g. ``(0.9, 0.1)``.
        index: which part this is, ``0 <= index < len(fractions)``.
        seed: non-negative int; the split is a pure function of (seed, episode indices).
        shuffle: False cuts the episodes in index order (first 90% / last 10%).
        among: episode indices to cut the split from (sorted and deduplicated); None: all
            of the dataset's.

    Raises:
        ValueError: bad fractions, seed or ``among``, or an ``index`` that is not one of the
            parts.
    """

    fractions: tuple[float, ...]
    index: int = 0
    seed: int = 0
    shuffle: bool = True
    among: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_fractions(self.fractions)
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        n = len(self.fractions)
        if (
            isinstance(self.index, bool)
            or not isinstance(self.index, numbers.Integral)
            or not (0 <= self.index < n)
        ):
            raise ValueError(
                describe(
                    "Split index is not one of the parts",
                    expected=f"an int in 0..{n - 1} (one per fraction of {self.fractions})",
                    found=repr(self.index),
                )
            )
        _check_seed(self.seed)
        if self.among is not None:
            if isinstance(self.among, str | bytes) or not isinstance(self.among, Iterable):
                raise ValueError(
                    describe(
                        "Split among= must be episode indices",
                        expected="a sequence of ints, e.g. among=readable_episodes(root)",
                        found=type(self.among).__name__,
                    )
                )
            object.__setattr__(self, "among", tuple(sorted({int(e) for e in self.among})))

    def __repr__(self) -> str:
        among = "" if self.among is None else f", among={self.among!r}"
        return (
            f"Split(fractions={self.fractions!r}, index={self.index!r}, seed={self.seed!r}, "
            f"shuffle={self.shuffle!r}{among})"
        )

    def select(self, episodes: Any) -> tuple[int, ...]:
        """This part of ``episodes``.

        Args:
            episodes: a :class:`~robo_resume.DatasetMeta` or episode indices.

        Returns:
            The part's episode indices, sorted.

        Raises:
            ValueError: ``among`` names episodes ``episodes`` lacks, or the part is empty.
        """
        if self.among is not None:
            known = set(_episode_ids(episodes))
            unknown = [e for e in self.among if e not in known]
            if unknown:
                raise ValueError(
                    describe(
                        "Split among= names episodes the dataset does not have",
                        expected=f"episode indices among {format_ranges(known)}",
                        found=format_ranges(unknown),
                        fix="pass among=readable_episodes(root) of this dataset",
                    )
                )
            episodes = self.among
        parts = split_episodes(episodes, self.fractions, seed=self.seed, shuffle=self.shuffle)
        return parts[self.index]
