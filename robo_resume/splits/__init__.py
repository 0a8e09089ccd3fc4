"""Episode selection: HF-style slice strings and seeded train/validation splits, by episode.

Everything here is pure arithmetic on episode indices: no file is read, nothing is copied, and
no global RNG is touched. Two ways to carve a dataset, with different rules on purpose:

Slice strings (``episodes="train[:90%]"``) select by **position**, never shuffled, exactly like
HF datasets' split strings (``datasets.load_dataset(..., split="train[:90%]")``):

- ``name[start:stop]``: ``name`` is a split of ``meta/info.json`` (LeRobot writes
  ``"splits": {"train": "0:N"}``, an episode-index range) or empty for all episodes, e.g.
  ``"[10:20]"``. ``train`` means all episodes when info.json has no ``splits``.
- Bounds are positions in that split's episodes sorted by index (equal to episode indices when
  they are ``0..N-1``), optional and possibly negative (counted from the end), clamped to the
  split like Python slices. When both bounds are given, both are percentages or neither is; a
  percentage may have decimals (``"[:12.5%]"``) and lies within -100..100.
- A percentage boundary is ``round(pct * n / 100)`` with ties to even: the ``closest`` rounding
  of HF datasets (an optional ``(closest)`` suffix is accepted). Two complementary slices
  (``"train[:90%]"`` and ``"train[90%:]"``) therefore share their boundary: they are disjoint
  and cover every episode.
- ``+`` joins parts (``"train[:10%]+train[-10%:]"``); the selection is their union (an episode
  is selected once).

:class:`Split` and :func:`split_episodes` make a **seeded, shuffled** split into disjoint parts:

- Part sizes follow the largest-remainder rule (:func:`split_sizes`): part ``i`` gets
  ``floor(n * f_i)`` episodes, and the episodes left over go one each to the parts with the
  largest fractional remainders (ties: the earlier part), so sizes sum exactly to ``n``.
- The order is a pure function of ``seed`` and the episode indices: each episode gets the key
  ``splitmix64(salt + episode_index)``, where ``salt`` comes from
  ``numpy.random.SeedSequence(entropy=seed, spawn_key=(PURPOSE,))``; episodes sorted by key are
  cut into parts of those sizes, and each part is returned sorted by index. Only SeedSequence's
  documented hash and integer arithmetic are used (no ``Generator`` method), so a split is the
  same in every process, on every machine, and across numpy versions. ``shuffle=False`` cuts
  the episodes in index order instead.

  The split depends on the set of episode indices: a dataset that gains episodes gets new
  part sizes and cut points, so pin the dataset revision (or save the indices) to keep a
  validation set fixed.

:func:`select_episodes` resolves any ``episodes=`` value (None, indices, a slice string, a
``Split``) to a sorted tuple of episode indices. :class:`~robo_resume.ChunkedEpisodeDataset`
hashes that tuple into its fingerprint, so a resume state refuses a different selection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..errors import describe
from .seeded import PURPOSE, Split, split_episodes, split_sizes
from .slices import EpisodeSlice, parse_selection, resolve_selection

if TYPE_CHECKING:
    from ..format.metadata import DatasetMeta

__all__ = [
    "PURPOSE",
    "EpisodeSelection",
    "EpisodeSlice",
    "Split",
    "parse_selection",
    "resolve_selection",
    "select_episodes",
    "split_episodes",
    "split_sizes",
]

# --------------------------------------------------------------------------- selection


EpisodeSelection = Iterable[int] | str | Split | None
"""What ``episodes=`` accepts: indices, a slice string like ``"train[:90%]"``, a Split, or None."""


def select_episodes(meta: DatasetMeta, episodes: EpisodeSelection) -> tuple[int, ...]:
    """Resolve an episode selection; returns sorted unique episode indices (all if None).

    ``episodes`` is one of: ``None`` (all), episode indices (``[0, 3, 7]``, ``range(10)``), a
    slice string by position in the HF datasets style (``"train[:90%]"``, ``"train[90%:]"``,
    ``"[10:20]"``; never shuffled), or a seeded :class:`~robo_resume.splits.Split` (shuffled by
    episode). See :mod:`robo_resume.splits` for the rounding rules. Only indices are computed;
    nothing is read or copied.
    """
    if episodes is None:
        return tuple(meta.episode_indices.tolist())
    if isinstance(episodes, str | Split):
        splits = meta.info.get("splits")
        return resolve_selection(
            episodes,
            meta.episode_indices.tolist(),
            splits=splits if isinstance(splits, Mapping) else None,
        )
    chosen = sorted({int(e) for e in episodes})
    known = set(meta.episode_indices.tolist())
    unknown = [e for e in chosen if e not in known]
    if unknown:
        raise ValueError(
            describe(
                "episodes= names episodes the dataset does not have",
                expected=f"episode indices among {min(known)}..{max(known)}",
                found=unknown[:10],
                file=meta.root / "meta",
            )
        )
    if not chosen:
        raise ValueError(describe("episodes= is empty", expected="at least one episode index"))
    return tuple(chosen)


def selected_episode_array(meta: DatasetMeta, episodes: EpisodeSelection) -> np.ndarray:
    """:func:`select_episodes` as a read-only int64 array: 8 MB at 10^6 episodes, where a
    tuple of Python ints takes about 40 MB in every process that holds it. ``None`` (all
    episodes) returns the metadata's own sorted column, without a copy or a lookup."""
    if episodes is None:
        return meta.episode_indices
    out = np.asarray(select_episodes(meta, episodes), dtype=np.int64)
    out.flags.writeable = False
    return out
