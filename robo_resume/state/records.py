"""Field checks of a state: bounded integers, worker counts, skip records, the elastic chain."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from ..errors import ResumeStateError, describe
from ..index.elastic import Level

MAX_WORKERS = 128
"""Most DataLoader workers per rank a stream table holds (and a resume state may name)."""

MAX_STATE_INT = 2**53
"""Largest epoch, position, batch count or rank a state may hold: exact in JSON and float64,
and far from int64's limit, so arithmetic on it (epochs x batches, shared int64 tables) cannot
overflow."""


def as_int(name: str, value: Any, *, minimum: int = 0, maximum: int = MAX_STATE_INT) -> int:
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


def workers_of(name: str, value: Any) -> int:
    """A worker count: an int in ``[0, MAX_WORKERS]``, the limit named in the message."""
    as_int(name, value)
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


def skip_record(r: Any) -> dict[str, Any]:
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


def skipped_list(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list | tuple):
        raise ResumeStateError(
            describe(
                "Invalid resume state field 'skipped'",
                expected="a list of skipped-chunk dicts",
                found=repr(value)[:80],
            )
        )
    return tuple(skip_record(r) for r in value)


def merge_skipped(a: Any, b: Any) -> tuple[dict[str, Any], ...]:
    """Union of two ranks' skip records, in (epoch, rank, role, chunk, start) order."""
    seen: dict[tuple[int, ...], dict[str, Any]] = {}
    for r in (*a, *b):
        seen.setdefault((r["epoch"], r["chunk"], r["start"], r["rank"], r["role"]), r)
    return tuple(seen[k] for k in sorted(seen, key=lambda k: (k[0], k[3], k[4], k[1], k[2])))


def elastic_record(value: Any) -> dict[str, Any]:
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
            cursors = tuple(tuple(as_int("elastic.cursor", x) for x in c) for c in lv["cursors"])
            level = Level(
                as_int("elastic.world_size", lv["world_size"], minimum=1),
                workers_of("elastic.num_workers", lv["num_workers"]),
                as_int("elastic.batch_size", lv["batch_size"], minimum=1),
                cast("tuple[tuple[int, int, int, int], ...]", cursors),  # 4 each: checked below
                None if lv["epoch"] is None else as_int("elastic.epoch", lv["epoch"]),
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
    return {"elastic_epoch": as_int("elastic.epoch", value.get("epoch")), "origin": tuple(levels)}


def check_resume_step(step: Any, batch_size: int) -> int:
    """``resume_step`` (frames consumed by this rank: batches x batch_size) as a batch count.

    Raises ValueError for a negative value, a non-int or one that is not a multiple of
    ``batch_size``, and ResumeStateError past any run's length (:data:`MAX_STATE_INT` batches).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or step % batch_size:
        raise ValueError(
            describe(
                "resume_step must be a non-negative multiple of batch_size",
                expected=f"step * batch_size (a multiple of {batch_size})",
                found=repr(step),
                fix="pass resume_step=step * batch_size, where step counts this rank's batches "
                "since the start of the run",
            )
        )
    if step // batch_size > MAX_STATE_INT:
        raise ResumeStateError(
            describe(
                "resume_step is beyond any run's length",
                expected=f"resume_step // batch_size <= {MAX_STATE_INT} batches",
                found=f"resume_step={step}",
                fix="pass resume_step=step * batch_size with the step of your checkpoint",
            )
        )
    return step // batch_size
