"""Atomic checkpoint files: a crash while saving leaves the previous checkpoint intact.

:func:`save_checkpoint` (tensors, dicts, lists, tuples, numbers and strings, e.g. ``{"model":
..., "optimizer": ..., "step": s, "data": tracker.state_dict()}``: what :func:`load_checkpoint`
loads safely) and :func:`save_state` (the data
:class:`~robo_resume.state.ResumeState` alone, as JSON) share one atomic write:

1. write to a temporary sibling ``.<name>.<random>.tmp`` in the same folder (same file system,
   so the rename below is atomic), holding an exclusive ``flock`` on it while writing;
2. flush and ``fsync`` it;
3. ``os.replace`` it over the target (atomic on POSIX: readers see the old or the new file,
   never a mix) and ``fsync`` the folder so the rename itself survives a power loss.

A process killed (SIGKILL, OOM, preemption) in steps 1-2 leaves its temporary file behind; the
target is untouched. **Leftover cleanup:** every save, before it creates its own temporary
file, deletes the temporary siblings of the same target whose writer is gone. A writer is gone
when its file's ``flock`` can be taken (the kernel drops the lock when the process dies), so a
save running at the same time in another process is never disturbed. Hence, with one process
saving a target, at most one leftover per target exists (from the last crash, wherever in the
save it landed, the cleanup included), and none once a save completes. On platforms without
``fcntl`` (Windows), leftovers older than :data:`STALE_TMP_AGE_S` are deleted instead.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import torch

from .errors import CorruptFileError, MissingFileError, ResumeStateError, describe
from .state.resume import ResumeState

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "STALE_TMP_AGE_S",
    "atomic_write",
    "load_checkpoint",
    "load_state",
    "save_checkpoint",
    "save_state",
]

STALE_TMP_AGE_S = 3600.0
"""Without ``fcntl``, temporary files older than this (seconds) count as leftovers."""


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}."


def _new_locked_tmp(path: Path) -> tuple[int, str]:
    """Create the temporary sibling and lock it; retry if a cleaner deleted it meanwhile."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
        if fcntl is None:
            return fd, tmp
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink > 0:  # a cleaner may have unlinked it before we locked it
            return fd, tmp
        os.close(fd)


def _remove_stale_tmps(path: Path) -> int:
    """Delete temporary siblings of ``path`` whose writer is gone; returns how many.

    Called before the save creates its own temporary file: a crash during the cleanup then
    leaves no more leftovers than there were, and a crash after it leaves one.
    """
    removed = 0
    prefix = _tmp_prefix(path)
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return 0
    now = time.time()
    for name in names:
        other = os.path.join(path.parent, name)
        try:
            if fcntl is None:
                if now - os.stat(other).st_mtime > STALE_TMP_AGE_S:
                    os.unlink(other)
                    removed += 1
                continue
            fd = os.open(other, os.O_RDONLY)
        except OSError:  # gone already, or not ours to touch
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            os.close(fd)
            continue
        try:
            os.unlink(other)
            removed += 1
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the lock
    return removed


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a temporary sibling that replaces it.

    See the module docstring for the steps and the cleanup of leftovers. If ``write`` raises,
    the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmps(path)
    fd, tmp = _new_locked_tmp(path)
    try:
        with os.fdopen(fd, "wb") as f:  # closing f releases the lock after the rename
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def save_checkpoint(obj: Any, path: str | Path) -> Path:
    """Save ``obj`` with ``torch.save`` to ``path`` atomically.

    A crash while saving leaves the previous file at ``path`` intact.

    Args:
        obj: what to save. Tensors, dicts, lists, tuples, numbers and strings (state dicts,
            the step, the tracker's state) are what :func:`load_checkpoint` loads without
            ``trusted=True``. Other objects are saved too, but loading them needs
            ``trusted=True``.
        path: the file to write (replaced if it exists).

    Returns:
        The path written, as a :class:`~pathlib.Path`.
    """
    return atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path: str | Path, *, trusted: bool = False) -> Any:
    """Load a checkpoint written by :func:`save_checkpoint` (CPU tensors), safely.

    The file is read with ``torch.load(..., weights_only=True)``: tensors, dicts, lists, tuples,
    numbers, strings and the like (what a checkpoint of model, optimizer, step and data state
    holds) load; a file that would need to run pickled code (any other object) is refused, and
    nothing in it runs.

    Args:
        path: a file written by :func:`save_checkpoint`.
        trusted: load with ``weights_only=False`` instead: only for a file you wrote
            yourself, since loading it can run any code pickled into it.

    Returns:
        The saved object, its tensors on the CPU.

    Raises:
        MissingFileError: ``path`` is not a file.
        CorruptFileError: the file holds objects that safe loading refuses (without
            ``trusted``).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            describe(
                "The checkpoint file is missing",
                expected="a file written by save_checkpoint",
                found="no such file",
                file=path,
                fix="check the path, or start without resuming",
            )
        )
    if trusted:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CorruptFileError(
            describe(
                "The checkpoint holds objects that safe loading refuses (loading them would run "
                "code pickled into the file)",
                expected="tensors, dicts, lists, tuples, numbers and strings",
                found=first[:300],
                file=path,
                fix="save only those (e.g. model.state_dict(), optimizer.state_dict(), step, "
                "tracker.state_dict()); for a file you wrote yourself and trust, "
                "load_checkpoint(path, trusted=True)",
            )
        ) from exc


def save_state(state: ResumeState | Mapping[str, Any], path: str | Path) -> Path:
    """Save a resume state as JSON, atomically.

    The state is validated first, so an invalid state never replaces a good file.

    Args:
        state: a :class:`ResumeState` or ``tracker.state_dict()``.
        path: the file to write (replaced if it exists).

    Returns:
        The path written, as a :class:`~pathlib.Path`.

    Raises:
        ResumeStateError: ``state`` is not a valid resume state.
    """
    text = ResumeState.from_dict(state).to_json() + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()))


def load_state(path: str | Path) -> ResumeState:
    """Load and validate a state written by :func:`save_state`.

    Args:
        path: a JSON file written by :func:`save_state`.

    Returns:
        The :class:`ResumeState`; pass it as ``ChunkedEpisodeDataset(..., resume_state=...)``.

    Raises:
        MissingFileError: ``path`` is not a file.
        CorruptFileError: the file is not JSON.
        ResumeStateError: the state is invalid (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            describe(
                "The resume state file is missing",
                expected="a JSON file written by save_state",
                found="no such file",
                file=path,
                fix="check the path, or start without resume_state",
            )
        )
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptFileError(
            describe(
                "The resume state file is not valid JSON",
                expected="a JSON file written by save_state",
                found=f"{type(exc).__name__}: {exc}",
                file=path,
                fix="restore the file from a backup; save_state never leaves a partial file",
            )
        ) from exc
    try:
        return ResumeState.from_dict(data)
    except ResumeStateError as exc:
        raise ResumeStateError(f"{exc} Read from file {path}.") from exc
