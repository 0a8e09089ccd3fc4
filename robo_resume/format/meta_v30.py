"""LeRobot v3.0 metadata: ``meta/episodes/*.parquet`` (typed columns), ``meta/tasks.parquet``.

One pipeline read top to bottom: the files' columns, their checks in the order the
per-episode loader made them (so each error names the same first episode), then paths and row
offsets, each vectorised with its per-episode meaning next to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    CorruptFileError,
    DatasetFormatError,
    MetadataMismatchError,
    MissingFileError,
    describe,
)
from .arrow_columns import integers_of, plain_numpy
from .episode_table import EpisodeTable, VideoColumns, take_ragged, task_columns
from .meta_files import format_path, read_json, tasks_tuple
from .validate import (
    float_values,
    int_values,
    task_list,
)


def load_v30(
    root: Path, info: dict[str, Any], camera_keys: tuple[str, ...]
) -> tuple[EpisodeTable, tuple[str, ...]]:
    import pyarrow.parquet as pq

    ep_dir = root / "meta" / "episodes"
    files = sorted(ep_dir.glob("chunk-*/file-*.parquet"))
    if not files:
        raise MissingFileError(
            describe(
                "The episode metadata of a v3.0 dataset is missing",
                expected="meta/episodes/chunk-XXX/file-XXX.parquet files",
                found="none",
                file=ep_dir,
                fix="download the dataset's meta/ folder again",
            )
        )
    need = ["episode_index", "length", "dataset_from_index", "data/chunk_index", "data/file_index"]
    for cam in camera_keys:
        need += [
            f"videos/{cam}/chunk_index",
            f"videos/{cam}/file_index",
            f"videos/{cam}/from_timestamp",
            f"videos/{cam}/to_timestamp",
        ]
    parts = []
    for f in files:
        try:
            parquet = pq.ParquetFile(f)
            schema = parquet.schema_arrow
        except Exception as exc:  # pyarrow raises several types for corrupt footers
            raise CorruptFileError(
                describe(
                    "An episode metadata parquet file cannot be read",
                    expected="a valid parquet file",
                    found=f"{type(exc).__name__}: {exc}",
                    file=f,
                    fix="download the dataset's meta/ folder again",
                )
            ) from exc
        missing = [c for c in need if c not in schema.names]
        if missing:
            raise DatasetFormatError(
                describe(
                    "Episode metadata lacks required columns",
                    expected=f"columns {need}",
                    found=f"missing {missing}",
                    file=f,
                    fix="convert the dataset with lerobot's v3.0 conversion script",
                )
            )
        cols = need + [c for c in ("tasks", "dataset_to_index") if c in schema.names]
        try:
            table = parquet.read(columns=cols)
        except Exception as exc:  # a readable footer over damaged pages
            raise CorruptFileError(
                describe(
                    "An episode metadata parquet file cannot be read",
                    expected="a valid parquet file",
                    found=f"{type(exc).__name__}: {exc}",
                    file=f,
                    fix="download the dataset's meta/ folder again",
                )
            ) from exc
        parts.append(_typed_episodes(table, f, camera_keys))
        del table, parquet  # the columns keep only the buffers they use
    col = _sorted_columns(parts)
    ep = col["episode_index"]
    if "dataset_to_index" in col:
        spans = col["dataset_to_index"] - col["dataset_from_index"]
        bad = np.flatnonzero(spans != col["length"])
        if bad.size:
            k = int(bad[0])
            raise MetadataMismatchError(
                describe(
                    "Episode metadata disagrees with itself",
                    expected="dataset_to_index - dataset_from_index == length "
                    f"({int(col['length'][k])})",
                    found=f"dataset_from_index {int(col['dataset_from_index'][k])}, "
                    f"dataset_to_index {int(col['dataset_to_index'][k])}",
                    file=ep_dir,
                    episode=int(ep[k]),
                    fix="download the dataset's meta/ folder again",
                )
            )

    data_tpl = info.get("data_path")
    video_tpl = info.get("video_path") or ""
    if not data_tpl:
        raise DatasetFormatError(
            describe(
                "meta/info.json has no data_path template",
                expected='"data_path": '
                '"data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"',
                found="none",
                file=root / "meta" / "info.json",
                fix="restore meta/info.json from the published dataset",
            )
        )
    if camera_keys and not video_tpl:
        raise DatasetFormatError(
            describe(
                "meta/info.json declares video features but no video_path template",
                expected="a video_path template",
                found=f"video features {list(camera_keys)}",
                file=root / "meta" / "info.json",
                fix="restore meta/info.json from the published dataset",
            )
        )

    # Paths: formatted once per distinct (chunk_index, file_index), in order of first row, so
    # the first path that fails is the one of the first episode that names it (data paths of
    # every episode first, then video paths row by row, camera by camera, as checked before).
    data_file, data_paths = _paths(
        data_tpl, root, "data", ep, col["data/chunk_index"], col["data/file_index"]
    )
    failures = []
    found_videos = {}
    for j, cam in enumerate(camera_keys):
        try:
            found_videos[cam] = _paths(
                video_tpl,
                root,
                "video",
                ep,
                col[f"videos/{cam}/chunk_index"],
                col[f"videos/{cam}/file_index"],
                video_key=cam,
            )
        except _PathFailure as failure:
            failures.append((failure.row, j, failure.error))
    if failures:
        raise min(failures, key=lambda f: f[:2])[2]
    videos = {
        cam: VideoColumns(
            file=found_videos[cam][0],
            paths=found_videos[cam][1],
            from_timestamp=col[f"videos/{cam}/from_timestamp"],
            to_timestamp=col[f"videos/{cam}/to_timestamp"],
        )
        for cam in camera_keys
    }
    columns = EpisodeTable(
        episode_index=ep,
        length=col["length"],
        dataset_from_index=col["dataset_from_index"],
        data_row_start=_row_starts(data_file, col["dataset_from_index"], col["length"]),
        data_file=data_file,
        data_paths=data_paths,
        task_offsets=col["task_offsets"],
        task_codes=col["task_codes"],
        task_names=col["task_names"],
        videos=videos,
    )

    tasks_path = root / "meta" / "tasks.parquet"
    if not tasks_path.is_file():
        read_json(tasks_path)  # standard MissingFileError
    pairs = _task_pairs(tasks_path)
    tasks = tasks_tuple(pairs, tasks_path)
    return columns, tasks


def _task_pairs(tasks_path: Path) -> Any:
    """``(task_index, task string)`` pairs of ``meta/tasks.parquet``. Read with pyarrow when
    the file is as lerobot writes it (an integer ``task_index`` and the task strings in a
    ``task`` column or the pandas index, no nulls): no pandas import, a slow part of a cold
    start. Anything else goes through pandas, which raises the errors below."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(tasks_path).read()  # read_table imports pyarrow.dataset, pandas
    except Exception:
        table = None  # the pandas path names the error
    if table is not None:
        pairs = _arrow_task_pairs(table, tasks_path)
        if pairs is not None:
            return pairs
    return _pandas_task_pairs(tasks_path)


