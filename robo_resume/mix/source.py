"""Mix sources and weights: :class:`MixSource`, the per-round counts of each source, the period."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import describe
from ..source import DataSource, as_source
from ..splits import EpisodeSelection
from ..stream.tuning import StreamTuning

MIX_KEY = "robo_resume_mix"
"""Batch key of the mix cursor: int64 ``[rank, role, num_workers, epoch, j, source]``."""


EXHAUSTED = ("cycle", "stop")


MAX_PERIOD = 1000


DEFAULT_PERIOD = 100


MIX_SPAWN_KEY, SOURCE_SPAWN_KEY = 0x4D4958, 0x535243  # SeedSequence spawn keys ("MIX", "SRC")
VISUAL = ("video", "image")


@dataclass(frozen=True, init=False)
class MixSource:
    """One dataset of a mix: where its data comes from, its weight, its tuning.

    The source's ``features`` map its feature names to the mix's names (None drops a feature,
    which is then never opened or decoded); unmapped features keep their names. Its
    ``chunk_frames`` None: the mix's. The properties ``root``, ``repo_id``, ``revision``,
    ``episodes``, ``chunk_frames`` and ``keys`` read the source's fields.

    Args:
        source: a :class:`~robo_resume.source.DataSource` (folder or Hub repo, revision,
            episodes, features, chunk_frames) or the dataset folder.
        weight: share of the mix's batches (relative to the other sources' weights), > 0.
        tuning: a per-source :class:`StreamTuning` (None: the mix's).
        keys: the ``features`` mapping under its earlier name.
        **source_fields: the DataSource fields as keywords instead
            (``MixSource(root, episodes="train[:90%]")``).

    Raises:
        ValueError: ``keys=`` together with ``features``, a weight that is not a positive
            finite number, or an invalid source (see :class:`~robo_resume.source.DataSource`).
    """

    source: DataSource
    weight: float = 1.0
    tuning: StreamTuning | None = None

    def __init__(
        self,
        source: str | Path | DataSource | None = None,
        weight: float = 1.0,
        *,
        tuning: StreamTuning | None = None,
        keys: Mapping[str, str | None] | None = None,
        **source_fields: Any,
    ) -> None:
        if keys is not None:
            if source_fields.get("features") is not None or isinstance(source, DataSource):
                raise ValueError(
                    describe(
                        "MixSource got keys= and features (keys= is features' earlier name)",
                        found=f"keys={dict(keys)!r}",
                        fix="give the mapping once, as features= of the DataSource",
                    )
                )
            source_fields["features"] = dict(keys)
        src = as_source(source, source_fields, owner="MixSource")
        w = weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(
                describe(
                    "A mix source's weight must be a positive number",
                    found=repr(w),
                    fix="give every source a weight > 0 (drop a source instead of weight 0)",
                )
            )
        object.__setattr__(self, "source", src)
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "tuning", tuning)

    @property
    def root(self) -> str | Path | None:
        """The source's dataset folder."""
        return self.source.root

    @property
    def repo_id(self) -> str | None:
        """The source's Hub repo."""
        return self.source.repo_id

    @property
    def revision(self) -> str | None:
        """The source's Hub revision."""
        return self.source.revision

    @property
    def episodes(self) -> EpisodeSelection:
        """The source's episode selection."""
        return self.source.episodes

    @property
    def chunk_frames(self) -> int | None:
        """The source's chunk_frames (None: the mix's)."""
        return self.source.chunk_frames

    @property
    def keys(self) -> dict[str, str | None]:
        """This source's feature name -> mix name (None: dropped), from ``features``."""
        f = self.source.features
        return dict(f) if isinstance(f, Mapping) else {}


def round_counts(weights: Sequence[float], period: int) -> tuple[int, ...]:
    """Batches per round of ``period`` for each weight.

    Args:
        weights: the sources' weights, each > 0.
        period: batches per round.

    Returns:
        One count per weight, summing to ``period`` (largest remainder, ties: lower index).
    """
    total = math.fsum(weights)
    quotas = [w * period / total for w in weights]
    counts = [math.floor(q + 1e-9) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: period - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def default_period(weights: Sequence[float]) -> int:
    """The mix's batches per round when none is given.

    Args:
        weights: the sources' weights, each > 0.

    Returns:
        ``sum / gcd`` of integral weights up to :data:`MAX_PERIOD` (exact), else
        :data:`DEFAULT_PERIOD`.
    """
    if all(float(w).is_integer() for w in weights):
        ints = [int(w) for w in weights]
        g = math.gcd(*ints)
        if sum(ints) // g <= MAX_PERIOD:
            return sum(ints) // g
    return DEFAULT_PERIOD
