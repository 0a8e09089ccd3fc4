"""Reading metadata files, shared by both versions: JSON and JSON lines with clear errors,
info.json and its path templates (every path checked to stay inside the dataset root).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    CorruptFileError,
    DatasetFormatError,
    MissingFileError,
    UnsupportedVersionError,
    describe,
)
from .features import check_features
from .meta_types import CONVERT_HINT, SUPPORTED_VERSIONS
from .validate import (
    check_feature_specs,
    inside_root,
)


def read_text(path: Path) -> str:
    """The text of the metadata file ``path``, decoded as UTF-8 (what JSON is).

    Raises:
        CorruptFileError: bytes that are not UTF-8, naming the file, the byte offset, the line
            and the column of the first bad byte (a partial download, or a file saved in
            another encoding).
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise CorruptFileError(
            describe(
                "A metadata file is not valid UTF-8 text",
                expected="UTF-8 text (JSON and JSON lines are UTF-8)",
                found=f"byte 0x{data[exc.start]:02x} at byte offset {exc.start} (line {line}, "
                f"column {column}): {exc.reason}",
                file=path,
                fix="restore the file from the published dataset (a partial download, or a "
                "file saved in another encoding, leaves bytes that are not UTF-8)",
            )
        ) from exc


def read_json(path: Path) -> Any:
    """The JSON document in ``path``.

    Raises:
        MissingFileError: no file at ``path``.
        CorruptFileError: bytes that are not UTF-8 (see :func:`read_text`) or text that is not
            JSON, naming the file.
    """
    if not path.is_file():
        raise MissingFileError(
            describe(
                "A metadata file is missing",
                expected=f"{path.name} in {path.parent}",
                found="no such file",
                file=path,
                fix="point `root` at the dataset folder that holds meta/, data/ and videos/, "
                "or download the dataset again",
            )
        )
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptFileError(
            describe(
                "A metadata file is not valid JSON",
                expected="a JSON document",
                found=f"{type(exc).__name__}: {exc}",
                file=path,
                fix="restore the file from the published dataset",
            )
        ) from exc


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # not in typeshed; what json.loads runs on the text after its whitespace


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON values of the lines of ``path`` (blank lines skipped).

    Raises:
        MissingFileError: no file at ``path``.
        CorruptFileError: bytes that are not UTF-8 (see :func:`read_text`) or a line that is
            not JSON, naming the file and the line.
    """
    if not path.is_file():
        read_json(path)  # raises MissingFileError with the standard message
    rows = []
    scan = _SCAN  # json.loads per line, without its per-call Python wrappers
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        text = line.strip(" \t\n\r")  # the whitespace json.loads skips around a value
        try:
            value, end = scan(text, 0)
        except (StopIteration, ValueError):
            end = -1
        if end == len(text):
            rows.append(value)
            continue
        try:  # not one JSON value: json.loads gives the error (or accepts what it accepts)
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise CorruptFileError(
                describe(
                    f"Line {lineno} of a JSON-lines metadata file is not valid JSON",
                    expected="one JSON object per line",
                    found=repr(line[:80]),
                    file=path,
                    fix="restore the file from the published dataset",
                )
            ) from exc
    return rows


def posix_inside(rel: str) -> str | None:
    """``rel`` as a POSIX path, or None if it is absolute or climbs out with ``..``.

    A plain relative path (no leading ``/`` or ``.``, no ``//``, ``/.`` or trailing ``/``)
    is already in that form and is returned as is without building a Path (v2.1 names one
    file per episode and camera: 3x10^5 paths at 10^5 episodes)."""
    if rel and rel[0] not in "./" and rel[-1] != "/" and "//" not in rel and "/." not in rel:
        return rel
    return _posix_inside_slow(rel)


@functools.lru_cache(maxsize=65536)
def _posix_inside_slow(rel: str) -> str | None:
    p = Path(rel)
    return None if p.is_absolute() or ".." in p.parts else p.as_posix()


def _check_relative(root: Path, rel: str, *, what: str, episode: int) -> str:
    """Refuse paths that escape the dataset root (``..`` or absolute)."""
    posix = posix_inside(rel)
    if posix is None:
        raise DatasetFormatError(
            describe(
                f"A {what} path escapes the dataset root",
                expected="a path relative to the dataset root without '..'",
                found=rel,
                file=root / "meta" / "info.json",
                episode=episode,
                fix="fix data_path/video_path in meta/info.json",
            )
        )
    return posix


def format_path(template: str, root: Path, *, what: str, episode: int, **fields: Any) -> str:
    try:
        rel = template.format(**fields)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise DatasetFormatError(
            describe(
                f"meta/info.json's {what} template cannot be filled",
                expected=f"placeholders among {sorted(fields)}",
                found=repr(template),
                file=root / "meta" / "info.json",
                episode=episode,
                fix="fix the template in meta/info.json",
            )
        ) from exc
    return _check_relative(root, rel, what=what, episode=episode)


def load_info(root: Path) -> dict[str, Any]:
    info_path = root / "meta" / "info.json"
    if root.exists() and not root.is_dir():
        raise DatasetFormatError(
            describe(
                "The dataset root is a file, not a folder",
                expected="a folder holding meta/info.json",
                found=f"a file of {root.stat().st_size} bytes at {root}",
                file=root,
                fix="pass the folder of a LeRobot dataset (v3.0 or v2.1) as root, not a file in it",
            )
        )
    if not root.is_dir():
        raise MissingFileError(
            describe(
                "The dataset root does not exist",
                expected="a folder holding meta/info.json",
                found=f"nothing at {root}",
                file=root,
                fix="pass the folder of a LeRobot dataset (v3.0 or v2.1) as root",
            )
        )
    for entry in sorted((root / "meta").rglob("*")) if (root / "meta").is_dir() else ():
        inside_root(root, entry.relative_to(root))  # links out of the dataset are refused
    info = read_json(info_path)
    if not isinstance(info, dict):
        raise DatasetFormatError(
            describe(
                "meta/info.json is not a JSON object",
                expected="an object with codebase_version, fps and features",
                found=type(info).__name__,
                file=info_path,
                fix="restore meta/info.json from the published dataset",
            )
        )
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        v = str(version)
        hint = CONVERT_HINT["v1"] if v.startswith("v1") else CONVERT_HINT.get(v)
        raise UnsupportedVersionError(
            describe(
                "Unsupported LeRobot dataset version",
                expected=" or ".join(SUPPORTED_VERSIONS),
                found=f"codebase_version={version!r}",
                file=info_path,
                fix=hint
                or "convert the dataset to v3.0 with lerobot's conversion scripts "
                "(python -m lerobot.datasets.v30.convert_dataset_v21_to_v30)",
            )
        )
    for key in ("fps", "features"):
        if key not in info:
            raise DatasetFormatError(
                describe(
                    f"meta/info.json has no '{key}'",
                    expected=f"a '{key}' entry (every LeRobot {version} dataset has one)",
                    found=f"keys {sorted(info)}",
                    file=info_path,
                    fix="restore meta/info.json from the published dataset",
                )
            )
    fps = info["fps"]
    number = isinstance(fps, int | float) and not isinstance(fps, bool)
    if not number or not math.isfinite(fps) or fps <= 0:  # NaN and inf: no frame rate
        raise DatasetFormatError(
            describe(
                "meta/info.json has an invalid fps",
                expected="a positive finite number (frames per second)",
                found=repr(fps),
                file=info_path,
                fix="set fps in meta/info.json to the rate the dataset was recorded at",
            )
        )
    if not isinstance(info["features"], dict) or not info["features"]:
        raise DatasetFormatError(
            describe(
                "meta/info.json has invalid features",
                expected="a non-empty object mapping feature names to {dtype, shape}",
                found=repr(info["features"])[:120],
                file=info_path,
                fix="restore meta/info.json from the published dataset",
            )
        )
    check_features(info["features"], info_path)  # depth maps, misnamed language columns
    check_feature_specs(info["features"], info_path)  # dtypes and shapes
    return info


def check_unique(root: Path, idx: np.ndarray) -> None:
    """Refuse a repeated episode_index (``idx`` is sorted)."""
    dup = np.flatnonzero(idx[1:] == idx[:-1])  # episodes are sorted by episode_index
    if dup.size:
        e = int(idx[dup[0]])
        raise DatasetFormatError(
            describe(
                "An episode appears twice in the episode metadata",
                expected="each episode_index once",
                found=f"episode_index {e} twice",
                file=root / "meta",
                episode=e,
                fix="download the dataset's meta/ folder again",
            )
        )


def tasks_tuple(pairs: Any, path: Path) -> tuple[str, ...]:
    mapping = dict(pairs)
    n = len(mapping)
    if sorted(mapping) != list(range(n)):
        raise DatasetFormatError(
            describe(
                "Task indices are not 0..N-1",
                expected=f"task_index values 0..{n - 1}",
                found=sorted(mapping)[:20],
                file=path,
                fix="download the dataset's meta/ folder again",
            )
        )
    return tuple(mapping[i] for i in range(n))
