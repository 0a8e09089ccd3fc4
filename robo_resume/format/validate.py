"""Typed, validated metadata columns, and the rule for which files a dataset may open.

Metadata comes from files anyone can edit (JSON, JSON lines, parquet). Every value the loader
computes with is checked once, at load, by the functions here, and converted to a typed numpy
column: integers (no text, NaN, null, bool or fraction; inside a range), finite non-negative
floats, lists of task strings. A bad value raises :class:`~robo_resume.errors.DatasetFormatError`
naming the column, the file, the episode and the fix, instead of a raw ``ValueError`` from
``int(...)`` deep inside planning.

:func:`check_agreement` compares the episode metadata with itself and with info.json
(contiguous ``index`` ranges, ``total_frames``), which also bounds what planning allocates from
declared lengths: a length of 10^12 in one place disagrees with the others.

:func:`inside_root` is the path rule: every file the dataset opens must resolve (symlinks
followed) to a place inside the dataset root, except that a Hugging Face cache snapshot
(``<repo>/snapshots/<commit>``) may link into its own ``<repo>/blobs`` folder.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    DatasetFormatError,
    MetadataMismatchError,
    describe,
)

__all__ = [
    "MAX_EPISODE_FRAMES",
    "MAX_INDEX",
    "check_agreement",
    "check_feature_specs",
    "float_values",
    "inside_root",
    "int_values",
    "task_list",
]

MAX_INDEX = 2**53
"""Largest index, chunk or file number accepted (exact in float64 and in JSON)."""

MAX_EPISODE_FRAMES = 2**27
"""Largest episode length accepted (134M frames: 52 days at 30 fps, 3 days at 500 Hz). It bounds
what planning allocates per episode: a corrupted length is refused at load, in microseconds."""

_META_FIX = "download the dataset's meta/ folder again, or rebuild it with lerobot's tools"


def _bad(name: str, expected: str, value: Any, row: int, file: Path, episode: int | None):
    return DatasetFormatError(
        describe(
            f"Metadata column '{name}' holds an invalid value",
            expected=expected,
            found=f"{value!r} in row {row}",
            file=file,
            episode=episode,
            fix=_META_FIX,
        )
    )


def _episode_at(episodes: Sequence[int] | np.ndarray | None, k: int) -> int | None:
    return int(episodes[k]) if episodes is not None else None


def _array(values: Any) -> np.ndarray:
    """``values`` as an array; a list mixing types stays objects (numpy would make all strings)."""
    if isinstance(values, np.ndarray):
        return values
    values = list(values)
    kinds = {type(v) for v in values}
    if kinds <= {int} or kinds <= {float} or kinds <= {int, float}:
        try:
            return np.asarray(values, dtype=np.int64 if kinds <= {int} else np.float64)
        except OverflowError:
            pass
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def int_values(
    values: Any,
    name: str,
    *,
    file: Path,
    episodes: Sequence[int] | np.ndarray | None = None,
    minimum: int = 0,
    maximum: int = MAX_INDEX,
) -> np.ndarray:
    """``values`` as an int64 column; refuses text, null, NaN, bools, fractions and out-of-range
    values with a DatasetFormatError naming ``name``, ``file`` and the row's episode."""
    expected = f"integers in [{minimum}, {maximum}]"
    a = _array(values)
    if a.dtype.kind in "iu":
        out = a.astype(np.int64, copy=False) if a.dtype.kind == "i" else None
        if out is None:  # unsigned: values above int64 must not wrap
            big = np.flatnonzero(a > maximum)
            if big.size:
                k = int(big[0])
                raise _bad(name, expected, a[k].item(), k, file, _episode_at(episodes, k))
            out = a.astype(np.int64)
    elif a.dtype.kind == "f":
        ok = np.isfinite(a) & (a == np.round(a)) & (np.abs(a) <= maximum)
        if not ok.all():
            k = int(np.flatnonzero(~ok)[0])
            raise _bad(name, expected, a[k].item(), k, file, _episode_at(episodes, k))
        out = a.astype(np.int64)
    else:  # object, strings, bools: element by element
        flat = a.ravel().tolist() if a.ndim else [a.item()]
        out = np.empty(len(flat), dtype=np.int64)
        for k, v in enumerate(flat):
            ok = isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)
            if not ok and isinstance(v, float | np.floating):
                ok = math.isfinite(v) and float(v).is_integer()
            if not ok or abs(int(v)) > maximum:
                raise _bad(name, expected, v, k, file, _episode_at(episodes, k))
            out[k] = int(v)
    if out.size and (out.min() < minimum or out.max() > maximum):  # rare: then find the row
        k = int(np.flatnonzero((out < minimum) | (out > maximum))[0])
        raise _bad(name, expected, int(out[k]), k, file, _episode_at(episodes, k))
    return out


def float_values(
    values: Any,
    name: str,
    *,
    file: Path,
    episodes: Sequence[int] | np.ndarray | None = None,
    minimum: float = 0.0,
) -> np.ndarray:
    """``values`` as a float64 column of finite numbers ``>= minimum`` (else DatasetFormatError)."""
    expected = f"finite numbers >= {minimum:g}"
    a = _array(values)
    if a.dtype.kind not in "iuf":
        flat = a.ravel().tolist() if a.ndim else [a.item()]
        for k, v in enumerate(flat):
            if not isinstance(v, int | float | np.integer | np.floating) or isinstance(v, bool):
                raise _bad(name, expected, v, k, file, _episode_at(episodes, k))
        a = np.asarray(flat, dtype=np.float64)
    a = a.astype(np.float64, copy=False)
    ok = np.isfinite(a) & (a >= minimum)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        raise _bad(name, expected, a[k].item(), k, file, _episode_at(episodes, k))
    return a


