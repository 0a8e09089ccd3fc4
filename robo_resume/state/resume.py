"""The resume state: a small, versioned, JSON-safe value, validated on load.

A :class:`ResumeState` records, for every stream (``rank`` x worker role) of a run, the newest
frame cursor the training loop has consumed: ``(epoch, position)`` = frames of that stream's epoch
already consumed. With the fingerprint of the dataset, the chunk plan and the schedule options,
it is enough to continue every stream exactly where it stood. It has the same keys and types at
every step, so it can go into any checkpoint (``json.dumps(state.to_dict())`` or ``torch.save``),
or be written alone with :func:`robo_resume.checkpoint.save_state`.

Versions (the rule :meth:`ResumeState.from_dict` applies):

- ``version`` is the state *format* version, :data:`STATE_VERSION`. It changes whenever the
  meaning of a state changes: its keys, or the plan or schedule algorithms that turn a cursor
  into frames. A state of the current version is accepted. A version 1 state (no
  ``library_version``), a version 2 state (no ``elastic``) and a version 3 state (no ``kind``)
  are migrated to version 4, which logs one INFO line on the ``robo_resume`` logger. Any other
  version (0, a future version, not an int) is refused with
  :class:`~robo_resume.errors.ResumeStateError`.
- ``library_version`` is the ``robo_resume.__version__`` that wrote the state. Because any
  change of the order bumps :data:`STATE_VERSION`, a state from another library version with
  the same format version resumes the same frames: it is accepted, and
  :meth:`ResumeState.check_fingerprint` logs one WARNING naming both versions.

One format for every kind of run (version 4): ``kind`` is ``"dataset"`` for a
:class:`ResumeState` (one dataset's streams) and ``"mix"`` for a
:class:`robo_resume.state.mix.MixState`, which nests one dataset state per source, as a weighted
sampler's state nests its children's. A state of one kind given where the other is expected is
refused with a message that names the right class.

Elastic resume (version 3): a state saved during a *remainder epoch* (the first epoch after a
resume with another topology or batch size, see :mod:`robo_resume.index.elastic`) has cursors that
count frames of that remainder epoch. Its ``elastic`` entry says so: ``{"epoch": X, "origin":
[level, ...]}``, where ``X`` labels the remainder epoch and each level is ``{"world_size",
"num_workers", "batch_size", "epoch", "cursors"}`` of an earlier run, oldest first, so the
remainder is recomputed from the state alone. ``elastic`` is None otherwise.

Validation on load goes field by field, with a message for each way a state can be wrong; the
field checks, versions and fingerprint wording live in :mod:`.records`, :mod:`.versions` and
:mod:`.fingerprint`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ResumeStateError, describe
from ..index.elastic import Level
from .fingerprint import ABOUT, ESCAPE, FIX, FIX_DEFAULT, in_words
from .records import (
    MAX_STATE_INT,
    MAX_WORKERS,
    as_int,
    elastic_record,
    merge_skipped,
    skip_record,
    skipped_list,
    workers_of,
)
from .versions import (
    KIND_DATASET,
    KIND_MIX,
    OLD_MIX_FORMAT,
    STATE_FORMAT,
    STATE_VERSION,
    UNKNOWN_LIBRARY_VERSION,
    library_version,
    migrate,
)

__all__ = [
    "KIND_DATASET",
    "KIND_MIX",
    "MAX_STATE_INT",
    "MAX_WORKERS",
    "OLD_MIX_FORMAT",
    "STATE_FORMAT",
    "STATE_VERSION",
    "ResumeState",
    "StreamCursor",
    "library_version",
]


logger = logging.getLogger("robo_resume")


_KEYS = ("fingerprint", "world_size", "num_workers", "batches", "cursors")


# How to fix a mismatch of each fingerprint key (see ChunkedEpisodeDataset.fingerprint).
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
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_STATE_INT:
                raise ResumeStateError(
                    describe(
                        f"Invalid stream cursor field '{name}'",
                        expected=f"an int in [0, {MAX_STATE_INT}]",
                        found=repr(v)[:80],
                        fix="pass the unmodified dict from CursorTracker.state_dict()",
                    )
                )


@dataclass(frozen=True)
class ResumeState:
    """Where every stream of a run stands, plus what it must be resumed with.

    Attributes:
        fingerprint: dataset, selection, plan and schedule options (seed, batch size, ...);
            a state only resumes a dataset with an equal fingerprint.
        world_size: the ranks of the run that produced the cursors.
        num_workers: the DataLoader workers per rank of that run.
        batches: batches each rank's loader had delivered (the arithmetic position,
            ``resume_step // batch_size``).
        cursors: one per stream of the ranks that contributed (all ranks after a gather).
        library_version: the robo_resume version that made the state (see the module
            docstring for the version rule).
        elastic_epoch: label of the remainder epoch the cursors count frames of (None: the
            cursors are in normal epochs); see the module docstring.
        origin: the earlier runs the remainder epoch is recomputed from (oldest first).
        skipped: chunks skipped with ``on_error="skip"`` that the training loop got past, one
            dict per chunk (keys :data:`SKIP_RECORD_KEYS`; see ``robo_resume.dataset.
            SKIPPED_KEY``); a resumed dataset skips them again without retrying. Absent in
            states written before it existed (read as none).

    Validated on construction: ``world_size >= 1``, ``num_workers >= 0``, ``batches >= 0``,
    and at most one cursor per stream, each of a rank ``< world_size`` and a role
    ``< max(num_workers, 1)``.

    Raises:
        ResumeStateError: a field breaks these rules (the message names it and the fix).
    """

    fingerprint: Mapping[str, Any]
    world_size: int
    num_workers: int
    batches: int
    cursors: tuple[StreamCursor, ...] = field(default_factory=tuple)
    library_version: str = field(default_factory=library_version)
    skipped: tuple[Mapping[str, Any], ...] = ()
    elastic_epoch: int | None = None
    origin: tuple[Level, ...] = ()

    @property
    def batch_size(self) -> int | None:
        """The batch size the cursors were recorded with (``fingerprint["batch_size"]``)."""
        b = self.fingerprint.get("batch_size")
        return b if isinstance(b, int) and not isinstance(b, bool) else None

    @property
    def level(self) -> Level:
        """This state as the newest :class:`~robo_resume.index.elastic.Level` of its chain."""
        return Level(
            self.world_size,
            self.num_workers,
            self.batch_size or 1,
            tuple((c.rank, c.role, c.epoch, c.position) for c in sorted(self.cursors)),
            self.elastic_epoch,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "skipped", tuple(skip_record(r) for r in self.skipped))
        if not isinstance(self.fingerprint, Mapping):
            raise ResumeStateError(
                describe(
                    "Invalid resume state field 'fingerprint'",
                    expected="a dict",
                    found=type(self.fingerprint).__name__,
                )
            )
        as_int("world_size", self.world_size, minimum=1)
        workers_of("num_workers", self.num_workers)
        as_int("batches", self.batches)
        streams = max(self.num_workers, 1)
        seen: set[tuple[int, int]] = set()
        for c in self.cursors:
            if c.rank >= self.world_size or c.role >= streams:
                raise ResumeStateError(
                    describe(
                        "A cursor names a stream outside the state's topology",
                        expected=f"rank < {self.world_size} and role < {streams}",
                        found=f"rank={c.rank}, role={c.role}",
                        fix="pass the unmodified dict from CursorTracker.state_dict()",
                    )
                )
            if (c.rank, c.role) in seen:
                raise ResumeStateError(
                    describe(
                        "The resume state holds two cursors for one stream",
                        expected="one cursor per (rank, role)",
                        found=f"rank={c.rank}, role={c.role} twice",
                        fix="merge states of several ranks with ResumeState.merged()",
                    )
                )
            seen.add((c.rank, c.role))
        if (self.elastic_epoch is None) != (not self.origin):
            raise ResumeStateError(
                describe(
                    "Invalid resume state field 'elastic'",
                    expected="both an epoch and an origin, or neither",
                    found=f"epoch={self.elastic_epoch!r}, {len(self.origin)} origin levels",
                    fix="pass the unmodified dict from CursorTracker.state_dict()",
                )
            )

    def to_dict(self) -> dict[str, Any]:
        """The state as a JSON-safe dict.

        Returns:
            A dict with a fixed set of keys (what :meth:`from_dict` reads).
        """
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "kind": KIND_DATASET,
            "library_version": self.library_version,
            "fingerprint": dict(self.fingerprint),
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batches": self.batches,
            "cursors": [[c.rank, c.role, c.epoch, c.position] for c in sorted(self.cursors)],
            "elastic": None
            if self.elastic_epoch is None
            else {
                "epoch": self.elastic_epoch,
                "origin": [
                    {
                        "world_size": lv.world_size,
                        "num_workers": lv.num_workers,
                        "batch_size": lv.batch_size,
                        "epoch": lv.epoch,
                        "cursors": [list(c) for c in lv.cursors],
                    }
                    for lv in self.origin
                ],
            },
            "skipped": [dict(r) for r in self.skipped],
        }

    def to_json(self) -> str:
        """The state as a JSON string.

        Returns:
            :meth:`to_dict` as JSON, keys sorted.
        """
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str | bytes | ResumeState) -> ResumeState:
        """Parse and validate a dict made by :meth:`to_dict` (or a JSON string of one).

        Versions 1 to 3 are migrated (logged at INFO); other versions are refused.

        Args:
            data: a :meth:`to_dict` value, its JSON (str or bytes), or a ResumeState
                (returned as it is).

        Returns:
            The validated :class:`ResumeState`.

        Raises:
            ResumeStateError: ``data`` is not a valid dataset state (the message names what
                is wrong and the fix).
        """
        if isinstance(data, ResumeState):
            return data
        if isinstance(data, str | bytes):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ResumeStateError(
                    describe(
                        "The resume state is not valid JSON",
                        expected="the JSON text of CursorTracker.state_dict()",
                        found=f"{type(exc).__name__}: {exc}",
                    )
                ) from exc
        if isinstance(data, Mapping) and (
            data.get("format") == OLD_MIX_FORMAT or data.get("kind") == KIND_MIX
        ):
            raise ResumeStateError(
                describe(
                    "This is the state of a MixedDataset, not of one dataset",
                    expected="a dataset state (kind 'dataset', from CursorTracker.state_dict())",
                    found="a mix state (kind 'mix', from MixTracker.state_dict())",
                    fix="resume the MixedDataset it was saved from with it: "
                    "MixedDataset(..., resume_state=state)",
                )
            )
        if not isinstance(data, Mapping) or data.get("format") != STATE_FORMAT:
            raise ResumeStateError(
                describe(
                    "This is not a robo_resume state",
                    expected=f"a dict with format={STATE_FORMAT!r} (from tracker.state_dict())",
                    found=repr(data)[:120],
                    fix="pass the value saved from CursorTracker.state_dict() (or the "
                    "ds.dataloader() loader's state_dict()), or load_state(path) of a file "
                    "written by save_state",
                )
            )
        data = migrate(data)
        if data.get("kind") != KIND_DATASET:
            raise ResumeStateError(
                describe(
                    "Invalid resume state field 'kind'",
                    expected=f"{KIND_DATASET!r} or {KIND_MIX!r}",
                    found=repr(data.get("kind"))[:80],
                    fix="pass the unmodified dict from CursorTracker.state_dict()",
                )
            )
        missing = [k for k in _KEYS if k not in data]
        if missing:
            raise ResumeStateError(
                describe(
                    "The resume state lacks keys",
                    expected=f"keys {list(_KEYS)}",
                    found=f"missing {missing}",
                    fix="pass the unmodified dict from CursorTracker.state_dict() or load_state()",
                )
            )
        cursors = data["cursors"]
        if not isinstance(cursors, list | tuple) or any(
            not isinstance(c, list | tuple) or len(c) != 4 for c in cursors
        ):
            raise ResumeStateError(
                describe(
                    "The resume state's cursors are malformed",
                    expected="a list of [rank, role, epoch, position] lists",
                    found=repr(cursors)[:120],
                )
            )
        lib = data.get("library_version", UNKNOWN_LIBRARY_VERSION)
        if not isinstance(lib, str):
            raise ResumeStateError(
                describe(
                    "Invalid resume state field 'library_version'",
                    expected="a version string",
                    found=repr(lib)[:80],
                )
            )
        return cls(
            fingerprint=data["fingerprint"]
            if not isinstance(data["fingerprint"], Mapping)
            else dict(data["fingerprint"]),
            world_size=as_int("world_size", data["world_size"], minimum=1),
            num_workers=workers_of("num_workers", data["num_workers"]),
            batches=as_int("batches", data["batches"]),
            cursors=tuple(StreamCursor(*c) for c in cursors),
            library_version=lib,
            skipped=skipped_list(data.get("skipped", [])),
            **elastic_record(data.get("elastic")),
        )

    def mismatches(self, expected: Mapping[str, Any]) -> list[str]:
        """The fingerprint keys whose values differ from ``expected``.

        Args:
            expected: the fingerprint of the dataset to resume.

        Returns:
            The differing keys, sorted.
        """
        return [
            k
            for k in sorted(set(expected) | set(self.fingerprint))
            if k != ABOUT and expected.get(k) != self.fingerprint.get(k)
        ]

    def check_fingerprint(self, expected: Mapping[str, Any], *, strict: bool = True) -> None:
        """Check that this state was made for a dataset whose fingerprint is ``expected``.

        With ``strict=True`` (the default) raise :class:`~robo_resume.errors.ResumeStateError`
        naming the first differing field: expected vs found value and how to fix it (the other
        differing fields are listed too). With ``strict=False`` every difference is logged as a
        WARNING on the ``robo_resume`` logger instead, and the state is used as it is. This is
        an escape hatch for experts: the cursors then index another dataset, selection, plan or
        order, so resuming **can replay or lose frames**, silently.

        Also logs one WARNING when the state was written by another ``robo_resume`` version
        (accepted: see the module docstring).

        Args:
            expected: the fingerprint of the dataset to resume.
            strict: raise on a difference (True) or log it (False).

        Raises:
            ResumeStateError: with ``strict``, the fingerprints differ.
        """
        self._check_library_version()
        diff = self.mismatches(expected)
        if not diff:
            return
        for key in diff if not strict else diff[:1]:
            want, got = expected.get(key), self.fingerprint.get(key)
            others = [k for k in diff if k != key]
            msg = describe(
                f"The resume state was made for a different '{key}' (this dataset vs the "
                f"state: {in_words(diff if strict else [key], expected, self.fingerprint)})",
                expected=f"{key}={want!r} (this dataset)",
                found=f"{key}={got!r} (the state)"
                + (f"; other differing fields: {others}" if others and strict else ""),
                fix=FIX.get(key, FIX_DEFAULT) + (ESCAPE if strict else ""),
            )
            if strict:
                raise ResumeStateError(msg)
            logger.warning(
                "resume state check disabled (strict=False), frames may be replayed or lost: %s",
                msg,
            )

    def _check_library_version(self) -> None:
        current = library_version()
        if self.library_version in (current, UNKNOWN_LIBRARY_VERSION):
            return
        logger.warning(
            "resume: the state was written by robo_resume %s, this is robo_resume %s; "
            "accepted because both use resume state format version %d (the frame order only "
            "changes with the format version)",
            self.library_version,
            current,
            STATE_VERSION,
        )

    def merged(self, other: ResumeState) -> ResumeState:
        """Union of two ranks' states, newest cursor per stream.

        Args:
            other: another rank's state of the same run.

        Returns:
            The merged :class:`ResumeState`.

        Raises:
            ResumeStateError: the states have different fingerprints or topologies.
        """
        diff = self.mismatches(other.fingerprint)
        if diff:
            key = diff[0]
            raise ResumeStateError(
                describe(
                    f"Cannot merge states made for a different '{key}'",
                    expected=f"{key}={self.fingerprint.get(key)!r}",
                    found=f"{key}={other.fingerprint.get(key)!r}",
                    fix="merge only the states of the ranks of one run",
                )
            )
        if (self.world_size, self.num_workers, self.elastic_epoch, self.origin) != (
            other.world_size,
            other.num_workers,
            other.elastic_epoch,
            other.origin,
        ):
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
            library_version=self.library_version,
            skipped=merge_skipped(self.skipped, other.skipped),
            elastic_epoch=self.elastic_epoch,
            origin=self.origin,
        )