def _arrow_task_pairs(table: Any, tasks_path: Path) -> Any:
    """The pairs of a well-formed tasks table, or None (then pandas decides)."""
    import pyarrow as pa

    names = table.column_names
    index_cols = (table.schema.pandas_metadata or {}).get("index_columns") or []
    plain = [c for c in names if c not in index_cols]
    if "task" in plain:
        strings = "task"
    elif len(index_cols) == 1 and isinstance(index_cols[0], str) and index_cols[0] in names:
        strings = index_cols[0]
    else:
        return None
    if "task_index" not in plain:
        return None
    idx, txt = table.column("task_index"), table.column(strings)
    if idx.null_count or txt.null_count or not pa.types.is_integer(idx.type):
        return None
    if not (pa.types.is_string(txt.type) or pa.types.is_large_string(txt.type)):
        return None
    index = int_values(plain_numpy(idx), "task_index", file=tasks_path)
    return zip(index.tolist(), txt.to_pylist(), strict=True)


def _pandas_task_pairs(tasks_path: Path) -> Any:
    """The pairs as pandas reads them (the task strings: a ``task`` column, else the index)."""
    import pandas as pd

    try:
        tdf = pd.read_parquet(tasks_path)
    except Exception as exc:
        raise CorruptFileError(
            describe(
                "meta/tasks.parquet cannot be read",
                expected="a parquet table indexed by task string with a task_index column",
                found=f"{type(exc).__name__}: {exc}",
                file=tasks_path,
                fix="download the dataset's meta/ folder again",
            )
        ) from exc
    if "task_index" not in tdf.columns:
        raise DatasetFormatError(
            describe(
                "meta/tasks.parquet has no task_index column",
                expected="columns ['task_index'] with the task string as index",
                found=f"columns {list(tdf.columns)}",
                file=tasks_path,
                fix="download the dataset's meta/ folder again",
            )
        )
    task_strings = tdf.index if "task" not in tdf.columns else tdf["task"]
    index = int_values(tdf["task_index"].to_numpy(), "task_index", file=tasks_path)
    return zip(index.tolist(), (str(s) for s in task_strings), strict=True)


