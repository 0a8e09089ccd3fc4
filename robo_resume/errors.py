"""Exception types raised by robo_resume.

Every error message says what was expected, what was found, where (file, episode, frame when
known) and how to fix it. Messages are built with :func:`describe` so they share one layout.
Each class also derives from the closest builtin (``ValueError``, ``FileNotFoundError``) so
callers that catch builtins keep working.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BROKEN_DATA_ERRORS",
    "BytesNotHeldError",
    "CorruptFileError",
    "DatasetFormatError",
    "MetadataMismatchError",
    "MissingFileError",
    "RemoteChangedError",
    "RemotePathError",
    "RemoteReadError",
    "ResumeStateError",
    "RoboResumeError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "WorkerStartError",
    "describe",
    "format_ranges",
]


def describe(
    problem: str,
    *,
    expected: object | None = None,
    found: object | None = None,
    file: str | Path | None = None,
    episode: int | None = None,
    frame: int | None = None,
    fix: str | None = None,
) -> str:
    """Return a one-paragraph error message in the project's standard layout.

    ``problem`` is a short sentence; the other fields are appended when given, in a fixed
    order, so tests can match them: ``expected ...; found ...; file ...; episode ...;
    frame ...; fix: ...``.
    """
    parts = [problem.rstrip(".") + "."]
    if expected is not None:
        parts.append(f"Expected {expected}.")
    if found is not None:
        parts.append(f"Found {found}.")
    where = []
    if file is not None:
        where.append(f"file {file}")
    if episode is not None:
        where.append(f"episode {episode}")
    if frame is not None:
        where.append(f"frame {frame}")
    if where:
        parts.append("At " + ", ".join(where) + ".")
    if fix:
        parts.append("Fix: " + fix.rstrip(".") + ".")
    return " ".join(parts)


def format_ranges(values: Iterable[int], limit: int | None = None) -> str:
    """Integers as sorted ranges for messages: ``[0, 1, 2, 3, 7, 9, 10]`` -> ``"0-3,7,9-10"``.

    With ``limit``, a longer text is cut after that many characters and ends with how many
    integers there are, e.g. ``"0-3,7,9,... (1000 in all)"``.
    """
    array = values if isinstance(values, np.ndarray) else None
    if isinstance(values, list | tuple | range) and len(values):
        array = np.asarray(values)
    if array is not None and array.dtype.kind in "iu":  # 10^6 episodes: no set of ints
        vals: Any = np.unique(array.reshape(-1)).tolist()
        cut = (np.flatnonzero(np.diff(np.asarray(vals)) != 1) + 1).tolist()
    else:
        vals = sorted({int(v) for v in values})
        cut = [j for j in range(1, len(vals)) if vals[j] != vals[j - 1] + 1]
    out: list[str] = []
    size = -1
    for i, j in zip([0, *cut], [*cut, len(vals)], strict=True) if vals else ():
        out.append(str(vals[i]) if i == j - 1 else f"{vals[i]}-{vals[j - 1]}")
        size += len(out[-1]) + 1
        if limit is not None and size > limit:
            break  # the text is cut before this point anyway
    text = ",".join(out) or "none"
    if limit is not None and len(text) > limit:
        text = text[: text.rfind(",", 0, limit) + 1] + f"... ({len(vals)} in all)"
    return text


class RoboResumeError(Exception):
    """Base class of every error robo_resume raises on purpose."""


class DatasetFormatError(RoboResumeError, ValueError):
    """The dataset's files do not follow the LeRobot format (bad or missing metadata)."""


class UnsupportedVersionError(DatasetFormatError):
    """The dataset uses a LeRobot format version this library does not read (v1.x, v2.0)."""


class UnsupportedFeatureError(DatasetFormatError):
    """The dataset declares a feature kind robo_resume does not read (see format/features.py)."""


class MetadataMismatchError(DatasetFormatError):
    """Metadata and data files disagree (row counts, index ranges, video duration)."""


class CorruptFileError(DatasetFormatError):
    """A parquet or video file exists but cannot be read (truncated, corrupt, wrong content)."""


class BytesNotHeldError(RoboResumeError, OSError):
    """A read of a partly fetched file starts at a byte that was not fetched.

    Raised by ``format.mp4_ranges.RangedFile``: the pieces fetched for the frames decoded were
    too few or wrong.
    """


class MissingFileError(RoboResumeError, FileNotFoundError):
    """A file the metadata points to does not exist."""


class VideoDecodeError(RoboResumeError, RuntimeError):
    """Decoding did not produce the requested frames (timestamps outside tolerance, short video)."""


BROKEN_DATA_ERRORS = (MissingFileError, CorruptFileError, VideoDecodeError, MetadataMismatchError)
"""What reading a broken or missing file of a dataset raises (``on_error="skip"`` skips these)."""


class ResumeStateError(RoboResumeError, ValueError):
    """A resume state does not fit this dataset, plan, seed or topology."""


class RemoteReadError(RoboResumeError, OSError):
    """Reading bytes of a remote file failed after the retries (5xx, reset, timeout, short read).

    The message names the URL (never credentials or query-string tokens), the byte range, the
    attempts made and the last error. Derives from ``OSError`` like a failed local read.
    """


class RemoteChangedError(RoboResumeError, OSError):
    """A remote file's size or ETag differs from what was recorded when it was first read.

    Reading on would mix bytes of two versions of a file; the message names the expected and
    found size/ETag, the URL, and the fix (pin a revision, or clear the metadata cache).
    """


class RemotePathError(RoboResumeError, ValueError):
    """A path from a server or a caller leaves the dataset root (``..``, absolute, backslash)."""


class WorkerStartError(RoboResumeError, TypeError):
    """DataLoader workers cannot start as asked; raised before any worker starts.

    A ``spawn`` or ``forkserver`` worker receives the dataset, transforms and functions by
    pickle and imports the script's main module again: an object that does not pickle, a
    function defined where a fresh interpreter cannot import it (a notebook, stdin), or a script
    that starts workers outside ``if __name__ == "__main__":`` fails there. Derives from
    ``TypeError`` (what this library raised for an unpicklable object before).
    """
