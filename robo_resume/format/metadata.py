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

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    CorruptFileError,
    DatasetFormatError,
    MetadataMismatchError,
    MissingFileError,
    UnsupportedVersionError,
    describe,
)
from .features import check_features
from .validate import (
    check_agreement,
    check_feature_specs,
    float_values,
    inside_root,
    int_values,
    task_list,
)

__all__ = ["SUPPORTED_VERSIONS", "DatasetMeta", "EpisodeInfo", "VideoRef", "load_metadata"]

SUPPORTED_VERSIONS = ("v2.1", "v3.0")

_CONVERT_HINT = {
    "v1": (
        "convert it to v2.0 with lerobot's convert_dataset_v1_to_v2 script (lerobot<=0.2), then to "
        "v2.1 and v3.0 (python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id=...)"
    ),
    "v2.0": (
        "convert it to v2.1 with lerobot's convert_dataset_v20_to_v21 script (lerobot<=0.3), "
        "then to v3.0 with python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id=..."
    ),
}


@dataclass(frozen=True)
class VideoRef:
    """Where one camera's frames of one episode live.

    ``path`` is relative to the dataset root. Frame ``k`` of the episode is shown at time
    ``from_timestamp + timestamp[k]`` inside the file (v3.0 concatenates episodes in one mp4;
    v2.1 has one file per episode and ``from_timestamp == 0``).
    """

    path: str
    from_timestamp: float
    to_timestamp: float


@dataclass(frozen=True)
class EpisodeInfo:
    """Everything needed to read one episode.

    ``dataset_from_index``/``dataset_to_index`` are the global ``index`` range (stop exclusive);
    the episode's rows are ``[data_row_start, data_row_start + length)`` of ``data_path``.
    """

    episode_index: int
    length: int
    dataset_from_index: int
    data_path: str
    data_row_start: int
    tasks: tuple[str, ...] = ()
    videos: Mapping[str, VideoRef] = field(default_factory=dict)

    @property
    def dataset_to_index(self) -> int:
        """Global index one past the episode's last frame."""
        return self.dataset_from_index + self.length


