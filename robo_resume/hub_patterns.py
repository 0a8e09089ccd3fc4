"""Which files of a Hub dataset the selected episodes need, as paths and as ``allow_patterns``.

Pure: computed from the metadata alone, nothing is downloaded (:mod:`robo_resume.hub` downloads).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import PurePosixPath

from .format.metadata import DatasetMeta

__all__ = ["download_patterns", "episode_files"]


def episode_files(meta: DatasetMeta, episodes: Iterable[int]) -> tuple[str, ...]:
    """Data and video files (paths relative to the root, sorted) that ``episodes`` read."""
    files: set[str] = set()
    for e in episodes:
        ep = meta.episode(int(e))
        files.add(ep.data_path)
        files.update(ref.path for ref in ep.videos.values())
    return tuple(sorted(files))


def escape(path: str) -> str:
    """An fnmatch pattern matching exactly ``path`` (``*``, ``?``, ``[`` made literal)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def download_patterns(meta: DatasetMeta, episodes: Iterable[int]) -> tuple[str, ...]:
    """``allow_patterns`` that fetch exactly the files of ``episodes`` (see :func:`episode_files`).

    One literal pattern per file, except that a folder whose files (as listed by the
    metadata) are all needed becomes ``folder/*`` (the topmost such folder), so that selecting
    all episodes, or a contiguous slice, costs a few patterns instead of one per file
    (huggingface_hub matches every repo file against every pattern).
    """
    needed = set(episode_files(meta, episodes))
    every = set(episode_files(meta, (e.episode_index for e in meta.episodes)))
    below: dict[PurePosixPath, set[str]] = {}
    for f in every:
        for d in PurePosixPath(f).parents[:-1]:  # every folder but the root
            below.setdefault(d, set()).add(f)
    full = {d for d, files in below.items() if files <= needed}
    patterns = set()
    for f in needed:
        top = [d for d in PurePosixPath(f).parents[:-1] if d in full]
        patterns.add(escape(top[-1].as_posix()) + "/*" if top else escape(f))
    return tuple(sorted(patterns))
