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

import itertools
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import describe, format_ranges

if TYPE_CHECKING:
    from .format.metadata import DatasetMeta

__all__ = [
    "EpisodeSelection",
    "EpisodeSlice",
    "Split",
    "parse_selection",
    "resolve_selection",
    "select_episodes",
    "split_episodes",
    "split_sizes",
]

PURPOSE = 0x53504C54
"""SeedSequence spawn key of split salts ("SPLT"), apart from the schedule's keys."""

_SLICE_EXAMPLES = "'train[:90%]', 'train[90%:]', '[10:20]', 'train[:10%]+train[-10%:]'"
_NUM = r"-?\d+(?:\.\d*)?"
_PART_RE = re.compile(
    rf"""^\s*
    (?P<name>\w+(?:\.\w+)*)?\s*
    (?:\[\s*
        (?:(?P<start>{_NUM})\s*(?P<start_pct>%)?)?\s*
        :\s*
        (?:(?P<stop>{_NUM})\s*(?P<stop_pct>%)?)?\s*
    \])?\s*
    (?:\((?P<rounding>[^)]*)\))?
    \s*$""",
    re.VERBOSE,
)


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

    Returns ``len(fractions)`` tuples, each sorted, with :func:`split_sizes` sizes. Raises
    ValueError (with the fix) for bad fractions, no episodes, or an empty part.
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
        """This part of ``episodes`` (a DatasetMeta or episode indices), sorted."""
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


# --------------------------------------------------------------------------- slice strings


@dataclass(frozen=True)
class EpisodeSlice:
    """One ``name[start:stop]`` term of a slice string (bounds in episodes or percent)."""

    name: str
    start: Fraction | None
    stop: Fraction | None
    percent: bool

    def bounds(self, n: int) -> tuple[int, int]:
        """Absolute ``[from, to)`` positions in a split of ``n`` episodes (HF's rules)."""

        def absolute(b: Fraction | None, default: int) -> int:
            if b is None:
                return default
            v = round(b * n / 100) if self.percent else int(b)
            if v < 0:
                v = max(n + v, 0)
            return min(v, n)

        return absolute(self.start, 0), absolute(self.stop, n)


def _bad_syntax(spec: str, found: str | None = None) -> ValueError:
    return ValueError(
        describe(
            "episodes= is not a valid slice string",
            expected=f"split[start:stop] with optional %, e.g. {_SLICE_EXAMPLES}",
            found=found or repr(spec),
            fix="write bounds as integers (episode positions) or percentages, both of one kind, "
            "or pass a list of episode indices or a Split(...)",
        )
    )


def parse_selection(spec: str) -> tuple[EpisodeSlice, ...]:
    """Parse a slice string (see the module docstring) into its ``+``-joined terms."""
    if not isinstance(spec, str) or not spec.strip():
        raise _bad_syntax(str(spec), found=f"{spec!r} (empty)")
    out = []
    for term in spec.split("+"):
        m = _PART_RE.match(term)
        if m is None or not term.strip() or (m["name"] is None and "[" not in term):
            raise _bad_syntax(
                spec, found=repr(spec) if term == spec else f"{term.strip()!r} in {spec!r}"
            )
        rounding = m["rounding"]
        if rounding is not None and rounding.strip() != "closest":
            raise ValueError(
                describe(
                    "Unsupported rounding in an episodes= slice string",
                    expected="no suffix or '(closest)' (nearest episode, ties to even)",
                    found=f"({rounding}) in {spec!r}",
                    fix="drop the suffix; HF's pct1_dropremainder is not supported",
                )
            )
        start, stop = m["start"], m["stop"]
        given = [b for b in (start, stop) if b is not None]
        if (m["start_pct"] and stop is not None and not m["stop_pct"]) or (
            m["stop_pct"] and start is not None and not m["start_pct"]
        ):
            raise ValueError(
                describe(
                    "An episodes= slice mixes a percentage and an absolute bound",
                    expected="both bounds in % or both in episodes, e.g. 'train[10%:50%]'",
                    found=repr(term.strip()),
                    fix="add or remove the % on the other bound",
                )
            )
        percent = m["start_pct"] is not None or m["stop_pct"] is not None
        if percent and any(abs(Fraction(b)) > 100 for b in given):
            raise ValueError(
                describe(
                    "An episodes= percentage is out of range",
                    expected="percentages between -100% and 100%",
                    found=repr(term.strip()),
                    fix="use e.g. 'train[:100%]' for everything, 'train[-10%:]' for the last 10%",
                )
            )
        if not percent and any("." in b for b in given):
            raise _bad_syntax(spec, found=f"fractional episode position in {term.strip()!r}")
        out.append(
            EpisodeSlice(
                name=m["name"] or "",
                start=Fraction(start) if start is not None else None,
                stop=Fraction(stop) if stop is not None else None,
                percent=percent,
            )
        )
    return tuple(out)


