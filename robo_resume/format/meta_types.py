"""The metadata types: :class:`DatasetMeta`, :class:`EpisodeInfo`, :class:`VideoRef`.

What :func:`robo_resume.format.metadata.load_metadata` returns; no file is read here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    MetadataMismatchError,
    describe,
)

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


REQUIRED_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
"""Columns :meth:`DatasetMeta.select` always keeps: they place each frame and name its task."""


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
    ``dropped`` are the features left out by :meth:`select` (never opened or decoded); the
    fingerprint still counts them, since they do not change which frames a run reads.
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
    dropped: tuple[str, ...] = ()

    def select(self, features: Any) -> DatasetMeta:
        """This metadata without the features not selected: they are never opened or decoded.

        ``features`` is None (all), a sequence of feature keys to keep, or a mapping
        ``{key: None}`` of keys to drop. The columns every item needs (``index``,
        ``episode_index``, ``frame_index``, ``timestamp``, ``task_index``) are always kept. A
        dropped video feature's files are not needed at all (neither checked nor opened), so a
        copy of a dataset without some camera's mp4s streams the other features. Renaming is
        :class:`~robo_resume.mix.MixSource`'s ``keys=`` (a mix maps each source to its names).
        Raises ValueError naming unknown keys, a rename, or a required column.
        """
        if features is None:
            return self
        known = list(self.features) + list(self.dropped)
        if isinstance(features, Mapping):
            renames = {k: v for k, v in features.items() if v is not None and v != k}
            if renames:
                raise ValueError(
                    describe(
                        "features= renames keys, which a single dataset does not do",
                        expected="a list of keys to keep, or {key: None} for keys to drop",
                        found=renames,
                        fix="rename in a mix with MixSource(root, keys={...}), or rename the "
                        "keys of the batches in the training loop",
                    )
                )
            drop = [k for k, v in features.items() if v is None]
            keep = [k for k in self.features if k not in drop]
            named = list(features)
        elif isinstance(features, str) or not isinstance(features, Iterable):
            raise ValueError(
                describe(
                    "features= must name keys",
                    expected="a list of keys to keep, or {key: None} for keys to drop",
                    found=repr(features)[:120],
                )
            )
        else:
            named = keep = list(features)
        unknown = [k for k in named if k not in known]
        if unknown:
            raise ValueError(
                describe(
                    "features= names keys the dataset does not have",
                    expected=f"keys among {known}",
                    found=unknown,
                    file=self.root / "meta" / "info.json",
                )
            )
        gone = [k for k in self.features if k not in keep]
        required = [k for k in gone if k in REQUIRED_COLUMNS]
        if required:
            raise ValueError(
                describe(
                    "features= leaves out columns every item needs",
                    expected=f"{list(REQUIRED_COLUMNS)} kept (they place each frame)",
                    found=required,
                    fix="leave these keys out of the selection; drop them from the batches if "
                    "the model does not use them",
                )
            )
        if not gone:
            return self
        drop_set = set(gone)
        episodes = tuple(
            replace(e, videos={c: r for c, r in e.videos.items() if c not in drop_set})
            for e in self.episodes
        )
        return replace(
            self,
            features={k: v for k, v in self.features.items() if k not in drop_set},
            camera_keys=tuple(c for c in self.camera_keys if c not in drop_set),
            episodes=episodes,
            dropped=tuple(sorted({*self.dropped, *gone})),
        )

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
        h.update(json.dumps(sorted({*self.features, *self.dropped}), sort_keys=True).encode())
        return {
            "version": self.version,
            "fps": self.fps,
            "num_episodes": self.num_episodes,
            "total_frames": self.total_frames,
            "episodes_sha256": h.hexdigest()[:16],
        }
