"""The factory's metadata: info.json features, per-episode stats, data parquet columns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .truth import (
    COLS,
    HIGH,
    LOW,
    QUANTILES,
    ROWS,
    FactoryDataset,
    action_rows,
    cell_bits,
    state_rows,
)
from .video import codec_options


def _encoder_info(codec: str, gop: int) -> dict:
    """The encoder settings lerobot 0.6 records in a camera's ``info`` (``video.<field>`` of its
    ``VideoEncoderConfig``, in that order), with the values the factory really encodes with."""
    options = dict(codec_options(codec, gop))
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


def meta_features(ds: FactoryDataset) -> dict:
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
        "observation.state": state_rows(ep, fr, ds.state_dim),
        "action": action_rows(ep, fr, ds.action_dim),
        "timestamp": (fr.astype(np.float64) / ds.fps).astype(np.float32),
        "frame_index": fr,
        "episode_index": ep,
        "index": starts + fr,
        "task_index": ep % len(ds.tasks),
    }


def write_parquet(ds: FactoryDataset, episodes: Sequence[int], path: Path) -> None:
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
    for q in QUANTILES:
        stats[f"q{round(q * 100):02d}"] = np.quantile(v, q, axis=0).tolist()
    return stats


def _image_stats(high_fraction: np.ndarray) -> dict[str, list]:
    """Exact per-channel stats in [0, 1] of frames made of LOW and HIGH pixels only.

    ``high_fraction[i]`` is the fraction of frame i's pixels at HIGH (before compression).
    """
    lo, hi = LOW / 255.0, HIGH / 255.0
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
    for q in QUANTILES:
        stats[f"q{round(q * 100):02d}"] = chan(lo if q < 1 - p else hi)
    return stats


def _high_fractions(ds: FactoryDataset, episode: int, camera: int) -> np.ndarray:
    cell_share = (ds.height // ROWS) * (ds.width // COLS) / (ds.height * ds.width)
    ones = [int(cell_bits(episode, f, camera).sum()) for f in range(ds.episode_lengths[episode])]
    return np.asarray(ones, dtype=np.float64) * cell_share


def all_stats(ds: FactoryDataset, episodes: Sequence[int]) -> dict[str, dict[str, list]]:
    columns = _columns(ds, episodes)
    stats = {}
    for key in meta_features(ds):  # lerobot writes stats in feature order
        if key in columns:
            stats[key] = _numeric_stats(columns[key], int_extremes=ds.version == "v2.1")
        else:
            c = ds.camera_keys.index(key)
            fractions = np.concatenate([_high_fractions(ds, e, c) for e in episodes])
            stats[key] = _image_stats(fractions)
    return stats
