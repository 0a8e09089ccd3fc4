"""LeRobot v2.1 metadata: ``meta/episodes.jsonl``, ``meta/tasks.jsonl``."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    DatasetFormatError,
    describe,
)
from .arrow_columns import jsonl_episode_columns
from .episode_table import EpisodeTable, VideoColumns, task_columns
from .meta_files import format_path, posix_inside, read_jsonl, tasks_tuple
from .validate import (
    int_values,
    task_list,
)


def load_v21(
    root: Path, info: dict[str, Any], camera_keys: tuple[str, ...]
) -> tuple[EpisodeTable, tuple[str, ...]]:
    ep_path = root / "meta" / "episodes.jsonl"
    fast = jsonl_episode_columns(ep_path) if ep_path.is_file() else None
    if fast is None:  # row by row: names the first bad line
        ep, length, ep_tasks = _typed_jsonl_episodes(read_jsonl(ep_path), ep_path)
        offsets, task_codes, task_names = task_columns(ep_tasks)
    else:
        ep, length, offsets, task_codes, task_names = fast
    chunks_size = info.get("chunks_size", 1000)
    if not isinstance(chunks_size, int) or isinstance(chunks_size, bool) or chunks_size < 1:
        raise DatasetFormatError(
            describe(
                "meta/info.json has an invalid chunks_size",
                expected="a positive int (episodes per chunk folder, 1000 in lerobot)",
                found=repr(chunks_size)[:80],
                file=root / "meta" / "info.json",
                fix="restore meta/info.json from the published dataset",
            )
        )
    data_tpl = info.get("data_path")
    video_tpl = info.get("video_path")
    if camera_keys and not video_tpl:
        raise DatasetFormatError(
            describe(
                "meta/info.json declares video features but no video_path template",
                expected='"video_path": '
                '"videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"',
                found=f"video features {list(camera_keys)} and no video_path",
                file=root / "meta" / "info.json",
                fix="restore meta/info.json from the published dataset",
            )
        )
    if not data_tpl:
        raise DatasetFormatError(
            describe(
                "meta/info.json has no data_path template",
                expected='"data_path": '
                '"data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"',
                found="none",
                file=root / "meta" / "info.json",
            )
        )
    fps = info["fps"]
    video_paths, data_paths = _episode_paths(
        root, data_tpl, video_tpl, camera_keys, ep, chunks_size
    )
    start = np.zeros(len(ep), dtype=np.int64)
    np.cumsum(length[:-1], out=start[1:])
    to_timestamp = length.astype(np.float64) / fps  # length / fps, as Python divides
    data_file, data_names = _codes(data_paths)
    videos = {}
    for cam in camera_keys:
        codes, names = _codes(video_paths[cam])
        videos[cam] = VideoColumns(
            file=codes,
            paths=names,
            from_timestamp=np.zeros(len(ep)),
            to_timestamp=to_timestamp,
        )
    columns = EpisodeTable(
        episode_index=ep,
        length=length,
        dataset_from_index=start,
        data_row_start=np.zeros(len(ep), dtype=np.int64),
        data_file=data_file,
        data_paths=data_names,
        task_offsets=offsets,
        task_codes=task_codes,
        task_names=task_names,
        videos=videos,
    )
    tasks_path = root / "meta" / "tasks.jsonl"
    trows = read_jsonl(tasks_path)
    bad = [t for t in trows if not isinstance(t, dict) or "task_index" not in t or "task" not in t]
    if bad:
        raise DatasetFormatError(
            describe(
                "An entry of meta/tasks.jsonl lacks task_index or task",
                expected='{"task_index": int, "task": str}',
                found=bad[0],
                file=tasks_path,
                fix="download the dataset's meta/ folder again",
            )
        )
    index = int_values([t["task_index"] for t in trows], "task_index", file=tasks_path)
    pairs = zip(index.tolist(), (str(t["task"]) for t in trows), strict=True)
    tasks = tasks_tuple(pairs, tasks_path)
    return columns, tasks


def _episode_paths(
    root: Path,
    data_tpl: str,
    video_tpl: str | None,
    camera_keys: tuple[str, ...],
    ep: np.ndarray,
    chunks_size: int,
) -> tuple[dict[str, list[str]], list[str]]:
    """Each episode's video path per camera and data path, checked to stay inside the root.

    One file per episode and camera: 3x10^5 paths at 10^5 episodes, so the templates are filled
    with ``format_map`` on reused dicts. An episode whose paths do not pass is checked again by
    :func:`format_path`, which raises the error naming it (episodes in order, cameras before
    the data file, as checked one by one before)."""
    fast = _printf_paths(data_tpl, video_tpl, camera_keys, ep, chunks_size)
    if fast is not None:
        return fast
    video_paths: dict[str, list[str]] = {cam: [] for cam in camera_keys}
    data_paths: list[str] = []
    fields: dict[str, Any] = {"episode_chunk": 0, "episode_index": 0}
    per_cam = {cam: {**fields, "video_key": cam} for cam in camera_keys}
    for k, e in enumerate(ep.tolist()):
        chunk = e // chunks_size
        try:
            for cam, f in per_cam.items():
                f["episode_chunk"], f["episode_index"] = chunk, e
                rel = posix_inside(video_tpl.format_map(f))  # type: ignore[union-attr]
                if rel is None:
                    raise ValueError(cam)
                video_paths[cam].append(rel)
            fields["episode_chunk"], fields["episode_index"] = chunk, e
            rel = posix_inside(data_tpl.format_map(fields))
            if rel is None:
                raise ValueError("data")
            data_paths.append(rel)
        except Exception:
            for cam in camera_keys:  # this episode again, one path at a time: raises
                del video_paths[cam][k:]
                video_paths[cam].append(
                    format_path(
                        video_tpl,  # type: ignore[arg-type]
                        root,
                        what="video",
                        episode=e,
                        episode_chunk=chunk,
                        video_key=cam,
                        episode_index=e,
                    )
                )
            del data_paths[k:]
            data_paths.append(
                format_path(
                    data_tpl, root, what="data", episode=e, episode_chunk=chunk, episode_index=e
                )
            )
    return video_paths, data_paths


_INT_SPEC = re.compile(r"0?[1-9]?\d?d?")  # "", "d", "03d", "06d": printf's %d with a width


def _printf(template: str, video_key: str | None) -> tuple[str, tuple[str, ...]] | None:
    """``template`` as a printf format and the fields it takes in order (``episode_chunk``,
    ``episode_index``; ``video_key`` put in as text), or None when it uses anything else
    (then ``format_map`` it is)."""
    out = []
    order = []
    try:
        parts = list(string.Formatter().parse(template))
    except (ValueError, TypeError):  # not a str.format template: format_map's path names it
        return None
    for literal, field, spec, conv in parts:
        out.append(literal.replace("%", "%%"))
        if field is None:
            continue
        if conv or spec is None:
            return None
        if field == "video_key" and video_key is not None and not spec:
            out.append(video_key.replace("%", "%%"))
        elif field in ("episode_chunk", "episode_index") and _INT_SPEC.fullmatch(spec):
            out.append("%" + spec.rstrip("d") + "d")
            order.append(field)
        else:
            return None
    return "".join(out), tuple(order)


def _printf_paths(
    data_tpl: str,
    video_tpl: str | None,
    camera_keys: tuple[str, ...],
    ep: np.ndarray,
    chunks_size: int,
) -> tuple[dict[str, list[str]], list[str]] | None:
    """:func:`_episode_paths` for the usual templates (``{episode_chunk}`` then
    ``{episode_index}``, integer specs, ``{video_key}``), faster: printf formatting, and
    the inside-root check once per template, since integers put in it add only digits and
    ``-`` (which never make ``..`` or ``/``). None when a template is another kind, or its
    path for the first episode does not pass (the slow path then raises, naming it)."""
    fmts = {cam: _printf(video_tpl, cam) for cam in camera_keys} if video_tpl else {}
    data_fmt = _printf(data_tpl, None)
    if data_fmt is None or any(f is None for f in fmts.values()) or not len(ep):
        return None
    if int(ep.min()) < 0 or chunks_size >= 2**62:
        return None  # what numpy cannot divide by as int64: format_map's path takes it
    values = {"episode_chunk": (ep // chunks_size).tolist(), "episode_index": ep.tolist()}

    def fill(fmt: str, order: tuple[str, ...]) -> list[str] | None:
        cols = [values[k] for k in order]
        paths = [fmt % row for row in zip(*cols, strict=True)] if cols else [fmt % ()] * len(ep)
        return paths if posix_inside(paths[0]) == paths[0] else None

    videos = {cam: fill(*f) for cam, f in fmts.items()}  # type: ignore[misc]
    data = fill(*data_fmt)
    if data is None or any(v is None for v in videos.values()):
        return None
    return videos, data  # type: ignore[return-value]


def _codes(paths: list[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    """``(codes, names)`` with ``names[codes[k]] == paths[k]``, names in order of first use."""
    distinct = dict.fromkeys(paths)
    if len(distinct) == len(paths):  # the usual v2.1 layout: one file per episode
        return np.arange(len(paths), dtype=np.int32), tuple(paths)
    names: dict[str, int] = {}
    codes = np.fromiter((names.setdefault(p, len(names)) for p in paths), np.int32, len(paths))
    return codes, tuple(names)


def _typed_jsonl_episodes(
    rows: list[Any], path: Path
) -> tuple[np.ndarray, np.ndarray, list[tuple[str, ...]]]:
    """meta/episodes.jsonl entries as ``(episode_index, length, tasks)`` columns (int64, int64,
    one tuple of task strings per episode), stably sorted by episode_index (see
    :mod:`.validate`)."""
    for k, r in enumerate(rows):
        if not isinstance(r, dict) or "episode_index" not in r or "length" not in r:
            raise DatasetFormatError(
                describe(
                    f"Line {k + 1} of meta/episodes.jsonl lacks episode_index or length",
                    expected='{"episode_index": int, "tasks": [...], "length": int}',
                    found=repr(r)[:160],
                    file=path,
                    fix="download the dataset's meta/ folder again",
                )
            )
    ep = int_values([r["episode_index"] for r in rows], "episode_index", file=path)
    length = int_values([r["length"] for r in rows], "length", file=path, episodes=ep)
    tasks = [
        task_list(r.get("tasks"), file=path, episode=int(ep[k]), row=k) for k, r in enumerate(rows)
    ]
    order = np.argsort(ep, kind="stable")
    return ep[order], length[order], [tasks[k] for k in order.tolist()]
