"""make_dataset: write a v3.0 or v2.1 dataset with the layouts lerobot writes."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .meta import all_stats, meta_features, write_parquet
from .truth import CODECS, MAX_CAMERAS, MAX_EPISODES, MAX_FRAMES, FactoryDataset, check_size
from .video import write_videos


def make_dataset(
    root: str | Path,
    *,
    version: str = "v3.0",
    episode_lengths: Sequence[int] = (23, 41, 17, 30, 9),
    fps: int = 10,
    num_cameras: int = 1,
    height: int = 48,
    width: int = 64,
    codec: str = "av1",
    gop: int = 2,
    episodes_per_file: int = 2,
    files_per_chunk: int = 2,
    state_dim: int = 4,
    action_dim: int = 3,
    tasks: Sequence[str] = ("pick the cube", "place the cube"),
    overwrite: bool = False,
    progress: bool = False,
) -> FactoryDataset:
    """Write a real LeRobot dataset to ``root`` and return what was written.

    Frame ``i`` of an mp4 is at ``i / fps`` seconds. Data parquet files have row groups of 16
    rows. The dataset is written to a temporary sibling folder and renamed to ``root`` when
    complete.

    Args:
        root: the dataset folder to create; it must not exist unless ``overwrite``.
        version: "v3.0": ``episodes_per_file`` consecutive episodes share one data parquet and
            one mp4 per camera; file numbers roll into the next ``chunk-XXX`` folder after
            ``files_per_chunk`` files (info.json ``chunks_size``). "v2.1": one parquet and one
            mp4 per camera per episode, ``files_per_chunk`` episodes per chunk folder.
        episode_lengths: frames per episode, one entry per episode.
        fps: frames per second.
        num_cameras: cameras ``observation.images.cam0`` .. ``cam{num_cameras - 1}`` (0 to 4).
        height: frame height in pixels (at least 48).
        width: frame width in pixels (at least 64).
        codec: "av1" (libsvtav1, crf 30 and lerobot's default ``gop=2``; preset 8, not
            lerobot's 12, see ``codec_options``), "h264" (libx264 with no scene-cut
            keyframes) or "mpeg4".
        gop: keyframes come exactly every ``gop`` frames of each mp4 (episodes sharing an mp4
            are encoded as one stream).
        episodes_per_file: (v3.0) consecutive episodes per data parquet and mp4.
        files_per_chunk: files (v3.0) or episodes (v2.1) per ``chunk-XXX`` folder.
        state_dim: size of ``observation.state``.
        action_dim: size of ``action``.
        tasks: episode ``e`` has task ``tasks[e % len(tasks)]``.
        overwrite: replace an empty folder or a folder holding a ``meta`` folder (a
            dataset) at ``root``; anything else is left alone and raises ValueError.
        progress: print one line per written file group to stderr.

    Returns:
        A :class:`~robo_resume.testing.truth.FactoryDataset`: the ground truth of what was
        written.

    Raises:
        ValueError: an unknown codec or version, non-positive lengths, sizes or counts, too
            many cameras, episodes or frames for the pixel pattern, images smaller than
            48x64, or ``root`` exists and may not be replaced.
    """
    root = Path(root)
    if codec not in CODECS:
        raise ValueError(f"Unknown codec {codec!r}; expected one of {CODECS}.")
    if version not in ("v3.0", "v2.1"):
        raise ValueError(f"Unknown version {version!r}; expected 'v3.0' or 'v2.1'.")
    lengths = tuple(int(n) for n in episode_lengths)
    if not lengths or min(lengths) <= 0:
        raise ValueError(
            f"episode_lengths must be a non-empty list of positive ints; got {lengths}."
        )
    if len(lengths) > MAX_EPISODES or max(lengths) > MAX_FRAMES:
        raise ValueError(
            f"At most {MAX_EPISODES} episodes of at most {MAX_FRAMES} frames are encodable; "
            f"got {len(lengths)} episodes, the longest {max(lengths)} frames."
        )
    if not 0 <= num_cameras <= MAX_CAMERAS:
        raise ValueError(f"num_cameras must be 0..{MAX_CAMERAS}; got {num_cameras}.")
    if num_cameras:
        check_size(height, width)
    for name, value in (
        ("fps", fps),
        ("gop", gop),
        ("episodes_per_file", episodes_per_file),
        ("files_per_chunk", files_per_chunk),
        ("state_dim", state_dim),
        ("action_dim", action_dim),
    ):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}.")
    tasks = tuple(tasks)
    if not tasks or len(set(tasks)) != len(tasks) or not all(isinstance(t, str) for t in tasks):
        raise ValueError(f"tasks must be a non-empty sequence of distinct strings; got {tasks!r}.")
    if root.exists() or root.is_symlink():
        if not overwrite:
            raise ValueError(
                f"{root} already exists; make_dataset writes a new folder. "
                "Fix: pass overwrite=True or another root."
            )
        if (
            not root.is_dir()
            or root.is_symlink()
            or not ((root / "meta").is_dir() or not any(root.iterdir()))
        ):
            raise ValueError(
                f"{root} exists and does not look like a dataset (no meta/ folder); "
                "overwrite=True only replaces datasets or empty folders. Fix: pass another root."
            )

    cams = tuple(f"observation.images.cam{i}" for i in range(num_cameras))
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    build = FactoryDataset(
        tmp, version, fps, lengths, cams, height, width, codec, gop, tasks, state_dim, action_dim
    )
    try:
        (tmp / "meta").mkdir(parents=True)
        if version == "v3.0":
            _write_v30(build, episodes_per_file, files_per_chunk, progress)
        else:
            _write_v21(build, files_per_chunk, progress)
        stats = all_stats(build, range(len(lengths)))
        (tmp / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return FactoryDataset(
        root, version, fps, lengths, cams, height, width, codec, gop, tasks, state_dim, action_dim
    )


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[robo_resume.testing] {msg}", file=sys.stderr, flush=True)


def _write_v30(ds: FactoryDataset, per_file: int, per_chunk: int, progress: bool) -> None:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(ds.episode_lengths)
    rows = []
    groups = [list(range(s, min(s + per_file, n))) for s in range(0, n, per_file)]
    for number, eps in enumerate(groups):
        chunk, file = divmod(number, per_chunk)
        rel = f"chunk-{chunk:03d}/file-{file:03d}"
        write_parquet(ds, eps, ds.root / "data" / f"{rel}.parquet")
        write_videos(ds, eps, lambda cam, rel=rel: ds.root / "videos" / cam / f"{rel}.mp4")
        _say(progress, f"wrote {rel} (episodes {eps[0]}..{eps[-1]}) of {ds.root}")
        offset = 0  # frames of the earlier episodes of this mp4
        for e in eps:
            length = ds.episode_lengths[e]
            start = ds.dataset_index(e, 0)
            row: dict = {
                "episode_index": e,
                "tasks": [ds.tasks[ds.episode_task_index(e)]],
                "length": length,
                "data/chunk_index": chunk,
                "data/file_index": file,
                "dataset_from_index": start,
                "dataset_to_index": start + length,
            }
            for cam in ds.camera_keys:
                row[f"videos/{cam}/chunk_index"] = chunk
                row[f"videos/{cam}/file_index"] = file
                row[f"videos/{cam}/from_timestamp"] = offset / ds.fps
                row[f"videos/{cam}/to_timestamp"] = (offset + length) / ds.fps
            for key, stats in all_stats(ds, [e]).items():
                for name, value in stats.items():
                    row[f"stats/{key}/{name}"] = value
            row["meta/episodes/chunk_index"] = 0
            row["meta/episodes/file_index"] = 0
            rows.append(row)
            offset += length
    ep_path = ds.root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    ep_path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), ep_path)
    pd.DataFrame(
        {"task_index": np.arange(len(ds.tasks), dtype=np.int64)},
        index=pd.Index(list(ds.tasks), name="task"),
    ).to_parquet(ds.root / "meta" / "tasks.parquet")
    info = {  # lerobot 0.6.1's key order
        "codebase_version": "v3.0",
        "fps": ds.fps,
        "features": meta_features(ds),
        "total_episodes": n,
        "total_frames": ds.total_frames,
        "total_tasks": len(ds.tasks),
        "chunks_size": per_chunk,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": (
            "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
            if ds.camera_keys
            else None
        ),
        "robot_type": None,
        "splits": {"train": f"0:{n}"},
    }
    (ds.root / "meta" / "info.json").write_text(json.dumps(info, indent=4))


def _write_v21(ds: FactoryDataset, per_chunk: int, progress: bool) -> None:
    n = len(ds.episode_lengths)
    meta = ds.root / "meta"
    for e in range(n):
        chunk = e // per_chunk
        name = f"episode_{e:06d}"
        write_parquet(ds, [e], ds.root / "data" / f"chunk-{chunk:03d}" / f"{name}.parquet")
        write_videos(
            ds,
            [e],
            lambda cam, chunk=chunk, name=name: (
                ds.root / "videos" / f"chunk-{chunk:03d}" / cam / f"{name}.mp4"
            ),
        )
        _say(progress, f"wrote episode {e} (chunk-{chunk:03d}) of {ds.root}")

    def jsonl(path: Path, records) -> None:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))

    jsonl(
        meta / "episodes.jsonl",
        (
            {
                "episode_index": e,
                "tasks": [ds.tasks[ds.episode_task_index(e)]],
                "length": ds.episode_lengths[e],
            }
            for e in range(n)
        ),
    )
    jsonl(meta / "tasks.jsonl", ({"task_index": i, "task": t} for i, t in enumerate(ds.tasks)))
    jsonl(
        meta / "episodes_stats.jsonl",
        ({"episode_index": e, "stats": all_stats(ds, [e])} for e in range(n)),
    )
    info = {
        "codebase_version": "v2.1",
        "robot_type": None,
        "total_episodes": n,
        "total_frames": ds.total_frames,
        "total_tasks": len(ds.tasks),
        "total_videos": n * len(ds.camera_keys),
        "total_chunks": -(-n // per_chunk),
        "chunks_size": per_chunk,
        "fps": ds.fps,
        "splits": {"train": f"0:{n}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": (
            "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
            if ds.camera_keys
            else None
        ),
        "features": meta_features(ds),
    }
    (meta / "info.json").write_text(json.dumps(info, indent=4))
