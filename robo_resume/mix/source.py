"""Mix sources and weights: :class:`MixSource`, the per-round counts of each source, the period."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import describe
from ..splits import EpisodeSelection
from ..stream.tuning import StreamTuning

MIX_KEY = "robo_resume_mix"
"""Batch key of the mix cursor: int64 ``[rank, role, num_workers, epoch, j, source]``."""


EXHAUSTED = ("cycle", "stop")


MAX_PERIOD = 1000


DEFAULT_PERIOD = 100


_MIX, _SOURCE = 0x4D4958, 0x535243  # SeedSequence spawn keys ("MIX", "SRC")
_VISUAL = ("video", "image")


@dataclass(frozen=True)
class MixSource:
    """One dataset of a mix.

    Attributes:
        root: dataset folder (or where a Hub download goes, with ``repo_id``).
        weight: share of the mix's batches (relative to the other sources' weights).
        keys: this source's feature name -> mix name (None drops the feature); unmapped
            features keep their names.
        episodes: episode selection of this source (indices, slice string or ``Split``).
        repo_id, revision: a Hub dataset, as in :class:`ChunkedEpisodeDataset`.
        chunk_frames, tuning: per-source overrides of the mix's values.
    """

    root: str | Path | None = None
    weight: float = 1.0
    keys: Mapping[str, str | None] = field(default_factory=dict)
    episodes: EpisodeSelection = None
    repo_id: str | None = None
    revision: str | None = None
    chunk_frames: int | None = None
    tuning: StreamTuning | None = None

    def __post_init__(self) -> None:
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(
                describe(
                    "A mix source's weight must be a positive number",
                    found=repr(w),
                    fix="give every source a weight > 0 (drop a source instead of weight 0)",
                )
            )
        if self.root is None and self.repo_id is None:
            raise ValueError(describe("A mix source needs a root or a repo_id", found="neither"))


def round_counts(weights: Sequence[float], period: int) -> tuple[int, ...]:
    """Batches per round of ``period`` for each weight (largest remainder, ties: lower index)."""
    total = math.fsum(weights)
    quotas = [w * period / total for w in weights]
    counts = [math.floor(q + 1e-9) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: period - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def default_period(weights: Sequence[float]) -> int:
    """``sum / gcd`` of integral weights up to :data:`MAX_PERIOD` (exact), else 100."""
    if all(float(w).is_integer() for w in weights):
        ints = [int(w) for w in weights]
        g = math.gcd(*ints)
        if sum(ints) // g <= MAX_PERIOD:
            return sum(ints) // g
    return DEFAULT_PERIOD


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
