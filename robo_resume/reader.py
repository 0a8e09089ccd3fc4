"""Random-access reader with ``LeRobotDataset``-compatible items.

``LeRobotReader(root)[i]`` returns the same item as
``lerobot.datasets.lerobot_dataset.LeRobotDataset(repo_id, root=root, video_backend="pyav")[i]``
(see :mod:`robo_resume.items` for the item layout), without importing lerobot. Consecutive
indices reuse the open video decoders, so reading in order does not seek per frame.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import describe
from .format.metadata import DatasetMeta, load_metadata
from .items import EpisodeRangeReader, ItemBuilder, ItemOptions
from .splits import Split, resolve_selection

__all__ = ["EpisodeSelection", "LeRobotReader", "select_episodes"]


EpisodeSelection = Iterable[int] | str | Split | None
"""What ``episodes=`` accepts: indices, a slice string like ``"train[:90%]"``, a Split, or None."""


def select_episodes(meta: DatasetMeta, episodes: EpisodeSelection) -> tuple[int, ...]:
    """Resolve an episode selection; returns sorted unique episode indices (all if None).

    ``episodes`` is one of: ``None`` (all), episode indices (``[0, 3, 7]``, ``range(10)``), a
    slice string by position in the HF datasets style (``"train[:90%]"``, ``"train[90%:]"``,
    ``"[10:20]"``; never shuffled), or a seeded :class:`~robo_resume.splits.Split` (shuffled by
    episode). See :mod:`robo_resume.splits` for the rounding rules. Only indices are computed;
    nothing is read or copied.
    """
    if episodes is None:
        return tuple(e.episode_index for e in meta.episodes)
    if isinstance(episodes, str | Split):
        splits = meta.info.get("splits") if isinstance(meta.info, Mapping) else None
        return resolve_selection(
            episodes,
            [e.episode_index for e in meta.episodes],
            splits=splits if isinstance(splits, Mapping) else None,
        )
    chosen = sorted({int(e) for e in episodes})
    known = {e.episode_index for e in meta.episodes}
    unknown = [e for e in chosen if e not in known]
    if unknown:
        raise ValueError(
            describe(
                "episodes= names episodes the dataset does not have",
                expected=f"episode indices among {min(known)}..{max(known)}",
                found=unknown[:10],
                file=meta.root / "meta",
            )
        )
    if not chosen:
        raise ValueError(describe("episodes= is empty", expected="at least one episode index"))
    return tuple(chosen)


class LeRobotReader(torch.utils.data.Dataset):
    """Map-style dataset over a LeRobot dataset on disk (v3.0 or v2.1).

    Args:
        root: dataset folder (holding ``meta/``).
        episodes: episode indices to keep (``index`` values stay absolute, as in lerobot), a
            slice string like ``"train[:90%]"`` or a :class:`~robo_resume.splits.Split`.
        delta_timestamps: ``{key: [seconds, ...]}`` windows, as in lerobot.
        image_transforms: applied to each camera tensor of an item.
        image_dtype: "float32" (lerobot's default) or "uint8".
        tolerance_s: timestamp tolerance when matching video frames (lerobot default 1e-4).
        decoder_threads: threads per decoder (0 = FFmpeg's choice).

    ``len(reader)`` is the number of selected frames; ``reader[i]`` is the ``i``-th of them in
    episode order. Picklable (open decoders are not carried along).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        episodes: EpisodeSelection = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        image_dtype: str = "float32",
        tolerance_s: float = 1e-4,
        decoder_threads: int = 0,
        meta: DatasetMeta | None = None,
    ) -> None:
        self.meta = meta if meta is not None else load_metadata(root)
        self.options = ItemOptions(
            delta_timestamps=delta_timestamps,
            image_dtype=image_dtype,
            image_transforms=image_transforms,
            tolerance_s=tolerance_s,
            decoder_threads=decoder_threads,
        )
        self.builder = ItemBuilder(self.meta, self.options)
        self.episodes = select_episodes(self.meta, episodes)
        lengths = [self.meta.episode(e).length for e in self.episodes]
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
        """Map a position ``0 <= i < len(self)`` to ``(episode_index, frame_index)``."""
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
        return (
            f"LeRobotReader(root={str(self.meta.root)!r}, version={self.meta.version}, "
            f"episodes={self.num_episodes}, frames={len(self)}, "
            f"cameras={list(self.meta.camera_keys)})"
        )
