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
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__
from ..errors import ResumeStateError, describe
from ..index.elastic import Level

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

STATE_FORMAT = "robo_resume.state"
STATE_VERSION = 4
"""Format version of every state; 2 added ``library_version``, 3 ``elastic``, 4 ``kind`` (and
the mix state became this format, see :mod:`robo_resume.state.mix`)."""

KIND_DATASET = "dataset"
"""``kind`` of a :class:`ResumeState`."""

KIND_MIX = "mix"
"""``kind`` of a :class:`robo_resume.state.mix.MixState`."""

OLD_MIX_FORMAT = "robo_resume.mix_state"
"""``format`` of mix states before version 4 (their own ``version`` 1); migrated on load."""

UNKNOWN_LIBRARY_VERSION = "unknown"
"""``library_version`` of a state migrated from format version 1 (which did not record it)."""

MAX_WORKERS = 128
"""Most DataLoader workers per rank a stream table holds (and a resume state may name)."""

MAX_STATE_INT = 2**53
"""Largest epoch, position, batch count or rank a state may hold: exact in JSON and float64,
and far from int64's limit, so arithmetic on it (epochs x batches, shared int64 tables) cannot
overflow."""

_KEYS = ("fingerprint", "world_size", "num_workers", "batches", "cursors")

# How to fix a mismatch of each fingerprint key (see ChunkedEpisodeDataset.fingerprint).
_FIX = {
    "dataset": "the state belongs to another dataset (its episodes or features differ); pass "
    "the root of the dataset the run was trained on, or start a new run without resume_state",
    "total_frames": "the state belongs to another dataset or episode selection; pass the same "
    "root and episodes=[...] as the run that saved it",
    "episodes": "pass the same episodes= selection (indices, slice string, or a Split with the "
    "same fractions, index and seed) as the run that saved the state",
    "plan": "pass the same chunk_frames, episodes and StreamTuning(cut_at_keyframes=...) as the "
    "run that saved the state",
    "seed": "pass the same seed as the run that saved the state",
    "batch_size": "pass the same batch_size as the run that saved the state (resume_step "
    "counts batches of that size); a resume_state may change it (elastic resume)",
}
_FIX_DEFAULT = (
    "construct the dataset with the same root, episodes, chunk_frames, seed, batch_size and "
    "schedule options as the run that saved the state"
)
_ESCAPE = (
    "; to resume anyway, accepting that frames may be replayed or lost, pass "
    "resume_strict=False to ChunkedEpisodeDataset (or MixedDataset): see the README, "
    "'When a resume is refused'"
)
ABOUT = "about"
"""Fingerprint key of readable facts (episode ranges, chunk_frames, ...) used to say in words
what differs; never compared (the hashes beside it are)."""


def _in_words(keys: list[str], want: Mapping[str, Any], got: Mapping[str, Any]) -> str:
    """``seed 1 vs 0; episodes 0-9 vs 0-7``: each differing key, this dataset's value first."""
    a, b = want.get(ABOUT) or {}, got.get(ABOUT) or {}
    out = []
    for k in keys:
        if k in a and a.get(k) == b.get(k):
            out.append(f"{k} ({a[k]} in both; it follows from the other differences)")
        elif k in a or k in b:
            out.append(f"{k} {a.get(k, '(not recorded)')} vs {b.get(k, '(not recorded)')}")
        else:
            out.append(f"{k} {want.get(k)!r} vs {got.get(k)!r}")
    return "; ".join(out)


def library_version() -> str:
    """``robo_resume.__version__``, the version that writes states now."""
    return __version__


def _int(name: str, value: Any, *, minimum: int = 0, maximum: int = MAX_STATE_INT) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ResumeStateError(
            describe(
                f"Invalid resume state field '{name}'",
                expected=f"an int >= {minimum} and <= {maximum}",
                found=repr(value)[:80],
                fix="pass the unmodified dict from CursorTracker.state_dict() or load_state()",
            )
        )
    return value


