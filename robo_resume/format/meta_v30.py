"""LeRobot v3.0 metadata: ``meta/episodes/*.parquet`` (typed columns), ``meta/tasks.parquet``."""

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
from .meta_files import _format_path, _read_json, _tasks_tuple
from .meta_types import EpisodeInfo, VideoRef
from .validate import (
    float_values,
    int_values,
    task_list,
)


def _load_v30(
    root: Path, info: dict[str, Any], camera_keys: tuple[str, ...]
) -> tuple[list[EpisodeInfo], tuple[str, ...]]:
    import pandas as pd
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
    frames = []
    for f in files:
        try:
            schema = pq.read_schema(f)
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
            table = pd.read_parquet(f, columns=cols)
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
        frames.append(_typed_episodes(table, f, camera_keys))
    df = pd.concat(frames, ignore_index=True).sort_values("episode_index", kind="stable")
    if "dataset_to_index" in df.columns and not df["dataset_to_index"].isna().any():
        spans = df["dataset_to_index"].to_numpy() - df["dataset_from_index"].to_numpy()
        bad = np.flatnonzero(spans != df["length"].to_numpy())
        if bad.size:
            r = df.iloc[int(bad[0])]
            raise MetadataMismatchError(
                describe(
                    "Episode metadata disagrees with itself",
                    expected="dataset_to_index - dataset_from_index == length "
                    f"({int(r['length'])})",
                    found=f"dataset_from_index {int(r['dataset_from_index'])}, "
                    f"dataset_to_index {int(r['dataset_to_index'])}",
                    file=ep_dir,
                    episode=int(r["episode_index"]),
                    fix="download the dataset's meta/ folder again",
                )
            )

    data_tpl = info.get("data_path")
    video_tpl = info.get("video_path")
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

    rows = df.to_dict("records")
    # Row offsets inside shared data files: episodes of one file are stored in index order.
    by_file: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        ep = int(r["episode_index"])
        r["_data_path"] = _format_path(
            data_tpl,
            root,
            what="data",
            episode=ep,
            chunk_index=int(r["data/chunk_index"]),
            file_index=int(r["data/file_index"]),
        )
        by_file.setdefault(r["_data_path"], []).append(r)
    for members in by_file.values():
        members.sort(key=lambda r: int(r["dataset_from_index"]))
        offset = 0
        for r in members:
            r["_row_start"] = offset
            offset += int(r["length"])

    episodes = []
    for r in rows:
        ep = int(r["episode_index"])
        videos = {}
        for cam in camera_keys:
            rel = _format_path(
                video_tpl,
                root,
                what="video",
                episode=ep,
                video_key=cam,
                chunk_index=int(r[f"videos/{cam}/chunk_index"]),
                file_index=int(r[f"videos/{cam}/file_index"]),
            )
            videos[cam] = VideoRef(
                path=rel,
                from_timestamp=float(r[f"videos/{cam}/from_timestamp"]),
                to_timestamp=float(r[f"videos/{cam}/to_timestamp"]),
            )
        episodes.append(
            EpisodeInfo(
                episode_index=ep,
                length=int(r["length"]),
                dataset_from_index=int(r["dataset_from_index"]),
                data_path=r["_data_path"],
                data_row_start=r["_row_start"],
                tasks=r.get("tasks") or (),
                videos=videos,
            )
        )

    tasks_path = root / "meta" / "tasks.parquet"
    if not tasks_path.is_file():
        _read_json(tasks_path)  # standard MissingFileError
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
    pairs = zip(index.tolist(), (str(s) for s in task_strings), strict=True)
    tasks = _tasks_tuple(pairs, tasks_path)
    return episodes, tasks


def _typed_episodes(df: Any, file: Path, camera_keys: tuple[str, ...]) -> Any:
    """One episode metadata file's columns, validated and typed (see :mod:`.validate`)."""
    ep = int_values(df["episode_index"].to_numpy(), "episode_index", file=file)
    typed: dict[str, Any] = {"episode_index": ep}
    ints = ["length", "dataset_from_index", "data/chunk_index", "data/file_index"]
    floats = []
    for cam in camera_keys:
        ints += [f"videos/{cam}/chunk_index", f"videos/{cam}/file_index"]
        floats += [f"videos/{cam}/from_timestamp", f"videos/{cam}/to_timestamp"]
    if "dataset_to_index" in df.columns:
        ints.append("dataset_to_index")
    for c in ints:
        typed[c] = int_values(df[c].to_numpy(), c, file=file, episodes=ep)
    for c in floats:
        typed[c] = float_values(df[c].to_numpy(), c, file=file, episodes=ep)
    if "tasks" in df.columns:
        typed["tasks"] = [
            task_list(t, file=file, episode=int(ep[k]), row=k)
            for k, t in enumerate(df["tasks"].tolist())
        ]
    out = df.assign(**typed)
    bad = np.flatnonzero(out[floats[1::2]].to_numpy() < out[floats[0::2]].to_numpy())
    if bad.size:
        k, j = divmod(int(bad[0]), max(len(camera_keys), 1))
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
    return out