@dataclass(frozen=True)
class DatasetMeta:
    """Validated metadata of a LeRobot dataset on disk.

    ``episodes`` is sorted by ``episode_index``; ``tasks[i]`` is the task string of
    ``task_index == i``. ``camera_keys`` are the video features in info.json order.
    """

    root: Path
    version: str
    fps: int
    features: Mapping[str, Mapping[str, Any]]
    camera_keys: tuple[str, ...]
    episodes: tuple[EpisodeInfo, ...]
    tasks: tuple[str, ...]
    info: Mapping[str, Any]
    stats: Mapping[str, Any]

    @property
    def total_frames(self) -> int:
        """Number of frames over all episodes."""
        return sum(e.length for e in self.episodes)

    @property
    def num_episodes(self) -> int:
        """Number of episodes."""
        return len(self.episodes)

    def episode(self, episode_index: int) -> EpisodeInfo:
        """Return the episode with this ``episode_index`` (KeyError naming valid ones)."""
        pos = self._positions.get(episode_index)
        if pos is None:
            raise KeyError(
                describe(
                    "Unknown episode",
                    expected=f"an episode_index among the {self.num_episodes} episodes "
                    f"({self.episodes[0].episode_index}..{self.episodes[-1].episode_index})"
                    if self.episodes
                    else "a dataset with episodes",
                    found=episode_index,
                    file=self.root / "meta",
                )
            )
        return self.episodes[pos]

    @property
    def _positions(self) -> dict[int, int]:
        cache = self.__dict__.get("_pos_cache")
        if cache is None:
            cache = {e.episode_index: i for i, e in enumerate(self.episodes)}
            object.__setattr__(self, "_pos_cache", cache)
        return cache

    def data_columns(self) -> tuple[str, ...]:
        """Names of the features stored in the data parquet files (all but video features),
        in info.json order (the order of an item's keys after the video cameras)."""
        return tuple(k for k, v in self.features.items() if v.get("dtype") != "video")

    @property
    def image_keys(self) -> tuple[str, ...]:
        """``dtype: image`` features (frames stored in the data parquet), in info.json order."""
        return tuple(k for k, v in self.features.items() if v.get("dtype") == "image")

    @property
    def visual_keys(self) -> tuple[str, ...]:
        """Every key whose values are images: ``camera_keys`` (video) then ``image_keys``.

        lerobot calls this set ``camera_keys``; here ``camera_keys`` are the video features."""
        return self.camera_keys + self.image_keys

    @property
    def string_keys(self) -> tuple[str, ...]:
        """``dtype: string`` features (a Python ``str`` per item), in info.json order."""
        return tuple(k for k, v in self.features.items() if v.get("dtype") == "string")

    def frame_size(self, camera: str) -> tuple[int, int] | None:
        """``(height, width)`` of a camera's frames according to info.json (None if unknown)."""
        ft = self.features.get(camera) or {}
        shape, names = ft.get("shape"), ft.get("names")
        if not isinstance(shape, list | tuple) or len(shape) != 3:
            return None
        if isinstance(names, list | tuple) and "height" in names and "width" in names:
            return int(shape[names.index("height")]), int(shape[names.index("width")])
        return int(shape[0]), int(shape[1])  # lerobot's (height, width, channels)

    def check_video_stream(
        self,
        camera: str,
        stream: Any,
        *,
        file: str | Path | None = None,
        episode: int | None = None,
    ) -> None:
        """Compare an opened video with info.json; raise MetadataMismatchError if they differ.

        ``stream`` is a :class:`~robo_resume.format.video.VideoStreamInfo` (``VideoReader.info()``,
        which reads the open container's header: no decoding). Call it once per video file.

        Rule: frames are decoded as the container has them (lerobot does the same), but a
        container whose frame size differs from ``features[camera].shape`` is refused (models
        are built from info.json's shapes; batches would not match them), and so is one whose
        frame rate differs from ``fps`` (frames are looked up at ``from_timestamp +
        timestamp``; at another rate that time shows other frames, silently).
        """
        size = self.frame_size(camera)
        if size is not None and stream.height and stream.width:
            if (stream.height, stream.width) != size:
                raise MetadataMismatchError(
                    describe(
                        f"A video's frame size differs from meta/info.json for '{camera}'",
                        expected=f"{size[0]}x{size[1]} (height x width, features['{camera}'] "
                        "shape in meta/info.json)",
                        found=f"{stream.height}x{stream.width} in the video container",
                        file=file,
                        episode=episode,
                        fix=f"re-encode the video at {size[0]}x{size[1]}, or set the shape of "
                        f"'{camera}' in meta/info.json to "
                        f"[{stream.height}, {stream.width}, 3] if the video is right",
                    )
                )
        fps = float(self.fps)
        several = stream.num_frames == 0 or stream.num_frames >= 2  # 1 frame: no rate to speak of
        if stream.fps and several and abs(stream.fps - fps) > 1e-3 * fps:
            raise MetadataMismatchError(
                describe(
                    f"A video's frame rate differs from meta/info.json's fps for '{camera}'",
                    expected=f"{fps:g} fps (meta/info.json)",
                    found=f"{stream.fps:g} fps in the video container",
                    file=file,
                    episode=episode,
                    fix="re-encode the video at the dataset's fps (frames are looked up by "
                    "timestamp, so another rate returns other frames), or fix fps in "
                    "meta/info.json if the video is right",
                )
            )

    def fingerprint(self) -> dict[str, Any]:
        """A small JSON-safe summary that changes when the dataset's content layout changes."""
        lengths = np.fromiter((e.length for e in self.episodes), dtype=np.int64)
        starts = np.fromiter((e.dataset_from_index for e in self.episodes), dtype=np.int64)
        import hashlib

        h = hashlib.sha256()
        h.update(lengths.tobytes())
        h.update(starts.tobytes())
        h.update(json.dumps(sorted(self.features), sort_keys=True).encode())
        return {
            "version": self.version,
            "fps": self.fps,
            "num_episodes": self.num_episodes,
            "total_frames": self.total_frames,
            "episodes_sha256": h.hexdigest()[:16],
        }


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise MissingFileError(
            describe(
                "A metadata file is missing",
                expected=f"{path.name} in {path.parent}",
                found="no such file",
                file=path,
                fix="point `root` at the dataset folder that holds meta/, data/ and videos/, "
                "or download the dataset again",
            )
        )
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptFileError(
            describe(
                "A metadata file is not valid JSON",
                expected="a JSON document",
                found=f"{type(exc).__name__}: {exc}",
                file=path,
                fix="restore the file from the published dataset",
            )
        ) from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        _read_json(path)  # raises MissingFileError with the standard message
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise CorruptFileError(
                describe(
                    f"Line {lineno} of a JSON-lines metadata file is not valid JSON",
                    expected="one JSON object per line",
                    found=repr(line[:80]),
                    file=path,
                    fix="restore the file from the published dataset",
                )
            ) from exc
    return rows


@functools.lru_cache(maxsize=65536)
def _posix_inside(rel: str) -> str | None:
    """``rel`` as a POSIX path, or None if it is absolute or climbs out with ``..``."""
    p = Path(rel)
    return None if p.is_absolute() or ".." in p.parts else p.as_posix()


def _check_relative(root: Path, rel: str, *, what: str, episode: int) -> str:
    """Refuse paths that escape the dataset root (``..`` or absolute)."""
    posix = _posix_inside(rel)  # cached: v3.0 episodes share a few files
    if posix is None:
        raise DatasetFormatError(
            describe(
                f"A {what} path escapes the dataset root",
                expected="a path relative to the dataset root without '..'",
                found=rel,
                file=root / "meta" / "info.json",
                episode=episode,
                fix="fix data_path/video_path in meta/info.json",
            )
        )
    return posix