def _workers(name: str, value: Any) -> int:
    """A worker count: an int in ``[0, MAX_WORKERS]``, the limit named in the message."""
    _int(name, value)
    if value > MAX_WORKERS:
        raise ResumeStateError(
            describe(
                f"The resume state's '{name}' is above the limit of workers per rank",
                expected=f"at most {MAX_WORKERS} DataLoader workers per rank (MAX_WORKERS)",
                found=f"{name}={value}",
                fix="pass the unmodified dict from CursorTracker.state_dict(); no run can have "
                f"used more than {MAX_WORKERS} workers per rank",
            )
        )
    return value


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
        world_size, num_workers: the topology that produced the cursors.
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
        object.__setattr__(self, "skipped", tuple(_skip_record(r) for r in self.skipped))
        if not isinstance(self.fingerprint, Mapping):
            raise ResumeStateError(
                describe(
                    "Invalid resume state field 'fingerprint'",
                    expected="a dict",
                    found=type(self.fingerprint).__name__,
                )
            )
        _int("world_size", self.world_size, minimum=1)
        _workers("num_workers", self.num_workers)
        _int("batches", self.batches)
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
        """JSON-safe dict with a fixed set of keys (see :meth:`from_dict`)."""
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
        """The state as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str | bytes | ResumeState) -> ResumeState:
        """Parse and validate a dict made by :meth:`to_dict` (or a JSON string of one).

        Versions 1 to 3 are migrated (logged at INFO); other versions are refused. Raises
        :class:`~robo_resume.errors.ResumeStateError` naming what is wrong and the fix.
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
        data = _migrate(data)
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
            world_size=_int("world_size", data["world_size"], minimum=1),
            num_workers=_workers("num_workers", data["num_workers"]),
            batches=_int("batches", data["batches"]),
            cursors=tuple(StreamCursor(*c) for c in cursors),
            library_version=lib,
            skipped=_skipped_list(data.get("skipped", [])),
            **_elastic(data.get("elastic")),
        )

    def mismatches(self, expected: Mapping[str, Any]) -> list[str]:
        """Keys whose values differ between ``expected`` and this state's fingerprint, sorted."""
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
                f"state: {_in_words(diff if strict else [key], expected, self.fingerprint)})",
                expected=f"{key}={want!r} (this dataset)",
                found=f"{key}={got!r} (the state)"
                + (f"; other differing fields: {others}" if others and strict else ""),
                fix=_FIX.get(key, _FIX_DEFAULT) + (_ESCAPE if strict else ""),
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
        """Union of two ranks' states (same fingerprint and topology), newest cursor per stream."""
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
            skipped=_merge_skipped(self.skipped, other.skipped),
            elastic_epoch=self.elastic_epoch,
            origin=self.origin,
        )


SKIP_RECORD_KEYS = (
    "epoch",
    "chunk",
    "episode",
    "start",
    "frame",
    "stop",
    "rank",
    "role",
    "file",
    "error",
)
"""Keys of a skipped-chunk record (ints, except ``file``: str or None, ``error``: str)."""


def _skip_record(r: Any) -> dict[str, Any]:
    ok = isinstance(r, Mapping) and all(k in r for k in SKIP_RECORD_KEYS)
    if ok:
        ints = SKIP_RECORD_KEYS[:8]
        ok = all(isinstance(r[k], int) and not isinstance(r[k], bool) and r[k] >= 0 for k in ints)
        ok = (
            ok and isinstance(r["error"], str) and (r["file"] is None or isinstance(r["file"], str))
        )
    if not ok:
        raise ResumeStateError(
            describe(
                "Invalid skipped-chunk record in the resume state",
                expected=f"a dict with keys {list(SKIP_RECORD_KEYS)} (ints, file str or None, "
                "error str)",
                found=repr(r)[:160],
                fix="pass the unmodified dict from CursorTracker.state_dict()",
            )
        )
    return {k: r[k] for k in SKIP_RECORD_KEYS}


def _skipped_list(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list | tuple):
        raise ResumeStateError(
            describe(
                "Invalid resume state field 'skipped'",
                expected="a list of skipped-chunk dicts",
                found=repr(value)[:80],
            )
        )
    return tuple(_skip_record(r) for r in value)


