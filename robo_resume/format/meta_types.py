"""The metadata type :class:`DatasetMeta`.

:class:`EpisodeInfo` and :class:`VideoRef` are defined with the episode columns in
:mod:`.episode_table`.

What :func:`robo_resume.format.metadata.load_metadata` returns; no file is read here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import (
    MetadataMismatchError,
    describe,
)
from .episode_table import EpisodeInfo, Episodes, EpisodeTable, VideoRef
from .file_access import LOCAL, FileAccess
from .language import is_language_column

__all__ = ["REQUIRED_COLUMNS", "SUPPORTED_VERSIONS", "DatasetMeta", "EpisodeInfo", "VideoRef"]

SUPPORTED_VERSIONS = ("v2.1", "v3.0")

CONVERT_HINT = {
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


class VideoFacts(Protocol):
    """The facts of an opened video that :meth:`DatasetMeta.check_video_stream` reads.

    A :class:`~robo_resume.format.video.VideoStreamInfo` has them.
    """

    @property
    def height(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def fps(self) -> float: ...
    @property
    def num_frames(self) -> int: ...


@dataclass(frozen=True)
class DatasetMeta:
    """Validated metadata of a LeRobot dataset on disk.

    What :func:`~robo_resume.format.metadata.load_metadata` returns; :attr:`episodes` is the
    read-only sequence of :class:`EpisodeInfo` views over ``columns``, and :meth:`spans` the
    columns planning needs.

    Attributes:
        root: the dataset folder (holding ``meta/``).
        version: the format version, "v3.0" or "v2.1" (info.json ``codebase_version``).
        fps: frames per second of every episode.
        features: info.json's features, ``{key: {"dtype": ..., "shape": ..., ...}}``.
        camera_keys: the video features, in info.json order.
        columns: the episodes as columns (an :class:`EpisodeTable`, sorted by
            ``episode_index``).
        tasks: ``tasks[i]`` is the task string of ``task_index == i``.
        info: meta/info.json as read.
        stats: meta/stats.json as read (empty without one).
        dropped: the features left out by :meth:`select` (never opened or decoded); the
            fingerprint still counts them, since they do not change which frames a run reads.
        files: where the data and video files below ``root`` are read from
            (:data:`~robo_resume.format.file_access.LOCAL`, or a remote dataset's store, whose
            ``root`` is a local copy of its ``meta/``).
    """

    root: Path
    version: str
    fps: int
    features: Mapping[str, Mapping[str, Any]]
    camera_keys: tuple[str, ...]
    columns: EpisodeTable
    tasks: tuple[str, ...]
    info: Mapping[str, Any]
    stats: Mapping[str, Any]
    dropped: tuple[str, ...] = ()
    files: FileAccess = field(default=LOCAL, compare=False, repr=False)

    def select(self, features: Any) -> DatasetMeta:
        """This metadata without the features not selected: they are never opened or decoded.

        The columns every item needs (``index``, ``episode_index``, ``frame_index``,
        ``timestamp``, ``task_index``) are always kept. A dropped video feature's files are not
        needed at all (neither checked nor opened), so a copy of a dataset without some
        camera's mp4s streams the other features. Renaming is
        :class:`~robo_resume.mix.MixSource`'s ``keys=`` (a mix maps each source to its names).

        Args:
            features: None (all), a sequence of feature keys to keep, or a mapping
                ``{key: None}`` of keys to drop.

        Returns:
            The selected metadata (``self`` when nothing is dropped), with the dropped
            features in ``dropped``.

        Raises:
            ValueError: ``features`` names unknown keys, renames a key, leaves out a required
                column, or is not a list or mapping of keys.
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
            named = list(features)
            keep = named + [k for k in REQUIRED_COLUMNS if k not in named]  # always kept
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
        if required:  # (only a mapping drops them: a list keeps them)
            raise ValueError(
                describe(
                    "features= drops columns every item needs",
                    expected=f"{list(REQUIRED_COLUMNS)} kept (they place each frame)",
                    found=f"{{key: None}} for {required}",
                    fix="take these keys out of the mapping (they are always kept); drop them "
                    "from the batches if the model does not use them",
                )
            )
        if not gone:
            return self
        drop_set = set(gone)
        return replace(
            self,
            features={k: v for k, v in self.features.items() if k not in drop_set},
            camera_keys=tuple(c for c in self.camera_keys if c not in drop_set),
            columns=self.columns.without_cameras(drop_set),
            dropped=tuple(sorted({*self.dropped, *gone})),
        )

    @property
    def episodes(self) -> Episodes:
        """The episodes in ``episode_index`` order, as a read-only sequence.

        Its :class:`EpisodeInfo` items are built on access (see
        :class:`~.episode_table.Episodes`).
        """
        return Episodes(self.columns)

    @property
    def episode_indices(self) -> np.ndarray:
        """The ``episode_index`` of every episode, sorted (a read-only int64 array)."""
        return self.columns.episode_index

    @property
    def total_frames(self) -> int:
        """Number of frames over all episodes."""
        return int(self.columns.length.sum(dtype=np.int64))

    @property
    def num_episodes(self) -> int:
        """Number of episodes."""
        return len(self.columns)

    def episode(self, episode_index: int) -> EpisodeInfo:
        """The episode with this ``episode_index``.

        Args:
            episode_index: the episode's ``episode_index``.

        Returns:
            Its :class:`EpisodeInfo`.

        Raises:
            KeyError: no such episode (the message names the valid ones).
        """
        pos = self.columns.position(episode_index)
        if pos is None:
            raise self._unknown(episode_index)
        return self.columns.info(pos)

    def spans(self, episodes: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The columns planning needs: ``(episode_index, dataset_from_index, length)``.

        Episode ``e`` holds the global indices ``[dataset_from_index, dataset_from_index +
        length)``. This is the columnar form of ``[(e, meta.episode(e).dataset_from_index,
        meta.episode(e).length) for e in episodes]``: no per-episode object is built.

        Args:
            episodes: any sequence or array of episode indices; None: every episode, sorted.

        Returns:
            Three int64 arrays of equal length, one entry per episode of ``episodes`` in the
            order given.

        Raises:
            KeyError: (as :meth:`episode`) naming the first unknown episode.
        """
        t = self.columns
        if episodes is None:
            return t.episode_index, t.dataset_from_index, t.length
        rows, found = t.positions(episodes)
        if not found.all():
            raise self._unknown(int(np.asarray(episodes, dtype=np.int64).reshape(-1)[~found][0]))
        return t.episode_index[rows], t.dataset_from_index[rows], t.length[rows]

    def _unknown(self, episode_index: Any) -> KeyError:
        idx = self.columns.episode_index
        return KeyError(
            describe(
                "Unknown episode",
                expected=f"an episode_index among the {self.num_episodes} episodes "
                f"({int(idx[0])}..{int(idx[-1])})"
                if len(idx)
                else "a dataset with episodes",
                found=episode_index,
                file=self.root / "meta",
            )
        )

    def data_columns(self) -> tuple[str, ...]:
        """Names of the features stored in the data parquet files.

        Returns:
            All but the video features, in info.json order (the order of an item's keys
            after the video cameras).
        """
        return tuple(k for k, v in self.features.items() if v.get("dtype") != "video")

    @property
    def image_keys(self) -> tuple[str, ...]:
        """``dtype: image`` features (frames stored in the data parquet), in info.json order."""
        return tuple(k for k, v in self.features.items() if v.get("dtype") == "image")

    @property
    def visual_keys(self) -> tuple[str, ...]:
        """Every key whose values are images: ``camera_keys`` (video) then ``image_keys``.

        lerobot calls this set ``camera_keys``; here ``camera_keys`` are the video features.
        """
        return self.camera_keys + self.image_keys

    @property
    def string_keys(self) -> tuple[str, ...]:
        """``dtype: string`` features (a Python ``str`` per item), in info.json order."""
        return tuple(k for k, v in self.features.items() if v.get("dtype") == "string")

    @property
    def language_keys(self) -> tuple[str, ...]:
        """The language columns (lerobot 0.6's ``language_persistent``, ``language_events``).

        A list of message dicts, or None, per item; in info.json order.
        """
        return tuple(k for k in self.features if is_language_column(k))

    def frame_size(self, camera: str) -> tuple[int, int] | None:
        """The size of a camera's frames according to info.json.

        Args:
            camera: a video or image feature key.

        Returns:
            ``(height, width)``, or None if info.json gives no 3-dimensional shape.
        """
        ft = self.features.get(camera) or {}
        shape, names = ft.get("shape"), ft.get("names")
        if not isinstance(shape, list | tuple) or len(shape) != 3:
            return None
        if isinstance(names, list | tuple) and "height" in names and "width" in names:
            return int(shape[names.index("height")]), int(shape[names.index("width")])
        return int(shape[0]), int(shape[1])  # lerobot's (height, width, channels)

    def _resized_shape(self, camera: str, height: int, width: int) -> list[int]:
        """``features[camera].shape`` with its height and width replaced (channels kept)."""
        ft = self.features.get(camera) or {}
        shape, names = list(ft.get("shape") or (0, 0, 3)), ft.get("names")
        if isinstance(names, list | tuple) and "height" in names and "width" in names:
            shape[names.index("height")], shape[names.index("width")] = height, width
        else:
            shape[0], shape[1] = height, width
        return [int(x) for x in shape]

    def check_video_stream(
        self,
        camera: str,
        stream: VideoFacts,
        *,
        file: str | Path | None = None,
        episode: int | None = None,
    ) -> None:
        """Compare an opened video with info.json. Call it once per video file.

        Rule: frames are decoded as the container has them (lerobot does the same), but a
        container whose frame size differs from ``features[camera].shape`` is refused (models
        are built from info.json's shapes; batches would not match them), and so is one whose
        frame rate differs from ``fps`` (frames are looked up at ``from_timestamp +
        timestamp``; at another rate that time shows other frames, silently).

        Args:
            camera: the video feature the file holds.
            stream: a :class:`~robo_resume.format.video.VideoStreamInfo`
                (``VideoReader.info()``, which reads the open container's header: no decoding).
            file: the video file, for the message.
            episode: an episode in the file, for the message.

        Raises:
            MetadataMismatchError: the frame size or frame rate differs from info.json.
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
                        f"{self._resized_shape(camera, stream.height, stream.width)} if the "
                        "video is right",
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
        """A small JSON-safe summary that changes when the dataset's content layout changes.

        Returns:
            A dict of JSON-safe values (what a resume state's fingerprint holds of the data).
        """
        h = hashlib.sha256()
        h.update(self.columns.length.tobytes())  # int64, episode_index order
        h.update(self.columns.dataset_from_index.tobytes())
        h.update(json.dumps(sorted({*self.features, *self.dropped}), sort_keys=True).encode())
        return {
            "version": self.version,
            "fps": self.fps,
            "num_episodes": self.num_episodes,
            "total_frames": self.total_frames,
            "episodes_sha256": h.hexdigest()[:16],
        }
