"""The state of a :class:`robo_resume.mix.MixedDataset`.

One position per mix stream, and each source's own dataset state nested inside.

Same format as a single dataset's state (``format`` ``robo_resume.state``, :data:`STATE_VERSION`),
with ``kind`` ``"mix"``; its ``sources`` are complete dataset states (kind ``"dataset"``), as a
weighted sampler's state nests its children's. A mix state of the format before version 4
(``format`` ``robo_resume.mix_state``, its own ``version`` 1) is migrated on load, with one INFO
line; the frames it resumes are the same.

Where each stream starts (the arithmetic over the positions) is the mix's own
(:mod:`robo_resume.mix`); :meth:`MixState.check` takes the mix duck-typed (its ``fingerprint``
and ``datasets``), so this module imports nothing above the state layer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ..errors import ResumeStateError, describe
from .resume import (
    KIND_MIX,
    OLD_MIX_FORMAT,
    STATE_FORMAT,
    STATE_VERSION,
    ResumeState,
    library_version,
)

__all__ = ["OLD_MIX_VERSION", "MixState"]

logger = logging.getLogger("robo_resume")

OLD_MIX_VERSION = 1
"""The ``version`` of the last mix state format of its own (``robo_resume.mix_state``)."""


def _migrate(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A ``robo_resume.mix_state`` version 1 dict as a version 4 mix state, or a refusal."""
    version = data.get("version")
    if version != OLD_MIX_VERSION or isinstance(version, bool):
        raise ResumeStateError(
            describe(
                "Unsupported mix state version",
                expected=f"{OLD_MIX_FORMAT!r} version {OLD_MIX_VERSION}, or {STATE_FORMAT!r} "
                f"version {STATE_VERSION}",
                found=f"{OLD_MIX_FORMAT!r} version {version!r}",
                fix="resume with the robo_resume version that wrote the state",
            )
        )
    logger.info(
        "resume: migrated a mix state from format %r version %d to %r version %d (the frames "
        "are the same)",
        OLD_MIX_FORMAT,
        OLD_MIX_VERSION,
        STATE_FORMAT,
        STATE_VERSION,
    )
    return {**data, "format": STATE_FORMAT, "version": STATE_VERSION, "kind": KIND_MIX}


class CheckedMix(Protocol):
    """What :meth:`MixState.check` needs of the mix that resumes from a state.

    A :class:`~robo_resume.mix.MixedDataset`, which builds on this module (so a protocol, not
    an import): its fingerprint, compared key by key with the state's, and its source datasets,
    one per source state.
    """

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        """What a state of this mix must match (see :attr:`MixState.fingerprint`)."""
        ...

    @property
    def datasets(self) -> Sized:
        """The mix's source datasets, in source order (only their number is read)."""
        ...