def _merge_skipped(a: Any, b: Any) -> tuple[dict[str, Any], ...]:
    """Union of two ranks' skip records, in (epoch, rank, role, chunk, start) order."""
    seen = {}
    for r in (*a, *b):
        seen.setdefault((r["epoch"], r["chunk"], r["start"], r["rank"], r["role"]), r)
    return tuple(seen[k] for k in sorted(seen, key=lambda k: (k[0], k[3], k[4], k[1], k[2])))


def _elastic(value: Any) -> dict[str, Any]:
    """``elastic_epoch`` and ``origin`` from a state dict's ``elastic`` entry (validated)."""
    if value is None:
        return {}

    def bad(what: str) -> ResumeStateError:
        return ResumeStateError(
            describe(
                "Invalid resume state field 'elastic'",
                expected="None or {'epoch': int, 'origin': [{'world_size', 'num_workers', "
                "'batch_size', 'epoch', 'cursors'}, ...]}",
                found=f"{what}: {repr(value)[:120]}",
                fix="pass the unmodified dict from CursorTracker.state_dict() or load_state()",
            )
        )

    if not isinstance(value, Mapping) or not isinstance(value.get("origin"), list | tuple):
        raise bad("not a dict with an 'origin' list")
    levels = []
    for lv in value["origin"]:
        if not isinstance(lv, Mapping):
            raise bad("a level that is not a dict")
        try:
            cursors = tuple(tuple(_int("elastic.cursor", x) for x in c) for c in lv["cursors"])
            level = Level(
                _int("elastic.world_size", lv["world_size"], minimum=1),
                _workers("elastic.num_workers", lv["num_workers"]),
                _int("elastic.batch_size", lv["batch_size"], minimum=1),
                cursors,
                None if lv["epoch"] is None else _int("elastic.epoch", lv["epoch"]),
            )
        except ResumeStateError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"a malformed level ({type(exc).__name__}: {exc})") from exc
        if any(len(c) != 4 or min(c) < 0 for c in cursors):
            raise bad("a cursor that is not [rank, role, epoch, position]")
        levels.append(level)
    if not levels:
        raise bad("an empty origin")
    return {"elastic_epoch": _int("elastic.epoch", value.get("epoch")), "origin": tuple(levels)}


def _migrate(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """Bring a state dict to :data:`STATE_VERSION`, or refuse it (see the module docstring)."""
    version = data.get("version")
    if version == STATE_VERSION and not isinstance(version, bool):
        return data
    if version == 3 and not isinstance(version, bool):
        logger.info(
            "resume: migrated a resume state from format version 3 to %d (adds kind 'dataset'; "
            "the frames are the same)",
            STATE_VERSION,
        )
        return {**data, "version": STATE_VERSION, "kind": KIND_DATASET}
    if version == 1 and not isinstance(version, bool):
        logger.info(
            "resume: migrated a resume state from format version 1 to %d (it does not record "
            "the robo_resume version that wrote it)",
            STATE_VERSION,
        )
        return {
            **data,
            "version": STATE_VERSION,
            "kind": KIND_DATASET,
            "library_version": UNKNOWN_LIBRARY_VERSION,
            "elastic": None,
        }
    if version == 2 and not isinstance(version, bool):
        logger.info(
            "resume: migrated a resume state from format version 2 to %d (no elastic "
            "remainder epoch)",
            STATE_VERSION,
        )
        return {**data, "version": STATE_VERSION, "kind": KIND_DATASET, "elastic": None}
    lib = data.get("library_version")
    newer = isinstance(version, int) and not isinstance(version, bool) and version > STATE_VERSION
    raise ResumeStateError(
        describe(
            "Unsupported resume state version",
            expected=f"version 1 to {STATE_VERSION} (this is robo_resume {library_version()})",
            found=f"version {version!r}"
            + (f", written by robo_resume {lib}" if isinstance(lib, str) else ""),
            fix=f"upgrade robo_resume to {lib or 'the version that wrote the state'} or newer"
            if newer
            else "resume with the robo_resume version that wrote the state, or restart the "
            "epoch with resume_step",
        )
    )
