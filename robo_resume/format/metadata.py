"""Dataset metadata of LeRobot format v3.0 and v2.1, read from files (never from lerobot).

:func:`load_metadata` returns a :class:`DatasetMeta`: fps, features, cameras, tasks, stats and one
:class:`EpisodeInfo` per episode saying where its rows and video frames live. Only metadata files
are read (``meta/``); data and video files are opened later by the readers, which check them
(:meth:`DatasetMeta.check_video_stream` compares an opened video with info.json).

Load-time checks (cheap, no data or video file opened): supported version, required files and
keys, valid JSON/parquet, fps and features (no depth maps or language columns, see
:mod:`~robo_resume.format.features`), paths inside the root, at least one episode, no
empty or duplicated episodes, and (v3.0) ``dataset_to_index - dataset_from_index == length``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import (
    DatasetFormatError,
    describe,
)
from .meta_files import _check_unique, _load_info, _read_json
from .meta_types import SUPPORTED_VERSIONS, DatasetMeta, EpisodeInfo, VideoRef
from .meta_v21 import _load_v21
from .meta_v30 import _load_v30
from .validate import (
    check_agreement,
)

__all__ = ["SUPPORTED_VERSIONS", "DatasetMeta", "EpisodeInfo", "VideoRef", "load_metadata"]


def load_metadata(root: str | Path) -> DatasetMeta:
    """Read and validate the metadata of the LeRobot dataset at ``root`` (v3.0 or v2.1).

    Reads only files under ``meta/``. Raises :class:`UnsupportedVersionError` for other
    versions, :class:`MissingFileError` for missing metadata files and
    :class:`DatasetFormatError` for malformed ones; messages name the file and the fix.
    """
    root = Path(root).expanduser().resolve()
    info = _load_info(root)
    version = info["codebase_version"]
    features = info["features"]
    camera_keys = tuple(k for k, v in features.items() if v.get("dtype") == "video")
    stats_path = root / "meta" / "stats.json"
    stats = _read_json(stats_path) if stats_path.is_file() else {}
    if version == "v3.0":
        episodes, tasks = _load_v30(root, info, camera_keys)
    else:
        episodes, tasks = _load_v21(root, info, camera_keys)
    if not episodes:
        raise DatasetFormatError(
            describe(
                "The dataset has no episodes",
                expected="at least one episode in the episode metadata",
                found="0 episodes",
                file=root / "meta",
                fix="download the dataset's meta/ folder again",
            )
        )
    _check_unique(root, episodes)
    check_agreement(
        root,
        info,
        np.fromiter((e.episode_index for e in episodes), np.int64, len(episodes)),
        np.fromiter((e.length for e in episodes), np.int64, len(episodes)),
        np.fromiter((e.dataset_from_index for e in episodes), np.int64, len(episodes)),
    )
    for ep in episodes:
        if ep.length <= 0:
            raise DatasetFormatError(
                describe(
                    "An episode has no frames",
                    expected="length >= 1",
                    found=f"length {ep.length}",
                    file=root / "meta",
                    episode=ep.episode_index,
                    fix="remove the empty episode from the dataset, or select the other "
                    "episodes with episodes=[...]",
                )
            )
    return DatasetMeta(
        root=root,
        version=version,
        fps=int(info["fps"]) if float(info["fps"]).is_integer() else info["fps"],
        features=features,
        camera_keys=camera_keys,
        episodes=tuple(episodes),
        tasks=tasks,
        info=info,
        stats=stats,
    )
