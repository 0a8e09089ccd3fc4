"""Where a dataset's data and video files are read from: the local disk, or a remote store.

The readers (:class:`~robo_resume.format.tabular.ParquetTable`,
:class:`~robo_resume.format.video.VideoReader`) name their file by a local path, ``root / rel``
as meta/ gives it, and open it through a :class:`FileAccess`. :data:`LOCAL` opens the path
itself (what pyarrow and PyAV are given is the path string, as before). A remote dataset's
metadata is a local copy of its ``meta/`` (``robo_resume.remote``), and its access serves the
data and video files below that copy's root from the store, as file objects that fetch byte
ranges; messages then name the file's URL (:meth:`FileAccess.where`).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, Protocol, TypeAlias

__all__ = ["LOCAL", "FileAccess", "LocalFiles", "Source"]

Source: TypeAlias = str | BinaryIO | io.RawIOBase
"""What pyarrow and PyAV are given: a path string, or a seekable binary file object."""


class FileAccess(Protocol):
    """How a reader checks, opens and names a dataset file given by its local path.

    An access must be picklable (DataLoader workers receive the readers), and open what it
    needs again in each process.
    """

    def is_file(self, path: Path) -> bool:
        """Whether the file exists (a missing one is reported by the reader, naming it)."""
        ...

    def open(self, path: Path) -> Source:
        """What pyarrow and PyAV open: the path string, or a seekable binary file object."""
        ...

    def where(self, path: Path) -> str | Path:
        """The file as messages name it (the path itself, or its URL)."""
        ...

    @property
    def plans(self) -> bool:
        """Whether :meth:`plan` does anything (a remote access fetches ahead; the disk not)."""
        ...

    def plan(self, ranges: Iterable[tuple[Path, int, int]]) -> None:
        """Fetch the byte ranges ``(path, start, end)`` ahead of their reads, lazily and in
        the order given, replacing an earlier plan. A hint: reads are the same without it."""
        ...

    def end_plan(self) -> None:
        """Stop fetching ahead and let go of what was fetched for the plan."""
        ...


class LocalFiles:
    """The local disk: a path is the file."""

    def is_file(self, path: Path) -> bool:
        """``path.is_file()``."""
        return path.is_file()

    def open(self, path: Path) -> str:
        """``str(path)`` (pyarrow and PyAV open it themselves)."""
        return str(path)

    def where(self, path: Path) -> Path:
        """``path``."""
        return path

    plans = False
    """The disk is read on demand: :meth:`plan` does nothing."""

    def plan(self, ranges: Iterable[tuple[Path, int, int]]) -> None:
        """Nothing (``ranges`` is not iterated)."""

    def end_plan(self) -> None:
        """Nothing."""

    def __repr__(self) -> str:
        return "LOCAL"

    def __reduce__(self) -> str:
        return "LOCAL"  # one instance, also after unpickling


LOCAL = LocalFiles()
"""The local disk (the default access of every reader)."""
