"""The episodes of a dataset as columns: :class:`EpisodeTable`, and :class:`Episodes`, its
read-only sequence of :class:`~robo_resume.format.meta_types.EpisodeInfo` views.

A dataset of 10^6 episodes is about 90 MB of int64/float64 columns here, against several GB as
one Python object per episode (and seconds to build them). The columns are what planning and
fingerprints compute with (:meth:`EpisodeTable.spans`); an :class:`EpisodeInfo` is built only
when a caller asks for one episode (``meta.episode(e)``, ``meta.episodes[k]``).

Invariants (checked by the loaders before a table is built, see
:mod:`~robo_resume.format.validate`): ``episode_index`` is sorted and unique, every column has
one row per episode in that order, and every array is read-only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

__all__ = [
    "EpisodeInfo",
    "EpisodeTable",
    "Episodes",
    "VideoColumns",
    "VideoRef",
    "take_ragged",
    "task_columns",
]


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


def _frozen(a: Any, dtype: Any) -> np.ndarray:
    out = np.ascontiguousarray(a, dtype=dtype)
    if out is a:
        out = out.view()
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class VideoColumns:
    """One camera's video columns: episode ``k`` is shown by file ``paths[file[k]]`` (relative
    to the dataset root) from ``from_timestamp[k]`` to ``to_timestamp[k]`` seconds."""

    file: np.ndarray  # int32 codes into paths
    paths: tuple[str, ...]
    from_timestamp: np.ndarray  # float64
    to_timestamp: np.ndarray  # float64

    def __post_init__(self) -> None:
        object.__setattr__(self, "file", _frozen(self.file, np.int32))
        object.__setattr__(self, "from_timestamp", _frozen(self.from_timestamp, np.float64))
        object.__setattr__(self, "to_timestamp", _frozen(self.to_timestamp, np.float64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VideoColumns):
            return NotImplemented
        return (
            self.paths == other.paths
            and np.array_equal(self.file, other.file)
            and np.array_equal(self.from_timestamp, other.from_timestamp)
            and np.array_equal(self.to_timestamp, other.to_timestamp)
        )


@dataclass(frozen=True, eq=False)
class EpisodeTable:
    """Validated episode metadata, one row per episode, sorted by ``episode_index``.

    - ``length``, ``dataset_from_index``: the episode's global ``index`` range
      ``[dataset_from_index, dataset_from_index + length)``;
    - ``data_file``, ``data_paths``: the episode's rows are ``[data_row_start,
      data_row_start + length)`` of ``data_paths[data_file[k]]``;
    - ``task_offsets``, ``task_codes``, ``task_names``: the episode's ``tasks`` entry is
      ``task_names[c]`` for ``c`` in ``task_codes[task_offsets[k]:task_offsets[k + 1]]``;
    - ``videos``: per camera (info.json order), its :class:`VideoColumns`.

    Integers are int64 (file codes int32), timestamps float64; arrays are read-only.
    """

    episode_index: np.ndarray
    length: np.ndarray
    dataset_from_index: np.ndarray
    data_row_start: np.ndarray
    data_file: np.ndarray
    data_paths: tuple[str, ...]
    task_offsets: np.ndarray
    task_codes: np.ndarray
    task_names: tuple[str, ...]
    videos: Mapping[str, VideoColumns]

    def __post_init__(self) -> None:
        for name in ("episode_index", "length", "dataset_from_index", "data_row_start"):
            object.__setattr__(self, name, _frozen(getattr(self, name), np.int64))
        object.__setattr__(self, "task_offsets", _frozen(self.task_offsets, np.int64))
        object.__setattr__(self, "data_file", _frozen(self.data_file, np.int32))
        object.__setattr__(self, "task_codes", _frozen(self.task_codes, np.int32))
        object.__setattr__(self, "videos", dict(self.videos))

    def __len__(self) -> int:
        return len(self.episode_index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpisodeTable):
            return NotImplemented
        arrays = (
            "episode_index",
            "length",
            "dataset_from_index",
            "data_row_start",
            "data_file",
            "task_offsets",
            "task_codes",
        )
        return (
            all(np.array_equal(getattr(self, a), getattr(other, a)) for a in arrays)
            and self.data_paths == other.data_paths
            and self.task_names == other.task_names
            and dict(self.videos) == dict(other.videos)
        )

    def info(self, k: int) -> EpisodeInfo:
        """The :class:`EpisodeInfo` of row ``k`` (a position, not an episode_index)."""
        lo, hi = self.task_offsets[k], self.task_offsets[k + 1]
        names = self.task_names
        return EpisodeInfo(
            episode_index=int(self.episode_index[k]),
            length=int(self.length[k]),
            dataset_from_index=int(self.dataset_from_index[k]),
            data_path=self.data_paths[self.data_file[k]],
            data_row_start=int(self.data_row_start[k]),
            tasks=tuple(names[c] for c in self.task_codes[lo:hi].tolist()),
            videos={
                cam: VideoRef(
                    path=v.paths[v.file[k]],
                    from_timestamp=float(v.from_timestamp[k]),
                    to_timestamp=float(v.to_timestamp[k]),
                )
                for cam, v in self.videos.items()
            },
        )

    def position(self, episode_index: Any) -> int | None:
        """The row of ``episode_index``, or None when the table has no such episode (as a dict
        keyed by the ints would answer: ``3.0`` finds episode 3, ``3.5`` or ``"3"`` none)."""
        idx = self.episode_index
        if not isinstance(episode_index, int | float | np.integer | np.floating):
            return None
        k = int(np.searchsorted(idx, episode_index))
        return k if k < len(idx) and idx[k] == episode_index else None

    def positions(self, episodes: Any) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the episode indices ``episodes`` (any int sequence or array), and a boolean
        mask of those found (rows of missing episodes are meaningless)."""
        want = np.asarray(episodes, dtype=np.int64).reshape(-1)
        idx = self.episode_index
        k = np.searchsorted(idx, want)
        safe = np.minimum(k, max(len(idx) - 1, 0))
        found = (k < len(idx)) & (idx[safe] == want) if len(idx) else np.zeros(len(want), bool)
        return safe, found

    def without_cameras(self, drop: set[str]) -> EpisodeTable:
        """This table without the video columns of the cameras in ``drop``."""
        return EpisodeTable(
            episode_index=self.episode_index,
            length=self.length,
            dataset_from_index=self.dataset_from_index,
            data_row_start=self.data_row_start,
            data_file=self.data_file,
            data_paths=self.data_paths,
            task_offsets=self.task_offsets,
            task_codes=self.task_codes,
            task_names=self.task_names,
            videos={c: v for c, v in self.videos.items() if c not in drop},
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (the path and task strings not counted)."""
        arrays = [
            self.episode_index,
            self.length,
            self.dataset_from_index,
            self.data_row_start,
            self.data_file,
            self.task_offsets,
            self.task_codes,
        ]
        for v in self.videos.values():
            arrays += [v.file, v.from_timestamp, v.to_timestamp]
        return sum(a.nbytes for a in arrays)


class Episodes(Sequence[EpisodeInfo]):
    """``DatasetMeta.episodes``: a read-only sequence over an :class:`EpisodeTable`.

    Indexing (by position, negative positions and slices too) and iteration build each
    :class:`EpisodeInfo` on access, so it behaves like the tuple it replaces. Iterating over
    10^6 episodes builds 10^6 objects: code that runs per dataset should use the columns
    (``meta.columns``, :meth:`DatasetMeta.spans`) instead.
    """

    __slots__ = ("_table",)

    def __init__(self, table: EpisodeTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    @overload
    def __getitem__(self, k: int) -> EpisodeInfo: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[EpisodeInfo, ...]: ...

    def __getitem__(self, k: int | slice) -> EpisodeInfo | tuple[EpisodeInfo, ...]:
        n = len(self._table)
        if isinstance(k, slice):
            return tuple(self._table.info(i) for i in range(*k.indices(n)))
        k = int(k)
        if not -n <= k < n:
            raise IndexError(f"episode position {k} out of range for {n} episodes")
        return self._table.info(k % n)

    def __iter__(self) -> Iterator[EpisodeInfo]:
        info = self._table.info
        for k in range(len(self._table)):
            yield info(k)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Episodes):
            return self._table == other._table
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Episodes({len(self)} episodes)"


def task_columns(
    tasks: Sequence[tuple[str, ...]],
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """``(task_offsets, task_codes, task_names)`` of per-episode task tuples (see
    :class:`EpisodeTable`); names are numbered in order of first appearance."""
    names: dict[str, int] = {}
    lengths = np.fromiter((len(t) for t in tasks), dtype=np.int64, count=len(tasks))
    codes = [names.setdefault(s, len(names)) for t in tasks for s in t]
    offsets = np.zeros(len(tasks) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, np.asarray(codes, dtype=np.int32), tuple(names)


def take_ragged(
    offsets: np.ndarray, codes: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The ragged column ``(offsets, codes)`` restricted to and reordered as ``rows``."""
    lengths = np.diff(offsets)[rows]
    new = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    starts = np.repeat(offsets[:-1][rows] - new[:-1], lengths)
    return new, codes[np.arange(int(new[-1]), dtype=np.int64) + starts]