@dataclass(frozen=True)
class MixState:
    """Where a mix stands: each role's mix position and each source's own resume state.

    Attributes:
        fingerprint: :attr:`MixedDataset.fingerprint` of the run that made it.
        world_size: the ranks of the run that made it.
        num_workers: the DataLoader workers per rank of that run.
        batches: batches this rank consumed.
        mix: ``(rank, role, epoch, j)`` per mix stream: ``j`` batches of ``epoch`` consumed.
        sources: one :class:`ResumeState` per source (its streams' frame cursors and skips).
        source_starts: per source, the epoch its streams started the run in (0; after an
            elastic resume, where the source's re-partition starts). Absent before: zeros.
        library_version: the robo_resume version that made the state.

    Raises:
        ResumeStateError: ``source_starts`` does not hold one epoch >= 0 per source.
    """

    fingerprint: Mapping[str, Any]
    world_size: int
    num_workers: int
    batches: int
    mix: tuple[tuple[int, int, int, int], ...]
    sources: tuple[ResumeState, ...]
    library_version: str = field(default_factory=library_version)
    source_starts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        starts = tuple(int(x) for x in self.source_starts) or (0,) * len(self.sources)
        if len(starts) != len(self.sources) or min(starts, default=0) < 0:
            raise ResumeStateError(
                describe(
                    "Invalid mix state field 'source_starts'",
                    expected=f"one epoch >= 0 per source ({len(self.sources)})",
                    found=repr(self.source_starts)[:80],
                    fix="pass the unmodified dict from MixTracker.state_dict()",
                )
            )
        object.__setattr__(self, "source_starts", starts)

    @property
    def batch_size(self) -> int:
        """The batch size the positions were recorded with (``fingerprint["batch_size"]``)."""
        return int(self.fingerprint["batch_size"])

    @property
    def topology(self) -> tuple[int, int, int]:
        """``(world_size, num_workers, batch_size)`` of the run that saved the state."""
        return self.world_size, self.num_workers, self.batch_size

    def to_dict(self) -> dict[str, Any]:
        """The state as a JSON-safe dict.

        Returns:
            A dict with the same keys at every step (what :meth:`from_dict` reads).
        """
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "kind": KIND_MIX,
            "library_version": self.library_version,
            "fingerprint": dict(self.fingerprint),
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batches": self.batches,
            "mix": [list(m) for m in sorted(self.mix)],
            "sources": [s.to_dict() for s in self.sources],
            "source_starts": list(self.source_starts),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | MixState) -> MixState:
        """Parse and validate a :meth:`to_dict` value.

        A mix state of the format before version 4 is migrated (logged at INFO).

        Args:
            data: a :meth:`to_dict` value (or a MixState, returned as it is).

        Returns:
            The :class:`MixState`.

        Raises:
            ResumeStateError: ``data`` is a single dataset's state, of an unsupported
                version, not a robo_resume mix state, or malformed.
        """
        if isinstance(data, MixState):
            return data
        if isinstance(data, Mapping) and data.get("format") == STATE_FORMAT:
            if data.get("kind") != KIND_MIX:
                raise ResumeStateError(
                    describe(
                        "This is the state of one dataset, not of a MixedDataset",
                        expected="a mix state (kind 'mix', from MixTracker.state_dict())",
                        found=f"kind {data.get('kind', 'dataset')!r} (from CursorTracker."
                        "state_dict() of a ChunkedEpisodeDataset)",
                        fix="resume the ChunkedEpisodeDataset it was saved from with it",
                    )
                )
            if data.get("version") != STATE_VERSION or isinstance(data.get("version"), bool):
                raise ResumeStateError(
                    describe(
                        "Unsupported mix state version",
                        expected=f"version {STATE_VERSION} (or a mix_state of version "
                        f"{OLD_MIX_VERSION})",
                        found=f"version {data.get('version')!r}",
                        fix="resume with the robo_resume version that wrote the state",
                    )
                )
        elif isinstance(data, Mapping) and data.get("format") == OLD_MIX_FORMAT:
            data = _migrate(data)
        else:
            raise ResumeStateError(
                describe(
                    "This is not a robo_resume mix state",
                    expected=f"a dict with format={STATE_FORMAT!r} and kind={KIND_MIX!r} "
                    "(from MixTracker.state_dict())",
                    found=repr(data)[:120],
                    fix="pass the value saved from the MixTracker of a MixedDataset (a single "
                    "dataset's state resumes a ChunkedEpisodeDataset)",
                )
            )
        try:
            mix = tuple(tuple(int(x) for x in m) for m in data["mix"])
            if any(len(m) != 4 or min(m) < 0 for m in mix):
                raise ValueError(mix)
            return cls(
                fingerprint=dict(data["fingerprint"]),
                world_size=int(data["world_size"]),
                num_workers=int(data["num_workers"]),
                batches=int(data["batches"]),
                mix=cast("tuple[tuple[int, int, int, int], ...]", mix),  # checked above
                sources=tuple(ResumeState.from_dict(s) for s in data["sources"]),
                library_version=str(data.get("library_version", "unknown")),
                source_starts=tuple(int(x) for x in data.get("source_starts") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ResumeStateError):
                raise
            raise ResumeStateError(
                describe(
                    "The mix state is malformed",
                    expected="the unmodified dict from MixTracker.state_dict()",
                    found=f"{type(exc).__name__}: {exc}"[:160],
                )
            ) from exc

    def check(self, mix: CheckedMix) -> None:
        """Refuse a state made for another mix (weights, sources, ...).

        The batch size may differ (elastic resume); each source's own options are checked by
        its dataset (:meth:`~robo_resume.dataset.ChunkedEpisodeDataset.use_resume_state`).

        Args:
            mix: the mix to resume (its ``fingerprint`` and the number of its ``datasets``).

        Raises:
            ResumeStateError: a fingerprint field other than the batch size differs (the
                likely causes first: weights, sources, keys, exhausted, seed), or the number
                of sources does.
        """
        first = ("weights", "sources", "keys", "exhausted", "seed")  # the likely causes first
        keys = sorted((set(mix.fingerprint) | set(self.fingerprint)) - {"batch_size"})
        for key in [k for k in first if k in keys] + [k for k in keys if k not in first]:
            want, got = mix.fingerprint.get(key), self.fingerprint.get(key)
            if want != got:
                fix = {
                    "weights": "resume with the weights the run was saved with; the mix position "
                    "says how many batches each source gave under those weights, so other "
                    "weights would replay or skip frames. To change the mix, start a new run",
                    "period": "pass the same period (or weights) as the run that saved the state",
                    "sources": "pass the same sources, in the same order",
                    "keys": "pass the same key mappings as the run that saved the state",
                }.get(key, f"pass the same {key} as the run that saved the state")
                raise ResumeStateError(
                    describe(
                        f"The mix resume state was made with different '{key}'",
                        expected=f"{key}={want!r} (this mix)",
                        found=f"{key}={got!r} (the state)",
                        fix=fix,
                    )
                )
        if len(self.sources) != len(mix.datasets):
            raise ResumeStateError(
                describe(
                    "The mix state has another number of sources",
                    expected=f"{len(mix.datasets)} source states",
                    found=len(self.sources),
                    fix="pass the unmodified dict from MixTracker.state_dict()",
                )
            )