def _numbers(table: Any, name: str) -> np.ndarray:
    """A column as numpy: numeric columns without nulls straight from Arrow, anything else as
    pandas gives it (NaN for nulls, objects for text), which :mod:`.validate` then refuses."""
    col = table.column(name)
    plain = plain_numpy(col)  # copied: a view would keep Arrow's decoded pages resident
    return plain.copy() if plain is not None else col.to_pandas().to_numpy()


def _task_lists(table: Any, file: Path, ep: np.ndarray) -> tuple[Any, Any, tuple[str, ...]]:
    """The ``tasks`` column as ``(offsets, codes, names)`` (see :class:`EpisodeTable`): a
    list-of-strings column without nulls inside the lists is encoded by Arrow
    (:func:`_arrow_task_lists`); anything else goes row by row through
    :func:`~.validate.task_list` (which names the first bad row)."""
    col = table.column("tasks")
    fast = _arrow_task_lists(col)
    if fast is not None:
        return fast
    values = col.to_pandas().tolist()
    return task_columns(
        [task_list(t, file=file, episode=int(ep[k]), row=k) for k, t in enumerate(values)]
    )


def _arrow_task_lists(col: Any) -> tuple[Any, Any, tuple[str, ...]] | None:
    """The columnar fast path of :func:`_task_lists`, or None when ``col`` is not a
    list-of-strings column without null strings (then the row-by-row path decides)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = col.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
        pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
    ):
        return None
    lists = col.combine_chunks()
    flat = lists.flatten()  # the values of non-null lists only
    if flat.null_count:
        return None
    lengths = pc.list_value_length(lists)
    if lengths.null_count:  # fill_null imports pandas: only when there is a null
        lengths = lengths.fill_null(0)
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(integers_of(lengths), out=offsets[1:])
    encoded = pc.dictionary_encode(flat)
    return (
        offsets,
        integers_of(encoded.indices).astype(np.int32),
        tuple(encoded.dictionary.to_pylist()),
    )


def _typed_episodes(table: Any, file: Path, camera_keys: tuple[str, ...]) -> dict[str, Any]:
    """One episode metadata file's columns, validated and typed (see :mod:`.validate`), in the
    file's row order; ``task_offsets``/``task_codes``/``task_names`` encode ``tasks``."""
    ep = int_values(_numbers(table, "episode_index"), "episode_index", file=file)
    typed: dict[str, Any] = {"episode_index": ep}
    ints = ["length", "dataset_from_index", "data/chunk_index", "data/file_index"]
    floats = []
    for cam in camera_keys:
        ints += [f"videos/{cam}/chunk_index", f"videos/{cam}/file_index"]
        floats += [f"videos/{cam}/from_timestamp", f"videos/{cam}/to_timestamp"]
    if "dataset_to_index" in table.column_names:
        ints.append("dataset_to_index")
    for c in ints:
        typed[c] = int_values(_numbers(table, c), c, file=file, episodes=ep)
    for c in floats:
        typed[c] = float_values(_numbers(table, c), c, file=file, episodes=ep)
    if "tasks" in table.column_names:
        offsets, codes, names = _task_lists(table, file, ep)
    else:
        offsets, codes, names = np.zeros(len(ep) + 1, np.int64), np.zeros(0, np.int32), ()
    typed.update(task_offsets=offsets, task_codes=codes, task_names=names)
    if camera_keys:
        ends = np.stack([typed[c] for c in floats[1::2]], axis=1)
        starts = np.stack([typed[c] for c in floats[0::2]], axis=1)
        bad = np.flatnonzero(ends < starts)
    else:
        bad = np.zeros(0, np.int64)
    if bad.size:
        k, j = divmod(int(bad[0]), len(camera_keys))
        cam = camera_keys[j]
        raise DatasetFormatError(
            describe(
                f"Episode metadata's video span of '{cam}' ends before it starts",
                expected=f"videos/{cam}/to_timestamp >= from_timestamp",
                found=f"from_timestamp {typed[floats[2 * j]][k]}, to_timestamp "
                f"{typed[floats[2 * j + 1]][k]} in row {k}",
                file=file,
                episode=int(ep[k]),
                fix="download the dataset's meta/ folder again",
            )
        )
    return typed