def _format_path(template: str, root: Path, *, what: str, episode: int, **fields: Any) -> str:
    try:
        rel = template.format(**fields)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise DatasetFormatError(
            describe(
                f"meta/info.json's {what} template cannot be filled",
                expected=f"placeholders among {sorted(fields)}",
                found=repr(template),
                file=root / "meta" / "info.json",
                episode=episode,
                fix="fix the template in meta/info.json",
            )
        ) from exc
    return _check_relative(root, rel, what=what, episode=episode)


def _load_info(root: Path) -> dict[str, Any]:
    info_path = root / "meta" / "info.json"
    if root.exists() and not root.is_dir():
        raise DatasetFormatError(
            describe(
                "The dataset root is a file, not a folder",
                expected="a folder holding meta/info.json",
                found=f"a file of {root.stat().st_size} bytes at {root}",
                file=root,
                fix="pass the folder of a LeRobot dataset (v3.0 or v2.1) as root, not a file in it",
            )
        )
    if not root.is_dir():
        raise MissingFileError(
            describe(
                "The dataset root does not exist",
                expected="a folder holding meta/info.json",
                found=f"nothing at {root}",
                file=root,
                fix="pass the folder of a LeRobot dataset (v3.0 or v2.1) as root",
            )
        )
    for entry in sorted((root / "meta").rglob("*")) if (root / "meta").is_dir() else ():
        inside_root(root, entry.relative_to(root))  # links out of the dataset are refused
    info = _read_json(info_path)
    if not isinstance(info, dict):
        raise DatasetFormatError(
            describe(
                "meta/info.json is not a JSON object",
                expected="an object with codebase_version, fps and features",
                found=type(info).__name__,
                file=info_path,
                fix="restore meta/info.json from the published dataset",
            )
        )
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        v = str(version)
        hint = _CONVERT_HINT["v1"] if v.startswith("v1") else _CONVERT_HINT.get(v)
        raise UnsupportedVersionError(
            describe(
                "Unsupported LeRobot dataset version",
                expected=" or ".join(SUPPORTED_VERSIONS),
                found=f"codebase_version={version!r}",
                file=info_path,
                fix=hint
                or "convert the dataset to v3.0 with lerobot's conversion scripts "
                "(python -m lerobot.datasets.v30.convert_dataset_v21_to_v30)",
            )
        )
    for key in ("fps", "features"):
        if key not in info:
            raise DatasetFormatError(
                describe(
                    f"meta/info.json has no '{key}'",
                    expected=f"a '{key}' entry (every LeRobot {version} dataset has one)",
                    found=f"keys {sorted(info)}",
                    file=info_path,
                    fix="restore meta/info.json from the published dataset",
                )
            )
    fps = info["fps"]
    if not isinstance(fps, int | float) or isinstance(fps, bool) or fps <= 0:
        raise DatasetFormatError(
            describe(
                "meta/info.json has an invalid fps",
                expected="a positive number",
                found=repr(fps),
                file=info_path,
                fix="set fps in meta/info.json to the rate the dataset was recorded at",
            )
        )
    if not isinstance(info["features"], dict) or not info["features"]:
        raise DatasetFormatError(
            describe(
                "meta/info.json has invalid features",
                expected="a non-empty object mapping feature names to {dtype, shape}",
                found=repr(info["features"])[:120],
                file=info_path,
                fix="restore meta/info.json from the published dataset",
            )
        )
    check_features(info["features"], info_path)  # depth maps, language columns
    check_feature_specs(info["features"], info_path)  # dtypes and shapes
    return info


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


def _check_unique(root: Path, episodes: list[EpisodeInfo]) -> None:
    idx = np.fromiter((e.episode_index for e in episodes), dtype=np.int64, count=len(episodes))
    dup = np.flatnonzero(idx[1:] == idx[:-1])  # episodes are sorted by episode_index
    if dup.size:
        e = int(idx[dup[0]])
        raise DatasetFormatError(
            describe(
                "An episode appears twice in the episode metadata",
                expected="each episode_index once",
                found=f"episode_index {e} twice",
                file=root / "meta",
                episode=e,
                fix="download the dataset's meta/ folder again",
            )
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


def _tasks_tuple(pairs: Any, path: Path) -> tuple[str, ...]:
    mapping = dict(pairs)
    n = len(mapping)
    if sorted(mapping) != list(range(n)):
        raise DatasetFormatError(
            describe(
                "Task indices are not 0..N-1",
                expected=f"task_index values 0..{n - 1}",
                found=sorted(mapping)[:20],
                file=path,
                fix="download the dataset's meta/ folder again",
            )
        )
    return tuple(mapping[i] for i in range(n))


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
