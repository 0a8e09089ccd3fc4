"""Parquet row-range reading with column projection.

:class:`ParquetTable` opens one data file lazily, remembers its row-group layout, and reads a row
range by decoding only the row groups that overlap it. Columns come back as numpy arrays with one
row per frame (vectors as 2-D arrays), the shape the item builder stacks into tensors.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import CorruptFileError, MetadataMismatchError, MissingFileError, describe

__all__ = ["ParquetTable", "column_to_numpy"]


def column_to_numpy(column, *, name: str, file: Path) -> np.ndarray:
    """Convert a pyarrow column to numpy: scalars 1-D, fixed or variable lists 2-D."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if pa.types.is_fixed_size_list(t):
        width = t.list_size
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(column), width)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lists = column.to_pylist()
        try:
            return np.asarray(lists, dtype=np.asarray(lists[0]).dtype if lists else np.float32)
        except ValueError as exc:
            raise CorruptFileError(
                describe(
                    f"Column '{name}' holds lists of different lengths",
                    expected="the same length in every row",
                    found={len(x) for x in lists if x is not None},
                    file=file,
                )
            ) from exc
    return column.to_numpy(zero_copy_only=False)


class ParquetTable:
    """Lazy reader of one parquet file; ``read(start, stop, columns)`` returns numpy columns.

    Not thread-safe; cheap to construct (the footer is read on first use). Picklable before
    first use, so it can be created in the main process and used in DataLoader workers.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = None
        self._rg_starts: list[int] = []
        self.num_rows = -1
        self.columns: tuple[str, ...] = ()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"] = None
        return state

    def _open(self, episode: int | None = None):
        if self._file is not None:
            return self._file
        import pyarrow.parquet as pq

        if not self.path.is_file():
            raise MissingFileError(
                describe(
                    "A data file is missing",
                    expected="the parquet file that meta/ points to",
                    found="no such file",
                    file=self.path,
                    episode=episode,
                    fix="download the dataset again, or select episodes whose files exist",
                )
            )
        try:
            f = pq.ParquetFile(self.path)
        except Exception as exc:  # ArrowInvalid, OSError, ... for truncated or corrupt footers
            raise CorruptFileError(
                describe(
                    "A data file is not a readable parquet file",
                    expected="a valid parquet file",
                    found=f"{type(exc).__name__}: {exc}",
                    file=self.path,
                    episode=episode,
                    fix="download this file again; it is probably truncated",
                )
            ) from exc
        md = f.metadata
        starts, total = [], 0
        for i in range(md.num_row_groups):
            starts.append(total)
            total += md.row_group(i).num_rows
        self._rg_starts = starts
        self.num_rows = total
        self.columns = tuple(f.schema_arrow.names)
        self._file = f
        return f

    def check_rows(self, needed_stop: int, *, episode: int) -> None:
        """Raise MetadataMismatchError if the file has fewer than ``needed_stop`` rows."""
        self._open(episode)
        if self.num_rows < needed_stop:
            raise MetadataMismatchError(
                describe(
                    "Episode metadata and the data file disagree on the number of rows",
                    expected=f"at least {needed_stop} rows (from meta/episodes lengths)",
                    found=f"{self.num_rows} rows",
                    file=self.path,
                    episode=episode,
                    fix="the dataset is inconsistent; download it again or rebuild its metadata",
                )
            )

    def read(
        self, start: int, stop: int, columns: Sequence[str], *, episode: int | None = None
    ) -> dict[str, np.ndarray]:
        """Return ``columns`` for rows ``[start, stop)``, decoding only overlapping row groups."""
        f = self._open(episode)
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise CorruptFileError(
                describe(
                    "A data file lacks columns that meta/info.json declares",
                    expected=f"columns {list(columns)}",
                    found=f"missing {missing}",
                    file=self.path,
                    episode=episode,
                    fix="the file does not match meta/info.json; download the dataset again",
                )
            )
        if stop > self.num_rows or start < 0:
            self.check_rows(stop, episode=episode if episode is not None else -1)
        first = bisect.bisect_right(self._rg_starts, start) - 1
        last = bisect.bisect_left(self._rg_starts, stop) - 1
        groups = list(range(max(first, 0), max(last, first) + 1))
        try:
            table = f.read_row_groups(groups, columns=list(columns))
        except Exception as exc:
            raise CorruptFileError(
                describe(
                    "A data file's row groups cannot be decoded",
                    expected="readable row groups",
                    found=f"{type(exc).__name__}: {exc}",
                    file=self.path,
                    episode=episode,
                    fix="download this file again",
                )
            ) from exc
        base = self._rg_starts[groups[0]] if groups else 0
        table = table.slice(start - base, stop - start)
        return {c: column_to_numpy(table.column(c), name=c, file=self.path) for c in columns}
