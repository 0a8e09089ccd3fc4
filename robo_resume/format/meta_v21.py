"""LeRobot v2.1 metadata: ``meta/episodes.jsonl``, ``meta/tasks.jsonl``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import (
    DatasetFormatError,
    describe,
)
from .meta_files import _format_path, _read_jsonl, _tasks_tuple
from .meta_types import EpisodeInfo, VideoRef
from .validate import (
    int_values,
    task_list,
)


def _load_v21(
    root: Path, info: dict[str, Any], camera_keys: tuple[str, ...]
) -> tuple[list[EpisodeInfo], tuple[str, ...]]:
    ep_path = root / "meta" / "episodes.jsonl"
    rows = _typed_jsonl_episodes(_read_jsonl(ep_path), ep_path)
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
    episodes = []
    start = 0
    for r in rows:
        ep = int(r["episode_index"])
        length = int(r["length"])
        chunk = ep // chunks_size
        videos = {}
        for cam in camera_keys:
            rel = _format_path(
                video_tpl,
                root,
                what="video",
                episode=ep,
                episode_chunk=chunk,
                video_key=cam,
                episode_index=ep,
            )
            videos[cam] = VideoRef(path=rel, from_timestamp=0.0, to_timestamp=length / info["fps"])
        episodes.append(
            EpisodeInfo(
                episode_index=ep,
                length=length,
                dataset_from_index=start,
                data_path=_format_path(
                    data_tpl, root, what="data", episode=ep, episode_chunk=chunk, episode_index=ep
                ),
                data_row_start=0,
                tasks=r["tasks"],
                videos=videos,
            )
        )
        start += length
    tasks_path = root / "meta" / "tasks.jsonl"
    trows = _read_jsonl(tasks_path)
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
    tasks = _tasks_tuple(pairs, tasks_path)
    return episodes, tasks


def _typed_jsonl_episodes(rows: list[Any], path: Path) -> list[dict[str, Any]]:
    """meta/episodes.jsonl entries with int episode_index and length and a tasks tuple, sorted
    by episode_index (see :mod:`.validate`)."""
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
    typed = [
        {
            "episode_index": int(ep[k]),
            "length": int(length[k]),
            "tasks": task_list(r.get("tasks"), file=path, episode=int(ep[k]), row=k),
        }
        for k, r in enumerate(rows)
    ]
    return sorted(typed, key=lambda r: r["episode_index"])
