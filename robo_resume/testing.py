"""Dataset factory: writes real LeRobot datasets (v3.0 and v2.1) with known ground truth.

Used by the tests, the demo and the benchmarks, and public so users can try robo_resume without
downloading anything. Every frame's pixels encode ``(episode, frame, camera)`` in a grid of large
black and white cells with a checksum (:func:`frame_image`, :func:`decode_frame_identity`), which
survives AV1, h264 and mpeg4 compression; every row's values encode ``(episode, frame)`` exactly
(:func:`expected_state`, :func:`expected_action`). A test can therefore tell that a decoded frame
or a row is exactly the one it asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "CODECS",
    "FactoryDataset",
    "decode_frame_identity",
    "expected_action",
    "expected_state",
    "frame_image",
    "make_dataset",
]

CODECS = ("av1", "h264", "mpeg4")
_ENCODER = {"av1": "libsvtav1", "h264": "libx264", "mpeg4": "mpeg4"}
_ROWS, _COLS = 6, 8  # 48 cells: 14 bits episode, 16 bits frame, 2 bits camera, 16 bits checksum
_LOW, _HIGH = 30, 225
MIN_CELL = 8


@dataclass(frozen=True)
class FactoryDataset:
    """What :func:`make_dataset` wrote (the ground truth tests compare against)."""

    root: Path
    version: str
    fps: int
    episode_lengths: tuple[int, ...]
    camera_keys: tuple[str, ...]
    height: int
    width: int
    codec: str
    gop: int
    tasks: tuple[str, ...]
    state_dim: int
    action_dim: int

    @property
    def total_frames(self) -> int:
        """Frames over all episodes."""
        return sum(self.episode_lengths)

    def episode_task_index(self, episode_index: int) -> int:
        """The task index of an episode (``episode_index % len(tasks)``)."""
        return episode_index % len(self.tasks)

    def dataset_index(self, episode_index: int, frame_index: int) -> int:
        """The global ``index`` value of a frame."""
        return sum(self.episode_lengths[:episode_index]) + frame_index


def expected_state(episode_index: int, frame_index: int, dim: int) -> np.ndarray:
    """``observation.state`` of a frame: ``[episode, frame, 1000*episode+frame, 0.5, 1.5, ...]``."""
    base = [episode_index, frame_index, episode_index * 1000 + frame_index]
    extra = [0.5 + k for k in range(max(0, dim - 3))]
    return np.asarray((base + extra)[:dim], dtype=np.float32)


def expected_action(episode_index: int, frame_index: int, dim: int) -> np.ndarray:
    """``action`` of a frame: ``[frame + 0.25, -episode, 0.125, ...]`` (exact in float32)."""
    base = [frame_index + 0.25, -float(episode_index)]
    extra = [0.125 * (k + 1) for k in range(max(0, dim - 2))]
    return np.asarray((base + extra)[:dim], dtype=np.float32)


def _bits(episode: int, frame: int, camera: int) -> list[int]:
    payload = (episode & 0x3FFF) << 18 | (frame & 0xFFFF) << 2 | (camera & 0x3)
    check = zlib.crc32(payload.to_bytes(4, "little")) & 0xFFFF
    word = payload << 16 | check
    return [(word >> (47 - i)) & 1 for i in range(48)]


def _check_size(height: int, width: int) -> None:
    if height // _ROWS < MIN_CELL or width // _COLS < MIN_CELL:
        raise ValueError(
            f"Images of {height}x{width} are too small for the identity pattern; expected at "
            f"least {_ROWS * MIN_CELL}x{_COLS * MIN_CELL} (height x width). "
            "Fix: pass height>=48 and width>=64."
        )


def frame_image(
    episode_index: int, frame_index: int, camera: int, height: int, width: int
) -> np.ndarray:
    """The RGB uint8 ``(height, width, 3)`` image the factory writes for a frame."""
    _check_size(height, width)
    if not (0 <= episode_index < 2**14 and 0 <= frame_index < 2**16 and 0 <= camera < 4):
        raise ValueError("episode < 16384, frame < 65536 and camera < 4 are encodable")
    cells = np.asarray(_bits(episode_index, frame_index, camera), dtype=np.uint8).reshape(
        _ROWS, _COLS
    )
    ch, cw = height // _ROWS, width // _COLS
    img = np.full((height, width), _LOW, dtype=np.uint8)
    block = np.where(cells == 1, _HIGH, _LOW).astype(np.uint8)
    img[: ch * _ROWS, : cw * _COLS] = np.kron(block, np.ones((ch, cw), dtype=np.uint8))
    return np.repeat(img[:, :, None], 3, axis=2)


def decode_frame_identity(image) -> tuple[int, int, int]:
    """Read ``(episode, frame, camera)`` back from a decoded frame.

    Accepts uint8 HWC, uint8 CHW, or float CHW in [0, 1] (numpy or torch). Raises ValueError when
    the checksum does not match (not a factory frame, or damaged beyond recognition).
    """
    a = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[2] not in (1, 3):
        a = np.moveaxis(a, 0, 2)
    elif a.ndim == 3 and a.shape[0] == 3 and a.shape[2] == 3 and a.dtype != np.uint8:
        a = np.moveaxis(a, 0, 2)
    a = a.astype(np.float32)
    if a.max() <= 1.0:
        a = a * 255
    gray = a.mean(axis=2)
    h, w = gray.shape
    ch, cw = h // _ROWS, w // _COLS
    bits = []
    for r in range(_ROWS):
        for c in range(_COLS):
            cell = gray[
                r * ch + ch // 4 : r * ch + ch - ch // 4, c * cw + cw // 4 : c * cw + cw - cw // 4
            ]
            bits.append(1 if cell.mean() > 128 else 0)
    word = 0
    for b in bits:
        word = word << 1 | b
    payload, check = word >> 16, word & 0xFFFF
    if zlib.crc32(payload.to_bytes(4, "little")) & 0xFFFF != check:
        raise ValueError("frame identity checksum mismatch: not a factory frame or damaged")
    return payload >> 18, (payload >> 2) & 0xFFFF, payload & 0x3


def _encode_video(
    path: Path, frames: Sequence[np.ndarray], *, fps: int, codec: str, gop: int
) -> None:
    import av

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its config otherwise
    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    if codec == "av1":
        options = {"g": str(gop), "crf": "30"}
    elif codec == "h264":
        options = {
            "g": str(gop),
            "crf": "18",
            "preset": "veryfast",
            "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0",
        }
    else:
        options = {"g": str(gop)}
    with av.open(str(path), "w") as out:
        stream = out.add_stream(_ENCODER[codec], fps, options=options)
        stream.pix_fmt = "yuv420p"
        stream.width, stream.height = w, h
        if codec == "mpeg4":
            stream.bit_rate = 4_000_000
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _features(cams, h, w, state_dim, action_dim, codec, fps):
    feats = {}
    for cam in cams:
        feats[cam] = {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": h,
                "video.width": w,
                "video.codec": codec,
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    feats["observation.state"] = {"dtype": "float32", "shape": [state_dim], "names": None}
    feats["action"] = {"dtype": "float32", "shape": [action_dim], "names": None}
    for k, dt in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        feats[k] = {"dtype": dt, "shape": [1], "names": None}
    return feats


def _table(ds: FactoryDataset, episodes: Sequence[int]):
    import pyarrow as pa

    cols = {
        k: []
        for k in (
            "observation.state",
            "action",
            "timestamp",
            "frame_index",
            "episode_index",
            "index",
            "task_index",
        )
    }
    for e in episodes:
        n = ds.episode_lengths[e]
        start = ds.dataset_index(e, 0)
        cols["observation.state"] += [expected_state(e, f, ds.state_dim) for f in range(n)]
        cols["action"] += [expected_action(e, f, ds.action_dim) for f in range(n)]
        cols["timestamp"].append(np.arange(n, dtype=np.float32) / np.float32(ds.fps))
        cols["frame_index"].append(np.arange(n, dtype=np.int64))
        cols["episode_index"].append(np.full(n, e, dtype=np.int64))
        cols["index"].append(np.arange(start, start + n, dtype=np.int64))
        cols["task_index"].append(np.full(n, ds.episode_task_index(e), dtype=np.int64))

    def vec(rows, dim):
        flat = pa.array(np.concatenate(rows).astype(np.float32))
        return pa.FixedSizeListArray.from_arrays(flat, dim)

    return pa.table(
        {
            "observation.state": vec(cols["observation.state"], ds.state_dim),
            "action": vec(cols["action"], ds.action_dim),
            "timestamp": pa.array(np.concatenate(cols["timestamp"]), type=pa.float32()),
            **{
                k: pa.array(np.concatenate(cols[k]), type=pa.int64())
                for k in ("frame_index", "episode_index", "index", "task_index")
            },
        }
    )


def _stats(ds: FactoryDataset) -> dict:
    out = {}
    states = np.stack(
        [
            expected_state(e, f, ds.state_dim)
            for e, n in enumerate(ds.episode_lengths)
            for f in range(n)
        ]
    )
    actions = np.stack(
        [
            expected_action(e, f, ds.action_dim)
            for e, n in enumerate(ds.episode_lengths)
            for f in range(n)
        ]
    )
    for key, arr in (("observation.state", states), ("action", actions)):
        out[key] = {
            "min": arr.min(0).tolist(),
            "max": arr.max(0).tolist(),
            "mean": arr.mean(0).tolist(),
            "std": arr.std(0).tolist(),
            "count": [len(arr)],
        }
    for cam in ds.camera_keys:
        out[cam] = {
            "min": [[[0.0]]] * 3,
            "max": [[[1.0]]] * 3,
            "mean": [[[0.5]]] * 3,
            "std": [[[0.4]]] * 3,
            "count": [ds.total_frames],
        }
    return out


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
    """Write a LeRobot dataset to ``root`` and return what was written.

    v3.0: ``episodes_per_file`` consecutive episodes share one data parquet and one mp4 per
    camera; file numbers roll into the next ``chunk-XXX`` folder after ``files_per_chunk``
    files. v2.1: one parquet and one mp4 per episode, ``files_per_chunk`` episodes per chunk
    folder. ``codec`` is "av1" (libsvtav1, lerobot's default with ``gop=2``), "h264" (libx264,
    keyframes exactly every ``gop`` frames) or "mpeg4". Episode ``e`` has task ``e % len(tasks)``.
    """
    root = Path(root)
    if codec not in CODECS:
        raise ValueError(f"Unknown codec {codec!r}; expected one of {CODECS}.")
    if version not in ("v3.0", "v2.1"):
        raise ValueError(f"Unknown version {version!r}; expected 'v3.0' or 'v2.1'.")
    lengths = tuple(int(n) for n in episode_lengths)
    if not lengths or min(lengths) <= 0:
        raise ValueError(f"episode_lengths must be positive; found {lengths}.")
    if not 0 <= num_cameras <= 3:
        raise ValueError(f"num_cameras must be 0..3; found {num_cameras}.")
    if num_cameras:
        _check_size(height, width)
    if min(episodes_per_file, files_per_chunk, gop, fps) < 1:
        raise ValueError("episodes_per_file, files_per_chunk, gop and fps must be >= 1.")
    if root.exists():
        if not overwrite:
            raise ValueError(
                f"{root} already exists; expected a new folder. Fix: pass "
                "overwrite=True or another root."
            )
        shutil.rmtree(root)
    cams = tuple(f"observation.images.cam{i}" for i in range(num_cameras))
    ds = FactoryDataset(
        root,
        version,
        fps,
        lengths,
        cams,
        height,
        width,
        codec,
        gop,
        tuple(tasks),
        state_dim,
        action_dim,
    )
    (root / "meta").mkdir(parents=True)
    if version == "v3.0":
        _write_v30(ds, episodes_per_file, files_per_chunk, progress)
    else:
        _write_v21(ds, files_per_chunk, progress)
    (root / "meta" / "stats.json").write_text(json.dumps(_stats(ds), indent=2))
    return ds


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[factory] {msg}", file=sys.stderr, flush=True)


def _frames(ds: FactoryDataset, episodes: Sequence[int], cam: int) -> list[np.ndarray]:
    return [
        frame_image(e, f, cam, ds.height, ds.width)
        for e in episodes
        for f in range(ds.episode_lengths[e])
    ]


def _write_v30(ds: FactoryDataset, per_file: int, per_chunk: int, progress: bool) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    n = len(ds.episode_lengths)
    rows = []
    for f, first in enumerate(range(0, n, per_file)):
        eps = list(range(first, min(first + per_file, n)))
        chunk, file = divmod(f, per_chunk)
        rel = f"chunk-{chunk:03d}/file-{file:03d}"
        path = ds.root / "data" / f"{rel}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table(ds, eps), path, row_group_size=16)
        for c, cam in enumerate(ds.camera_keys):
            _encode_video(
                ds.root / "videos" / cam / f"{rel}.mp4",
                _frames(ds, eps, c),
                fps=ds.fps,
                codec=ds.codec,
                gop=ds.gop,
            )
        _say(progress, f"wrote {rel} (episodes {eps[0]}..{eps[-1]})")
        t = 0.0
        for e in eps:
            length = ds.episode_lengths[e]
            row = {
                "episode_index": e,
                "tasks": [ds.tasks[ds.episode_task_index(e)]],
                "length": length,
                "data/chunk_index": chunk,
                "data/file_index": file,
                "dataset_from_index": ds.dataset_index(e, 0),
                "dataset_to_index": ds.dataset_index(e, 0) + length,
            }
            for cam in ds.camera_keys:
                row[f"videos/{cam}/chunk_index"] = chunk
                row[f"videos/{cam}/file_index"] = file
                row[f"videos/{cam}/from_timestamp"] = t
                row[f"videos/{cam}/to_timestamp"] = t + length / ds.fps
            row["meta/episodes/chunk_index"] = 0
            row["meta/episodes/file_index"] = 0
            rows.append(row)
            t += length / ds.fps
    ep_path = ds.root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    ep_path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(ep_path, index=False)
    pd.DataFrame(
        {"task_index": np.arange(len(ds.tasks), dtype=np.int64)}, index=pd.Index(list(ds.tasks))
    ).to_parquet(ds.root / "meta" / "tasks.parquet")
    info = {
        "codebase_version": "v3.0",
        "robot_type": None,
        "total_episodes": n,
        "total_frames": ds.total_frames,
        "total_tasks": len(ds.tasks),
        "chunks_size": per_chunk,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": ds.fps,
        "splits": {"train": f"0:{n}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        if ds.camera_keys
        else None,
        "features": _features(
            ds.camera_keys, ds.height, ds.width, ds.state_dim, ds.action_dim, ds.codec, ds.fps
        ),
    }
    (ds.root / "meta" / "info.json").write_text(json.dumps(info, indent=4))


def _write_v21(ds: FactoryDataset, per_chunk: int, progress: bool) -> None:
    import pyarrow.parquet as pq

    n = len(ds.episode_lengths)
    for e in range(n):
        chunk = e // per_chunk
        path = ds.root / "data" / f"chunk-{chunk:03d}" / f"episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table(ds, [e]), path, row_group_size=16)
        for c, cam in enumerate(ds.camera_keys):
            _encode_video(
                ds.root / "videos" / f"chunk-{chunk:03d}" / cam / f"episode_{e:06d}.mp4",
                _frames(ds, [e], c),
                fps=ds.fps,
                codec=ds.codec,
                gop=ds.gop,
            )
        _say(progress, f"wrote episode {e}")
    meta = ds.root / "meta"
    with open(meta / "episodes.jsonl", "w") as f:
        for e in range(n):
            f.write(
                json.dumps(
                    {
                        "episode_index": e,
                        "tasks": [ds.tasks[ds.episode_task_index(e)]],
                        "length": ds.episode_lengths[e],
                    }
                )
                + "\n"
            )
    with open(meta / "tasks.jsonl", "w") as f:
        for i, t in enumerate(ds.tasks):
            f.write(json.dumps({"task_index": i, "task": t}) + "\n")
    with open(meta / "episodes_stats.jsonl", "w") as f:
        for e in range(n):
            f.write(json.dumps({"episode_index": e, "stats": {}}) + "\n")
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
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        if ds.camera_keys
        else None,
        "features": _features(
            ds.camera_keys, ds.height, ds.width, ds.state_dim, ds.action_dim, ds.codec, ds.fps
        ),
    }
    (meta / "info.json").write_text(json.dumps(info, indent=4))