def task_list(value: Any, *, file: Path, episode: int | None, row: int) -> tuple[str, ...]:
    """An episode's ``tasks`` entry as a tuple of strings (None or missing: no tasks)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, np.ndarray | list | tuple) and all(isinstance(t, str) for t in value):
        return tuple(value)
    raise _bad("tasks", "a list of task strings", value, row, file, episode)


def check_feature_specs(features: Mapping[str, Any], info_path: Path) -> None:
    """Every feature is ``{"dtype": str, "shape": [int >= 0, ...], ...}``; an ``image``
    feature's shape has 3 dimensions."""
    for key, ft in features.items():
        problem = None
        if not isinstance(ft, Mapping):
            problem = f"a {type(ft).__name__}"
        elif not isinstance(ft.get("dtype"), str):
            problem = f"dtype {ft.get('dtype')!r}"
        else:
            shape = ft.get("shape")
            if not isinstance(shape, list | tuple) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_INDEX
                for d in shape
            ):
                problem = f"shape {shape!r}"
        if problem is None and ft["dtype"] == "image" and len(ft["shape"]) != 3:
            problem = f"image shape {list(ft['shape'])} (an image has 3 dimensions)"
        if problem is not None:
            raise DatasetFormatError(
                describe(
                    f"meta/info.json's feature '{key}' is malformed",
                    expected='an object like {"dtype": "float32", "shape": [7], "names": [...]}',
                    found=problem[:120],
                    file=info_path,
                    fix="restore meta/info.json from the published dataset",
                )
            )


def check_agreement(
    root: Path,
    info: Mapping[str, Any],
    episode_index: np.ndarray,
    length: np.ndarray,
    dataset_from_index: np.ndarray,
) -> None:
    """Episode metadata agrees with itself and info.json (columns sorted by episode_index).

    - every ``length`` is in ``[1, MAX_EPISODE_FRAMES]``;
    - global ``index`` ranges are contiguous: episode ``k+1`` starts where ``k`` ends;
    - ``total_frames`` of info.json (when it gives one) is the sum of the lengths. lerobot's
      ``len(LeRobotDataset)`` is that number, so a disagreement is a broken dataset, and it
      catches a corrupted length before planning allocates anything from it.
    """
    meta = root / "meta"
    bad = np.flatnonzero((length < 1) | (length > MAX_EPISODE_FRAMES))
    if bad.size:
        k = int(bad[0])
        raise DatasetFormatError(
            describe(
                "An episode has no frames" if length[k] < 1 else "An episode is impossibly long",
                expected="length >= 1" if length[k] < 1 else f"length <= {MAX_EPISODE_FRAMES}",
                found=f"length {int(length[k])}",
                file=meta,
                episode=int(episode_index[k]),
                fix="remove the empty episode from the dataset, or select the other episodes "
                "with episodes=[...]"
                if length[k] < 1
                else _META_FIX,
            )
        )
    ends = dataset_from_index + length
    gap = np.flatnonzero(dataset_from_index[1:] != ends[:-1])
    if gap.size:
        k = int(gap[0]) + 1
        raise MetadataMismatchError(
            describe(
                "Episode metadata's index ranges are not contiguous",
                expected=f"dataset_from_index {int(ends[k - 1])} (where episode "
                f"{int(episode_index[k - 1])} ends: its dataset_from_index "
                f"{int(dataset_from_index[k - 1])} + length {int(length[k - 1])})",
                found=f"dataset_from_index {int(dataset_from_index[k])}",
                file=meta,
                episode=int(episode_index[k]),
                fix=_META_FIX,
            )
        )
    total = info.get("total_frames")
    if isinstance(total, int) and not isinstance(total, bool):
        found = int(length.sum(dtype=np.int64))
        if found != total:
            raise MetadataMismatchError(
                describe(
                    "The episode lengths disagree with meta/info.json's total_frames",
                    expected=f"lengths summing to total_frames={total} (meta/info.json)",
                    found=f"lengths summing to {found} over {len(length)} episodes "
                    f"(longest: episode {int(episode_index[int(np.argmax(length))])}, "
                    f"{int(length.max())} frames)",
                    file=meta,
                    fix=_META_FIX,
                )
            )


def _allowed_roots(root: Path) -> tuple[Path, ...]:
    real = root.resolve()
    if real.parent.name == "snapshots":  # huggingface_hub's cache: <repo>/snapshots/<commit>
        return real, real.parent.parent / "blobs"
    return (real,)


@functools.lru_cache(maxsize=65536)
def _resolve_inside(root: Path, rel: str) -> str | None:
    """The real path of ``root / rel``, or None when it lies outside the allowed places."""
    real = (root / rel).resolve()
    for base in _allowed_roots(root):
        if real == base or real.is_relative_to(base):
            return str(real)
    return None


def inside_root(root: Path, rel: str | Path, *, episode: int | None = None) -> Path:
    """``root / rel`` after checking it resolves inside the dataset (see the module docstring).

    Returns the unresolved path (messages keep naming the file the metadata names). Raises
    DatasetFormatError naming the file, where it leads and the fix. Cached per path.
    """
    root = Path(root)
    path = root / rel
    if _resolve_inside(root, str(rel)) is None:
        raise DatasetFormatError(
            describe(
                "A dataset file resolves to a place outside the dataset root",
                expected=f"a file inside {root.resolve()} (symlinks followed; a Hugging Face "
                "cache snapshot may also link into its own ../../blobs)",
                found=f"{path} -> {path.resolve()}",
                file=path,
                episode=episode,
                fix="copy the file into the dataset folder instead of linking it, or point root "
                "at the dataset the link leads to",
            )
        )
    return path