def _sorted_columns(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The files' columns concatenated and stably sorted by episode_index (task names merged).

    ``dataset_to_index`` is kept only when every file has it (it is an optional check)."""
    keys = [k for k in parts[0] if not k.startswith("task_")]
    if any("dataset_to_index" not in p for p in parts):
        keys = [k for k in keys if k != "dataset_to_index"]
    if len(parts) == 1:
        col = dict(parts[0])
    else:
        col = {k: np.concatenate([p[k] for p in parts]) for k in keys}
        names: dict[str, int] = {}
        codes, lengths = [], []
        for p in parts:
            remap = [names.setdefault(s, len(names)) for s in p["task_names"]]
            codes.append(np.asarray(remap, np.int32)[p["task_codes"]] if remap else p["task_codes"])
            lengths.append(np.diff(p["task_offsets"]))
        offsets = np.zeros(len(col["episode_index"]) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        col["task_codes"] = np.concatenate(codes).astype(np.int32)
        col["task_offsets"] = offsets
        col["task_names"] = tuple(names)
    offsets = col["task_offsets"]
    ep = col["episode_index"]
    if len(ep) and not (ep[1:] >= ep[:-1]).all():
        order = np.argsort(ep, kind="stable")
        for k in keys:
            col[k] = col[k][order]
        col["task_offsets"], col["task_codes"] = take_ragged(offsets, col["task_codes"], order)
    return col


class _PathFailure(Exception):
    """A path template failed at ``row`` (``error`` is what to raise)."""

    def __init__(self, row: int, error: Exception) -> None:
        super().__init__(str(error))
        self.row, self.error = row, error


def _paths(
    template: str,
    root: Path,
    what: str,
    ep: np.ndarray,
    chunk: np.ndarray,
    file: np.ndarray,
    **extra: Any,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """``(codes, paths)``: row ``k``'s file is ``paths[codes[k]]``, the template filled with its
    ``chunk_index`` and ``file_index`` (checked to stay inside the root). Each distinct pair is
    formatted once, in order of first row; a data path that fails raises its error, a video
    path raises :class:`_PathFailure` carrying the row (the caller picks the first camera)."""
    n = len(ep)
    if n == 0:
        return np.zeros(0, np.int32), ()
    # Runs of equal pairs (consecutive episodes share a file): distinct pairs among the runs.
    change = np.flatnonzero((chunk[1:] != chunk[:-1]) | (file[1:] != file[:-1])) + 1
    run_first = np.concatenate(([0], change))
    run_of_row = np.repeat(np.arange(len(run_first)), np.diff(np.append(run_first, n)))
    rc, rf = chunk[run_first], file[run_first]
    if int(rc.max()) < 2**31 and int(rf.max()) < 2**31:
        _, first, inverse = np.unique((rc << 31) | rf, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(
            np.stack([rc, rf], axis=1), axis=0, return_index=True, return_inverse=True
        )
    first = run_first[first]  # np.unique's first index is the first run, so the first row
    inverse = inverse.reshape(-1)[run_of_row]
    order = np.argsort(first)  # distinct pairs by first row
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    strings: dict[str, int] = {}
    pair_code = np.empty(len(order), dtype=np.int32)
    for r, k in enumerate(first[order].tolist()):
        try:
            rel = format_path(
                template,
                root,
                what=what,
                episode=int(ep[k]),
                chunk_index=int(chunk[k]),
                file_index=int(file[k]),
                **extra,
            )
        except DatasetFormatError as exc:
            if what == "data":
                raise
            raise _PathFailure(k, exc) from None
        pair_code[r] = strings.setdefault(rel, len(strings))
    return pair_code[rank[inverse]], tuple(strings)


def _row_starts(data_file: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Each episode's first row in its data file: episodes sharing a file are stored in
    ``dataset_from_index`` order (ties in episode order), so it is the sum of the lengths of
    the episodes before it in that order."""
    n = len(length)
    f, s = data_file, start
    if ((f[1:] > f[:-1]) | ((f[1:] == f[:-1]) & (s[1:] >= s[:-1]))).all():
        order = np.arange(n)  # the usual layout: already in (file, dataset_from_index) order
    else:
        order = np.lexsort((np.arange(n), start, data_file))
    lengths = length[order]
    before = np.cumsum(lengths) - lengths
    files = data_file[order]
    new_file = np.ones(n, dtype=bool)
    new_file[1:] = files[1:] != files[:-1]
    group_first = np.maximum.accumulate(np.where(new_file, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = before - before[group_first]
    return out
