"""Which files a dataset needs, which are missing or unreadable, and which episodes are readable.

:func:`check_files` looks at every file the selected episodes need (one data parquet file per
episode, one mp4 per camera; v3.0 episodes share files, each file is checked once) and opens it
without decoding frames: a parquet file's footer is read (and its row count compared with the
rows meta/ says the episodes occupy), a video container is opened and must hold a video stream.
That is cheap (about a millisecond per file) and catches what a published copy usually lacks:
missing files, empty or truncated files. A file that opens but fails mid-decode is only found by
streaming it (``on_error="skip"`` skips it then).

:func:`readable_episodes` is the episode selection that results: pass it as ``episodes=`` or as
``Split(..., among=...)``, so that a seeded split is cut among readable episodes only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CorruptFileError, MissingFileError, RoboResumeError, describe
from .format.file_access import LOCAL, FileAccess
from .format.metadata import DatasetMeta, load_metadata
from .format.tabular import ParquetTable
from .remote.files import is_remote, remote_meta

__all__ = ["FileCheck", "FileProblem", "check_files", "readable_episodes"]


@dataclass(frozen=True)
class FileProblem:
    """One file the dataset needs that cannot be used.

    ``kind`` is "data" or "video" (``camera`` names the video's feature), ``problem`` is
    "missing" or "unreadable", ``episodes`` are the episodes that need the file, ``error`` is the
    error text (our message, naming the file and the fix).
    """

    path: str
    kind: str
    problem: str
    episodes: tuple[int, ...]
    error: str
    camera: str | None = None


@dataclass(frozen=True)
class FileCheck:
    """The result of :func:`check_files`: readable episodes and the files that failed."""

    root: Path
    episodes: tuple[int, ...]
    readable: tuple[int, ...]
    problems: tuple[FileProblem, ...] = field(default=())
    files_checked: int = 0

    @property
    def unreadable_episodes(self) -> tuple[int, ...]:
        """Checked episodes with at least one missing or unreadable file."""
        ok = set(self.readable)
        return tuple(e for e in self.episodes if e not in ok)

    def summary(self) -> str:
        """One line: how many episodes are readable, and which files failed (counts)."""
        missing = sum(p.problem == "missing" for p in self.problems)
        broken = len(self.problems) - missing
        return (
            f"{len(self.readable)} of {len(self.episodes)} episodes readable; "
            f"{missing} missing and {broken} unreadable file(s) of {self.files_checked} checked"
        )


def _open_video(path: Path, episode: int, files: FileAccess = LOCAL) -> None:
    """Open the container and find a video stream; no decoder is opened.

    So this process stays safe to fork DataLoader workers from (see
    ``decoded_in_this_process``).
    """
    import av

    where = files.where(path)
    if not files.is_file(path):
        raise MissingFileError(
            describe(
                "A video file is missing",
                expected="the mp4 that meta/ points to",
                found="no such file",
                file=where,
                episode=episode,
                fix="download the dataset's videos again, or select the readable episodes "
                "with episodes=readable_episodes(root)",
            )
        )
    source = files.open(path)
    try:
        with av.open(source, mode="r") as container:
            streams = len(container.streams.video)
        if not isinstance(source, str):
            source.close()
    except RoboResumeError:  # a remote read that failed for good: its own message
        raise
    except Exception as exc:  # av.error.InvalidDataError, EOFError, ...
        raise CorruptFileError(
            describe(
                "A video file cannot be opened",
                expected="a readable video container",
                found=f"{type(exc).__name__}: {exc}",
                file=where,
                episode=episode,
                fix="download this file again; it is probably truncated or empty",
            )
        ) from exc
    if not streams:
        raise CorruptFileError(
            describe(
                "A video file has no video stream",
                expected="one video stream",
                found="none",
                file=where,
                episode=episode,
                fix="re-encode or download this file again",
            )
        )


def check_files(
    source: str | Path | DatasetMeta, episodes: Iterable[int] | None = None
) -> FileCheck:
    """Check that the files of ``episodes`` exist and open; see the module doc.

    Nothing is decoded; each file is opened once however many episodes share it.

    Args:
        source: a dataset root, a remote dataset's URL (``hf://``, ``s3://``, ``gs://``,
            ``https://``), or its :class:`DatasetMeta`.
        episodes: the episode indices to check; None: all.

    Returns:
        A :class:`FileCheck`: the checked and readable episodes and the files that failed.
    """
    if isinstance(source, DatasetMeta):
        meta = source
    elif is_remote(source):
        meta = remote_meta(str(source))
    else:
        meta = load_metadata(source)
    chosen = (
        tuple(e.episode_index for e in meta.episodes)
        if episodes is None
        else tuple(sorted({int(e) for e in episodes}))
    )
    # file -> (kind, camera, episodes needing it, rows needed)
    needs: dict[str, list[Any]] = {}
    for e in chosen:
        ep = meta.episode(e)
        need = needs.setdefault(ep.data_path, ["data", None, [], 0])
        need[2].append(e)
        need[3] = max(need[3], ep.data_row_start + ep.length)
        for cam, ref in ep.videos.items():
            needs.setdefault(ref.path, ["video", cam, [], 0])[2].append(e)
    problems = []
    bad: set[int] = set()
    for rel, (kind, cam, eps, rows) in needs.items():
        path = meta.root / rel
        error = None
        try:
            if kind == "data":
                ParquetTable(path, files=meta.files).check_rows(rows, episode=eps[0])
            else:
                _open_video(path, eps[0], meta.files)
        except (RoboResumeError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            problem = "missing" if not meta.files.is_file(path) else "unreadable"
            problems.append(FileProblem(rel, kind, problem, tuple(eps), error, cam))
            bad.update(eps)
    return FileCheck(
        root=meta.root,
        episodes=chosen,
        readable=tuple(e for e in chosen if e not in bad),
        problems=tuple(problems),
        files_checked=len(needs),
    )


def readable_episodes(
    source: str | Path | DatasetMeta, episodes: Iterable[int] | None = None
) -> tuple[int, ...]:
    """Episodes whose files all exist and open, sorted.

    Usable as ``ChunkedEpisodeDataset(root, episodes=readable_episodes(root))`` or inside a
    seeded split, ``Split((0.9, 0.1), index=1, among=readable_episodes(root))``. Cheap: files
    are opened, not decoded (see :func:`check_files`).

    Args:
        source: a dataset root, a remote dataset's URL (``hf://``, ``s3://``, ``gs://``,
            ``https://``), or its :class:`DatasetMeta`.
        episodes: the episode indices to check; None: all.

    Returns:
        The readable episode indices, sorted.

    Raises:
        MissingFileError: no episode is readable.
    """
    result = check_files(source, episodes)
    if not result.readable:
        first = result.problems[0] if result.problems else None
        raise MissingFileError(
            describe(
                "No episode of the dataset has all its files",
                expected="at least one episode whose data and video files exist and open",
                found=result.summary() + (f", e.g. {first.error}" if first else ""),
                file=result.root,
                fix="download the dataset's data/ and videos/ folders",
            )
        )
    return result.readable
