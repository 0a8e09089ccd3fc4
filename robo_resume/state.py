"""The resume state: a small, versioned, JSON-safe value, validated on load.

A :class:`ResumeState` records, for every stream (``rank`` x worker role) of a run, the newest
frame cursor the training loop has consumed: ``(epoch, position)`` = frames of that stream's epoch
already consumed. With the fingerprint of the dataset, the chunk plan and the schedule options,
it is enough to continue every stream exactly where it stood. It has the same keys and types at
every step, so it can go into any checkpoint (``json.dumps(state.to_dict())`` or ``torch.save``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ResumeStateError, describe

__all__ = ["STATE_FORMAT", "STATE_VERSION", "ResumeState", "StreamCursor"]

STATE_FORMAT = "robo_resume.state"
STATE_VERSION = 1


@dataclass(frozen=True, order=True)
class StreamCursor:
    """Frames of ``epoch`` that stream ``(rank, role)`` has delivered to the training loop."""

    rank: int
    role: int
    epoch: int
    position: int

    def __post_init__(self) -> None:
        for name in ("rank", "role", "epoch", "position"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ResumeStateError(
                    describe(
                        f"Invalid stream cursor field '{name}'",
                        expected="a non-negative int",
                        found=repr(v),
                    )
                )


@dataclass(frozen=True)
class ResumeState:
    """Where every stream of a run stands, plus what it must be resumed with.

    Attributes:
        fingerprint: dataset, selection, plan and schedule options (seed, batch size, ...);
            a state only resumes a dataset with an equal fingerprint.
        world_size, num_workers: the topology that produced the cursors.
        batches: batches each rank's loader had delivered (the arithmetic position,
            ``resume_step // batch_size``).
        cursors: one per stream of the ranks that contributed (all ranks after a gather).
    """

    fingerprint: Mapping[str, Any]
    world_size: int
    num_workers: int
    batches: int
    cursors: tuple[StreamCursor, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict with a fixed set of keys (see :meth:`from_dict`)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "fingerprint": dict(self.fingerprint),
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batches": self.batches,
            "cursors": [[c.rank, c.role, c.epoch, c.position] for c in sorted(self.cursors)],
        }

    def to_json(self) -> str:
        """The state as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | ResumeState) -> ResumeState:
        """Parse and validate a dict made by :meth:`to_dict` (or a JSON string of one)."""
        if isinstance(data, ResumeState):
            return data
        if isinstance(data, str | bytes):
            data = json.loads(data)
        if not isinstance(data, Mapping) or data.get("format") != STATE_FORMAT:
            raise ResumeStateError(
                describe(
                    "This is not a robo_resume state",
                    expected=f"a dict with format={STATE_FORMAT!r} (from tracker.state_dict())",
                    found=repr(data)[:120],
                    fix="pass the value saved from CursorTracker.state_dict() or "
                    "ChunkedEpisodeDataset.resume_state_from(...)",
                )
            )
        version = data.get("version")
        if version != STATE_VERSION:
            raise ResumeStateError(
                describe(
                    "Unsupported resume state version",
                    expected=f"version {STATE_VERSION}",
                    found=f"version {version!r}",
                    fix="resume with the robo_resume version that wrote the state, or restart "
                    "the epoch with resume_step",
                )
            )
        missing = [
            k
            for k in ("fingerprint", "world_size", "num_workers", "batches", "cursors")
            if k not in data
        ]
        if missing:
            raise ResumeStateError(
                describe("The resume state lacks keys", expected="all keys", found=missing)
            )
        try:
            cursors = tuple(StreamCursor(*map(int, c)) for c in data["cursors"])
            return cls(
                fingerprint=dict(data["fingerprint"]),
                world_size=int(data["world_size"]),
                num_workers=int(data["num_workers"]),
                batches=int(data["batches"]),
                cursors=cursors,
            )
        except (TypeError, ValueError) as exc:
            raise ResumeStateError(
                describe("The resume state is malformed", found=f"{type(exc).__name__}: {exc}")
            ) from exc

    def check_fingerprint(self, expected: Mapping[str, Any]) -> None:
        """Raise ResumeStateError naming the first differing field if fingerprints differ."""
        for key in sorted(set(expected) | set(self.fingerprint)):
            want, got = expected.get(key), self.fingerprint.get(key)
            if want != got:
                raise ResumeStateError(
                    describe(
                        f"The resume state was made for a different '{key}'",
                        expected=f"{key}={want!r} (this dataset)",
                        found=f"{key}={got!r} (the state)",
                        fix="construct the dataset with the same root, episodes, chunk_frames, "
                        "seed, batch_size and schedule options as the run that saved the state",
                    )
                )

    def merged(self, other: ResumeState) -> ResumeState:
        """Union of two ranks' states (same fingerprint and topology), newest cursor per stream."""
        self.check_fingerprint(other.fingerprint)
        if (self.world_size, self.num_workers) != (other.world_size, other.num_workers):
            raise ResumeStateError(
                describe(
                    "Cannot merge states of different topologies",
                    expected=f"world_size={self.world_size}, num_workers={self.num_workers}",
                    found=f"world_size={other.world_size}, num_workers={other.num_workers}",
                )
            )
        best: dict[tuple[int, int], StreamCursor] = {}
        for c in (*self.cursors, *other.cursors):
            k = (c.rank, c.role)
            if k not in best or (c.epoch, c.position) > (best[k].epoch, best[k].position):
                best[k] = c
        return ResumeState(
            fingerprint=self.fingerprint,
            world_size=self.world_size,
            num_workers=self.num_workers,
            batches=max(self.batches, other.batches),
            cursors=tuple(sorted(best.values())),
        )
