"""Random-access reader with ``LeRobotDataset``-compatible items.

``LeRobotReader(root)[i]`` returns the same item as
``lerobot.datasets.lerobot_dataset.LeRobotDataset(repo_id, root=root, video_backend="pyav")[i]``
(see :mod:`robo_resume.items` for the item layout), without importing lerobot. Consecutive
indices reuse the open video decoders, so reading in order does not seek per frame.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .format.metadata import DatasetMeta, load_metadata
from .hub import resolve_dataset
from .items import EpisodeRangeReader, ItemBuilder, ItemOptions
from .splits import EpisodeSelection, select_episodes

__all__ = ["EpisodeSelection", "LeRobotReader", "select_episodes"]


class LeRobotReader(torch.utils.data.Dataset):
    """Map-style dataset over a LeRobot dataset on disk (v3.0 or v2.1).

    Args:
        root: dataset folder (holding ``meta/``). With ``repo_id``, a folder without
            ``meta/`` is where the Hub download goes (instead of the huggingface_hub cache).
        repo_id: ``"owner/name"`` of a dataset on the Hugging Face Hub, used when ``root`` is
            None or holds no dataset: the metadata and only the selected episodes' files are
            downloaded (or found in the cache; offline with ``HF_HUB_OFFLINE=1``). See
            :func:`robo_resume.hub.resolve_root`.
        revision: Hub branch, tag (e.g. "v3.0", "v2.1") or commit; None: the default branch.
        episodes: episode indices to keep (``index`` values stay absolute, as in lerobot), a
            slice string like ``"train[:90%]"`` or a :class:`~robo_resume.splits.Split`.
        features: which features items hold: a list of keys to keep, or ``{key: None}`` for
            keys to drop (None: all). A feature left out is never opened or decoded, so a
            policy that uses one camera of four decodes one, and a copy without some camera's
            mp4s streams the rest (:meth:`~robo_resume.format.metadata.DatasetMeta.select`).
        delta_timestamps: ``{key: [seconds, ...]}`` windows, as in lerobot.
        image_transforms: applied to each camera tensor of an item.
        image_dtype: "float32" (lerobot's default) or "uint8".
        tolerance_s: timestamp tolerance when matching video frames (lerobot default 1e-4).
        decoder_threads: FFmpeg threads per decoder (0 = FFmpeg's choice; default 1).
        meta: the dataset's metadata when already loaded (skips reading ``meta/`` again).

    ``len(reader)`` is the number of selected frames; ``reader[i]`` is the ``i``-th of them in
    episode order. Picklable (open decoders are not carried along).
    """

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        repo_id: str | None = None,
        revision: str | None = None,
        episodes: EpisodeSelection = None,
        features: Sequence[str] | Mapping[str, None] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        image_dtype: str = "float32",
        tolerance_s: float = 1e-4,
        decoder_threads: int = 1,
        meta: DatasetMeta | None = None,
    ) -> None:
        if meta is None:
            if repo_id is not None or root is None:
                root, meta = resolve_dataset(
                    repo_id, root=root, revision=revision, episodes=episodes, features=features
                )
            else:
                meta = load_metadata(root)
        self.meta = meta.select(features)
        self.repo_id, self.revision = repo_id, revision
        self.options = ItemOptions(
            delta_timestamps=delta_timestamps,
            image_dtype=image_dtype,
            image_transforms=image_transforms,
            tolerance_s=tolerance_s,
            decoder_threads=decoder_threads,
        )
        self.builder = ItemBuilder(self.meta, self.options)
        self.episodes = select_episodes(self.meta, episodes)
        lengths = self.meta.spans(self.episodes)[2]
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        self._open: OrderedDict[int, EpisodeRangeReader] = OrderedDict()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        return state

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def num_episodes(self) -> int:
        """Number of selected episodes."""
        return len(self.episodes)

    def locate(self, i: int) -> tuple[int, int]:
        """Map a position of the reader to its episode and frame.

        Args:
            i: a position ``0 <= i < len(self)`` (negative counts from the end).

        Returns:
            ``(episode_index, frame_index)``.

        Raises:
            IndexError: ``i`` is out of range.
        """
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for a reader of {n} frames")
        k = bisect.bisect_right(self._starts, i) - 1
        return self.episodes[k], i - self._starts[k]

    def __getitem__(self, i: int) -> dict[str, Any]:
        episode, frame = self.locate(int(i))
        reader = self._open.get(episode)
        if reader is None:
            length = self.meta.episode(episode).length
            reader = self.builder.episode_reader(episode, 0, length)
            self._open[episode] = reader
            while len(self._open) > 4:
                self._open.popitem(last=False)[1].close()
        else:
            self._open.move_to_end(episode)
        return reader.items([frame])[0]

    def close(self) -> None:
        """Close open decoders (they reopen lazily)."""
        while self._open:
            self._open.popitem()[1].close()

    def __repr__(self) -> str:
        hub = f"repo_id={self.repo_id!r}, " if self.repo_id else ""
        return (
            f"LeRobotReader({hub}root={str(self.meta.root)!r}, version={self.meta.version}, "
            f"episodes={self.num_episodes}, frames={len(self)}, "
            f"cameras={list(self.meta.camera_keys)})"
        )
