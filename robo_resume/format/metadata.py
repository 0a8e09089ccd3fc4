"""Dataset metadata of LeRobot format v3.0 and v2.1, read from files (never from lerobot).

:func:`load_metadata` returns a :class:`DatasetMeta`: fps, features, cameras, tasks, stats and the
episodes as columns (an :class:`~.episode_table.EpisodeTable` of numpy arrays, read straight from
the episodes parquet with pyarrow and validated column by column) saying where each episode's
rows and video frames live; ``meta.episode(e)`` builds one :class:`EpisodeInfo` on demand. Only
metadata files are read (``meta/``); data and video files are opened later by the readers, which
check them (:meth:`DatasetMeta.check_video_stream` compares an opened video with info.json).

Load-time checks (cheap, no data or video file opened): supported version, required files and
keys, valid JSON/parquet, fps and features (no depth maps or misnamed language columns, see
:mod:`~robo_resume.format.features`), paths inside the root, at least one episode, no
empty or duplicated episodes, and (v3.0) ``dataset_to_index - dataset_from_index == length``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import (
    DatasetFormatError,
    describe,
)
from .arrow_columns import release_freed_memory
from .meta_files import check_unique, load_info, read_json
from .meta_types import SUPPORTED_VERSIONS, DatasetMeta, EpisodeInfo, VideoRef
from .meta_v21 import load_v21
from .meta_v30 import load_v30
from .validate import (
    check_agreement,
)

__all__ = ["SUPPORTED_VERSIONS", "DatasetMeta", "EpisodeInfo", "VideoRef", "load_metadata"]


def load_metadata(root: str | Path) -> DatasetMeta:
    """Read and validate the metadata of the LeRobot dataset at ``root`` (v3.0 or v2.1).

    Reads only files under ``meta/``; error messages name the file and the fix.

    Args:
        root: the dataset folder (holding ``meta/``).

    Returns:
        The validated :class:`DatasetMeta`.

    Raises:
        UnsupportedVersionError: the dataset has a format version other than v3.0 or v2.1.
        MissingFileError: a metadata file is missing.
        DatasetFormatError: a metadata file is malformed.
    """
    root = Path(root).expanduser().resolve()
    info = load_info(root)
    version = info["codebase_version"]
    features = info["features"]
    camera_keys = tuple(k for k, v in features.items() if v.get("dtype") == "video")
    stats_path = root / "meta" / "stats.json"
    stats = read_json(stats_path) if stats_path.is_file() else {}
    if version == "v3.0":
        columns, tasks = load_v30(root, info, camera_keys)
    else:
        columns, tasks = load_v21(root, info, camera_keys)
    if not len(columns):
        raise DatasetFormatError(
            describe(
                "The dataset has no episodes",
                expected="at least one episode in the episode metadata",
                found="0 episodes",
                file=root / "meta",
                fix="download the dataset's meta/ folder again",
            )
        )
    release_freed_memory()  # leave only the columns resident (see there)
    check_unique(root, columns.episode_index)
    check_agreement(
        root, info, columns.episode_index, columns.length, columns.dataset_from_index
    )  # also refuses empty episodes (length < 1), naming the first
    return DatasetMeta(
        root=root,
        version=version,
        fps=int(info["fps"]) if float(info["fps"]).is_integer() else info["fps"],
        features=features,
        camera_keys=camera_keys,
        columns=columns,
        tasks=tasks,
        info=info,
        stats=stats,
    )
