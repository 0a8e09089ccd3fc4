"""Dataset factory: writes real LeRobot datasets (v3.0 and v2.1) with known ground truth.

Used by the tests, the demo and the benchmarks, and public so users can try robo_resume without
downloading anything. Every frame's pixels encode ``(episode, frame, camera)`` in a grid of large
black and white cells with a checksum (:func:`frame_image`, :func:`decode_frame_identity`), which
survives AV1, h264 and mpeg4 compression; every row's values encode ``(episode, frame)`` exactly
(:func:`expected_state`, :func:`expected_action`). A test can therefore tell that a decoded frame
or a row is exactly the one it asked for.

Pixel pattern
-------------
The image is split into a grid of 6 rows x 8 columns of cells, each ``height // 6`` by
``width // 8`` pixels (at least 8x8, so 48x64 is the smallest size); pixels right of or below the
grid are dark. Cell ``k`` (row-major) holds bit ``47 - k`` of a 48-bit word
``episode (14 bits) | frame (16 bits) | camera (2 bits) | check (16 bits)``, most significant bit
first, where ``check = crc32(payload as 4 little-endian bytes) & 0xFFFF`` and ``payload`` is the
upper 32 bits. A 1 bit is gray level 225, a 0 bit gray level 30, in all three RGB channels. A
decoder takes the mean of each cell's inner half (a quarter of the cell's size is dropped on each
side, away from the blurred edges) over the three channels and compares it with 128.

Written layouts
---------------
v3.0 (as lerobot 0.6.1 writes it): ``data/chunk-CCC/file-FFF.parquet`` and
``videos/<camera>/chunk-CCC/file-FFF.mp4`` holding ``episodes_per_file`` consecutive episodes each
(file numbers roll into the next chunk folder after ``files_per_chunk`` files),
``meta/episodes/chunk-000/file-000.parquet`` (one row per episode, with per-episode ``stats/*``
columns), ``meta/tasks.parquet``, ``meta/stats.json`` and ``meta/info.json`` (each camera's
``info`` records the encoder settings, ``video.g``, ``video.crf``, ... and ``is_depth_map``).

v2.1 (lerobot <= 0.3): ``data/chunk-CCC/episode_EEEEEE.parquet`` and
``videos/chunk-CCC/<camera>/episode_EEEEEE.mp4`` (``files_per_chunk`` episodes per chunk folder),
``meta/episodes.jsonl``, ``meta/tasks.jsonl``, ``meta/episodes_stats.jsonl``,
``meta/stats.json`` and ``meta/info.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
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
"""Codecs :func:`make_dataset` can write (``video.codec`` in info.json)."""

_ENCODER = {"av1": "libsvtav1", "h264": "libx264", "mpeg4": "mpeg4"}
_ROWS, _COLS = 6, 8  # 48 cells: 14 bits episode, 16 bits frame, 2 bits camera, 16 bits checksum
_LOW, _HIGH = 30, 225
MIN_CELL = 8
"""Smallest cell side in pixels: images must be at least ``6 * 8`` high and ``8 * 8`` wide."""
MAX_EPISODES, MAX_FRAMES, MAX_CAMERAS = 2**14, 2**16, 4
_QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)


@dataclass(frozen=True)
class FactoryDataset:
    """What :func:`make_dataset` wrote: the ground truth tests compare against.

    Frame ``f`` of episode ``e`` has ``observation.state == expected_state(e, f, state_dim)``,
    ``action == expected_action(e, f, action_dim)``, ``timestamp == float32(f / fps)``,
    ``index == dataset_index(e, f)``, ``task_index == episode_task_index(e)`` and, for camera
    ``c`` (``camera_keys[c]``), pixels ``frame_image(e, f, c, height, width)`` before compression.
    """

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
        """Frames over all episodes (``sum(episode_lengths)``)."""
        return sum(self.episode_lengths)

    def episode_task_index(self, episode_index: int) -> int:
        """The task index of an episode: ``episode_index % len(tasks)``."""
        return episode_index % len(self.tasks)

    def dataset_index(self, episode_index: int, frame_index: int) -> int:
        """The global ``index`` of a frame: frames of earlier episodes plus ``frame_index``."""
        return sum(self.episode_lengths[:episode_index]) + frame_index


# --------------------------------------------------------------------------- tabular values


def _state_rows(episodes: np.ndarray, frames: np.ndarray, dim: int) -> np.ndarray:
    e = episodes.astype(np.float64)
    f = frames.astype(np.float64)
    out = np.empty((len(e), dim), dtype=np.float64)
    cols = [e, f, e * 1000 + f]
    for k in range(dim):
        out[:, k] = cols[k] if k < 3 else 0.5 + (k - 3)
    return out.astype(np.float32)


def _action_rows(episodes: np.ndarray, frames: np.ndarray, dim: int) -> np.ndarray:
    e = episodes.astype(np.float64)
    f = frames.astype(np.float64)
    out = np.empty((len(e), dim), dtype=np.float64)
    cols = [f + 0.25, -e]
    for k in range(dim):
        out[:, k] = cols[k] if k < 2 else 0.125 * (k - 1)
    return out.astype(np.float32)


def expected_state(episode_index: int, frame_index: int, dim: int) -> np.ndarray:
    """The float32 ``observation.state`` written for a frame, exactly.

    ``[episode, frame, 1000 * episode + frame, 0.5, 1.5, 2.5, ...]`` truncated to ``dim``; every
    value is exactly representable in float32 (episode < 16384, frame < 65536).
    """
    return _state_rows(np.array([episode_index]), np.array([frame_index]), dim)[0]


def expected_action(episode_index: int, frame_index: int, dim: int) -> np.ndarray:
    """The float32 ``action`` written for a frame, exactly.

    ``[frame + 0.25, -episode, 0.125, 0.25, 0.375, ...]`` truncated to ``dim``; every value is
    exactly representable in float32.
    """
    return _action_rows(np.array([episode_index]), np.array([frame_index]), dim)[0]


# --------------------------------------------------------------------------- pixel pattern


def _checksum(payload: int) -> int:
    return zlib.crc32(payload.to_bytes(4, "little")) & 0xFFFF


def _bits(episode: int, frame: int, camera: int) -> np.ndarray:
    payload = episode << 18 | frame << 2 | camera
    word = payload << 16 | _checksum(payload)
    return np.array([(word >> (47 - i)) & 1 for i in range(48)], dtype=np.uint8)


def _check_size(height: int, width: int) -> None:
    if height // _ROWS < MIN_CELL or width // _COLS < MIN_CELL:
        raise ValueError(
            f"Images of {height}x{width} are too small for the identity pattern; expected at "
            f"least {_ROWS * MIN_CELL}x{_COLS * MIN_CELL} (height x width) so that each of the "
            f"{_ROWS}x{_COLS} cells is {MIN_CELL}x{MIN_CELL} pixels or more. "
            f"Fix: pass height>={_ROWS * MIN_CELL} and width>={_COLS * MIN_CELL}."
        )


def frame_image(
    episode_index: int, frame_index: int, camera: int, height: int, width: int
) -> np.ndarray:
    """The uint8 RGB ``(height, width, 3)`` image the factory encodes for a frame.

    See the module docstring for the pattern. Raises ValueError when the image is smaller than
    48x64 or when ``episode_index >= 16384``, ``frame_index >= 65536`` or ``camera >= 4``.
    """
    _check_size(height, width)
    if not (
        0 <= episode_index < MAX_EPISODES
        and 0 <= frame_index < MAX_FRAMES
        and 0 <= camera < MAX_CAMERAS
    ):
        raise ValueError(
            f"Cannot encode episode={episode_index}, frame={frame_index}, camera={camera}; "
            f"expected 0 <= episode < {MAX_EPISODES}, 0 <= frame < {MAX_FRAMES} and "
            f"0 <= camera < {MAX_CAMERAS}."
        )
    levels = np.where(_bits(episode_index, frame_index, camera) == 1, _HIGH, _LOW)
    block = levels.astype(np.uint8).reshape(_ROWS, _COLS)
    ch, cw = height // _ROWS, width // _COLS
    img = np.full((height, width, 3), _LOW, dtype=np.uint8)
    grid = np.repeat(np.repeat(block, ch, axis=0), cw, axis=1)
    img[: ch * _ROWS, : cw * _COLS] = grid[:, :, None]
    return img


def _to_hwc_255(image) -> np.ndarray:
    if hasattr(image, "detach"):  # torch.Tensor, without importing torch
        image = image.detach().cpu()
        if image.dtype.is_floating_point:
            image = image.float()
        image = image.numpy()
    a = np.asarray(image)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3:
        raise ValueError(f"Expected an image of 2 or 3 dimensions; found shape {a.shape}.")
    # Images are at least 48x64, so a leading 1 or 3 can only be the channel axis.
    if a.shape[0] in (1, 3) and a.shape[2] not in (1, 3):
        a = np.moveaxis(a, 0, 2)
    if a.shape[2] not in (1, 3):
        raise ValueError(f"Expected 1 or 3 channels (HWC or CHW); found shape {a.shape}.")
    floating = np.issubdtype(a.dtype, np.floating)
    a = a.astype(np.float32)
    if floating and a.size and float(a.max()) <= 1.0 + 1e-3:
        a = a * 255.0
    return a


def decode_frame_identity(image) -> tuple[int, int, int]:
    """Read ``(episode_index, frame_index, camera)`` back from a (decoded) factory frame.

    Accepts uint8 HWC, uint8 CHW, or float CHW/HWC in [0, 1] (numpy arrays or torch tensors), of
    the size the frame was written at. Raises ValueError when the image is too small or the
    checksum does not match (not a factory frame, wrong size, or damaged beyond recognition).
    """
    a = _to_hwc_255(image)
    h, w = a.shape[:2]
    _check_size(h, w)
    gray = a.mean(axis=2)
    ch, cw = h // _ROWS, w // _COLS
    mh, mw = ch // 4, cw // 4
    cells = gray[: ch * _ROWS, : cw * _COLS].reshape(_ROWS, ch, _COLS, cw)
    means = cells[:, mh : ch - mh, :, mw : cw - mw].mean(axis=(1, 3))
    word = 0
    for bit in (means.reshape(-1) > 128).tolist():
        word = word << 1 | int(bit)
    payload, check = word >> 16, word & 0xFFFF
    if _checksum(payload) != check:
        raise ValueError(
            "Frame identity checksum mismatch: the image is not a factory frame of this size, "
            "or it is damaged beyond recognition."
        )
    return payload >> 18, (payload >> 2) & 0xFFFF, payload & 0x3


# --------------------------------------------------------------------------- video


def _codec_options(codec: str, gop: int) -> dict[str, str]:
    if codec == "av1":
        # lerobot (0.4, 0.6) passes g, crf 30 and preset 12. At presets >= 10 SVT-AV1 barely codes
        # the non-reference frames of this pattern (they decode as copies of their neighbours'
        # cells), so the factory uses preset 8, which keeps every frame decodable.
        return {"g": str(gop), "crf": "30", "preset": "8"}
    if codec == "h264":  # keyframes exactly every gop frames: no scene-cut keyframes
        return {
            "g": str(gop),
            "keyint_min": str(gop),
            "sc_threshold": "0",
            "crf": "18",
            "preset": "veryfast",
            "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0",
        }
    return {"g": str(gop), "sc_threshold": "1000000000"}


def _encode_video(
    path: Path, frames: Iterator[np.ndarray], *, fps: int, codec: str, gop: int, h: int, w: int
) -> int:
    """Encode RGB frames into ``path``; frame ``i`` gets pts ``i`` in time base ``1/fps``."""
    import av

    # SVT-AV1 prints its configuration to the console unless told otherwise.
    os.environ.setdefault("SVT_LOG", "1")
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    level = av.logging.get_level()
    av.logging.set_level(av.logging.ERROR)  # x264 prints its settings and statistics otherwise
    try:
        with av.open(str(path), "w") as out:
            stream = out.add_stream(_ENCODER[codec], rate=fps, options=_codec_options(codec, gop))
            stream.pix_fmt = "yuv420p"
            stream.width, stream.height = w, h
            if codec == "mpeg4":
                stream.bit_rate = max(1_000_000, h * w * fps * 2)
            time_base = Fraction(1, fps)
            for img in frames:
                frame = av.VideoFrame.from_ndarray(img, format="rgb24")
                frame.pts, frame.time_base = count, time_base
                out.mux(stream.encode(frame))
                count += 1
            out.mux(stream.encode())
    finally:
        av.logging.set_level(level)
    return count


# --------------------------------------------------------------------------- features, stats


def _encoder_info(codec: str, gop: int) -> dict:
    """The encoder settings lerobot 0.6 records in a camera's ``info`` (``video.<field>`` of its
    ``VideoEncoderConfig``, in that order), with the values the factory really encodes with."""
    options = dict(_codec_options(codec, gop))
    g = int(options.pop("g"))
    crf = options.pop("crf", None)
    preset = options.pop("preset", None)
    return {
        "video.g": g,
        "video.crf": None if crf is None else int(crf),
        "video.preset": int(preset) if preset is not None and preset.isdigit() else preset,
        "video.fast_decode": 0,
        "video.video_backend": "pyav",
        "video.extra_options": options,
    }


def _video_info(ds: FactoryDataset) -> dict:
    """A camera's ``info`` in info.json: v3.0 as lerobot 0.6.1 writes it (stream fields, then
    the encoder settings and ``is_depth_map``); v2.1 as lerobot <= 0.3 wrote it."""
    info = {
        "video.height": ds.height,
        "video.width": ds.width,
        "video.codec": ds.codec,
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": ds.fps,
        "video.channels": 3,
        "has_audio": False,
    }
    if ds.version == "v2.1":
        return info
    del info["video.is_depth_map"]
    return {**info, **_encoder_info(ds.codec, ds.gop), "is_depth_map": False}


def _features(ds: FactoryDataset) -> dict:
    # lerobot's order: the user features (state, action, cameras), then its default features.
    feats: dict = {
        "observation.state": {"dtype": "float32", "shape": [ds.state_dim], "names": None},
        "action": {"dtype": "float32", "shape": [ds.action_dim], "names": None},
    }
    for cam in ds.camera_keys:
        feats[cam] = {
            "dtype": "video",
            "shape": [ds.height, ds.width, 3],
            "names": ["height", "width", "channels"],
            "info": _video_info(ds),
        }
    for key, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        feats[key] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


def _hf_metadata(ds: FactoryDataset) -> bytes:
    """The ``huggingface`` parquet schema metadata lerobot (via ``datasets``) writes."""

    def vec(n: int) -> dict:
        return {"feature": {"dtype": "float32", "_type": "Value"}, "length": n, "_type": "List"}

    feats = {"observation.state": vec(ds.state_dim), "action": vec(ds.action_dim)}
    feats["timestamp"] = {"dtype": "float32", "_type": "Value"}
    for key in ("frame_index", "episode_index", "index", "task_index"):
        feats[key] = {"dtype": "int64", "_type": "Value"}
    return json.dumps({"info": {"features": feats}}).encode()


def _columns(ds: FactoryDataset, episodes: Sequence[int]) -> dict[str, np.ndarray]:
    """All tabular columns of the given episodes, in lerobot's column order."""
    lengths = [ds.episode_lengths[e] for e in episodes]
    ep = np.repeat(np.asarray(episodes, dtype=np.int64), lengths)
    fr = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    starts = np.repeat([ds.dataset_index(e, 0) for e in episodes], lengths).astype(np.int64)
    return {
        "observation.state": _state_rows(ep, fr, ds.state_dim),
        "action": _action_rows(ep, fr, ds.action_dim),
        "timestamp": (fr.astype(np.float64) / ds.fps).astype(np.float32),
        "frame_index": fr,
        "episode_index": ep,
        "index": starts + fr,
        "task_index": ep % len(ds.tasks),
    }