def _split_members(
    name: str, episodes: Sequence[int], splits: Mapping[str, Any] | None, spec: str
) -> list[int]:
    if name == "" or (name == "train" and not splits):
        return list(episodes)
    if not splits or name not in splits:
        known = sorted(splits or {"train": None})
        raise ValueError(
            describe(
                f"episodes={spec!r} names an unknown split",
                expected=f"one of {known} (meta/info.json 'splits'), or no name for all episodes",
                found=repr(name),
                fix=f"write e.g. '{known[0]}[:90%]', or '[:90%]' for all episodes",
            )
        )
    rng = splits[name]
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(rng))
    if m is None:
        raise ValueError(
            describe(
                f"meta/info.json's split {name!r} is not an episode range",
                expected="'start:stop' episode indices, e.g. '0:50'",
                found=repr(rng),
                fix="fix 'splits' in meta/info.json, or select with '[...]' (all episodes)",
            )
        )
    lo, hi = int(m[1]), int(m[2])
    return [e for e in episodes if lo <= e < hi]


def resolve_selection(
    spec: str | Split,
    episodes: Sequence[int],
    *,
    splits: Mapping[str, Any] | None = None,
) -> tuple[int, ...]:
    """Resolve a slice string or a :class:`Split` against the dataset's sorted episode indices.

    ``splits`` is ``meta/info.json``'s ``"splits"`` mapping (name -> "start:stop"). Returns the
    selected episode indices, sorted; raises ValueError (with the fix) when nothing is selected.
    """
    episodes = sorted(int(e) for e in episodes)
    if isinstance(spec, Split):
        return spec.select(episodes)
    if not isinstance(spec, str):
        raise ValueError(
            describe(
                "Unsupported episodes= value",
                expected="None, episode indices, a slice string like 'train[:90%]', or a Split",
                found=type(spec).__name__,
            )
        )
    chosen: set[int] = set()
    described = []
    for part in parse_selection(spec):
        members = _split_members(part.name, episodes, splits, spec)
        a, b = part.bounds(len(members))
        chosen.update(members[a:b])
        described.append(f"{part.name or 'all'}: positions {a}:{b} of {len(members)}")
    if not chosen:
        raise ValueError(
            describe(
                f"episodes={spec!r} selects no episodes",
                expected="at least one episode",
                found="; ".join(described),
                fix="widen the slice (a percentage rounds to whole episodes: round(pct * n / 100))",
            )
        )
    return tuple(sorted(chosen))


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
        return tuple(e.episode_index for e in meta.episodes)
    if isinstance(episodes, str | Split):
        splits = meta.info.get("splits")
        return resolve_selection(
            episodes,
            [e.episode_index for e in meta.episodes],
            splits=splits if isinstance(splits, Mapping) else None,
        )
    chosen = sorted({int(e) for e in episodes})
    known = {e.episode_index for e in meta.episodes}
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