def _write_parquet(ds: FactoryDataset, episodes: Sequence[int], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = _columns(ds, episodes)
    arrays = {}
    for key, values in cols.items():
        if values.ndim == 2:
            flat = pa.array(values.reshape(-1), type=pa.float32())
            arrays[key] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        else:
            arrays[key] = pa.array(values)
    table = pa.table(arrays).replace_schema_metadata({"huggingface": _hf_metadata(ds)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=16)


def _numeric_stats(values: np.ndarray, int_extremes: bool) -> dict[str, list]:
    """lerobot's stats of a column; ``min``/``max`` of an integer column stay integers when
    ``int_extremes`` (lerobot <= 0.4), lerobot 0.6 writes them as floats."""
    values = values.reshape(len(values), -1)
    is_int = int_extremes and np.issubdtype(values.dtype, np.integer)
    v = values.astype(np.float64)
    stats: dict[str, list] = {
        "min": values.min(0).tolist() if is_int else v.min(0).tolist(),
        "max": values.max(0).tolist() if is_int else v.max(0).tolist(),
        "mean": v.mean(0).tolist(),
        "std": v.std(0).tolist(),
        "count": [len(values)],
    }
    for q in _QUANTILES:
        stats[f"q{round(q * 100):02d}"] = np.quantile(v, q, axis=0).tolist()
    return stats


def _image_stats(high_fraction: np.ndarray) -> dict[str, list]:
    """Exact per-channel stats in [0, 1] of frames made of _LOW and _HIGH pixels only.

    ``high_fraction[i]`` is the fraction of frame i's pixels at _HIGH (before compression).
    """
    lo, hi = _LOW / 255.0, _HIGH / 255.0
    p = float(high_fraction.mean())
    mean = p * hi + (1 - p) * lo
    std = float(np.sqrt(max(0.0, p * hi * hi + (1 - p) * lo * lo - mean * mean)))

    def chan(x: float) -> list:
        return [[[float(x)]] for _ in range(3)]

    stats = {
        "min": chan(lo if p < 1 else hi),
        "max": chan(hi if p > 0 else lo),
        "mean": chan(mean),
        "std": chan(std),
        "count": [len(high_fraction)],
    }
    for q in _QUANTILES:
        stats[f"q{round(q * 100):02d}"] = chan(lo if q < 1 - p else hi)
    return stats


def _high_fractions(ds: FactoryDataset, episode: int, camera: int) -> np.ndarray:
    cell_share = (ds.height // _ROWS) * (ds.width // _COLS) / (ds.height * ds.width)
    ones = [int(_bits(episode, f, camera).sum()) for f in range(ds.episode_lengths[episode])]
    return np.asarray(ones, dtype=np.float64) * cell_share


def _all_stats(ds: FactoryDataset, episodes: Sequence[int]) -> dict[str, dict[str, list]]:
    columns = _columns(ds, episodes)
    stats = {}
    for key in _features(ds):  # lerobot writes stats in feature order
        if key in columns:
            stats[key] = _numeric_stats(columns[key], int_extremes=ds.version == "v2.1")
        else:
            c = ds.camera_keys.index(key)
            fractions = np.concatenate([_high_fractions(ds, e, c) for e in episodes])
            stats[key] = _image_stats(fractions)
    return stats


# --------------------------------------------------------------------------- make_dataset


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

    ``version`` "v3.0": ``episodes_per_file`` consecutive episodes share one data parquet and one
    mp4 per camera; file numbers roll into the next ``chunk-XXX`` folder after
    ``files_per_chunk`` files (info.json ``chunks_size``). "v2.1": one parquet and one mp4 per
    camera per episode, ``files_per_chunk`` episodes per chunk folder.

    Cameras are ``observation.images.cam0`` .. ``cam{num_cameras - 1}`` (0 to 4). ``codec`` is
    "av1" (libsvtav1, crf 30 and lerobot's default ``gop=2``; preset 8, not lerobot's 12, see
    ``_codec_options``), "h264"
    (libx264 with no scene-cut keyframes) or "mpeg4"; keyframes come exactly every ``gop``
    frames of each mp4 (episodes sharing an mp4 are encoded as one stream). Frame ``i`` of an mp4
    is at ``i / fps`` seconds. Episode ``e`` has task ``tasks[e % len(tasks)]``. Data parquet
    files have row groups of 16 rows.

    The dataset is written to a temporary sibling folder and renamed to ``root`` when complete.
    ``root`` must not exist unless ``overwrite=True``, which replaces an empty folder or a folder
    holding a ``meta`` folder (a dataset); anything else is left alone and raises ValueError.
    Raises ValueError for an unknown codec or version, non-positive lengths, sizes or counts,
    too many cameras, episodes or frames for the pixel pattern, or images smaller than 48x64.
    ``progress=True`` prints one line per written file group to stderr.
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
        _check_size(height, width)
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
        stats = _all_stats(build, range(len(lengths)))
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


def _frames(ds: FactoryDataset, episodes: Sequence[int], camera: int) -> Iterator[np.ndarray]:
    for e in episodes:
        for f in range(ds.episode_lengths[e]):
            yield frame_image(e, f, camera, ds.height, ds.width)


def _write_videos(ds: FactoryDataset, episodes: Sequence[int], path_of_camera) -> None:
    for c, cam in enumerate(ds.camera_keys):
        expected = sum(ds.episode_lengths[e] for e in episodes)
        path = path_of_camera(cam)
        written = _encode_video(
            path,
            _frames(ds, episodes, c),
            fps=ds.fps,
            codec=ds.codec,
            gop=ds.gop,
            h=ds.height,
            w=ds.width,
        )
        assert written == expected, (path, written, expected)


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
        _write_parquet(ds, eps, ds.root / "data" / f"{rel}.parquet")
        _write_videos(ds, eps, lambda cam, rel=rel: ds.root / "videos" / cam / f"{rel}.mp4")
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
            for key, stats in _all_stats(ds, [e]).items():
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
        "features": _features(ds),
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
        _write_parquet(ds, [e], ds.root / "data" / f"chunk-{chunk:03d}" / f"{name}.parquet")
        _write_videos(
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
        ({"episode_index": e, "stats": _all_stats(ds, [e])} for e in range(n)),
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
        "features": _features(ds),
    }
    (meta / "info.json").write_text(json.dumps(info, indent=4))
