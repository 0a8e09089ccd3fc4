"""A parquet column read for items as numpy (:func:`column_to_numpy`): scalars, fixed and
variable lists, lists of lists (lerobot's 2-D to 5-D features), refused when ragged or holding
nulls among their values."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CorruptFileError, describe
from .arrow_columns import plain_numpy

__all__ = ["column_to_numpy"]


def column_to_numpy(
    column, *, name: str, file: str | Path, first_row: int = 0, episode: int | None = None
) -> np.ndarray:
    """Convert a pyarrow column to numpy: scalars 1-D, fixed or variable lists 2-D, lists of
    lists one dimension more per level (``(rows, 2, 3)`` for lerobot's ``Array2D`` feature of
    shape ``(2, 3)``, stored as a ``datasets`` extension type over lists of lists).

    Lists of one length convert in one call to an array of their element type; lists of
    different lengths, or holding nulls among their values, raise :class:`CorruptFileError`
    naming the column, the file, ``episode`` and (from ``first_row``, the file row of the
    column's first row) the row.
    """
    return _to_numpy(column, name, file, first_row, episode, 1)


def _to_numpy(
    column, name: str, file: str | Path, first_row: int, episode, per_row: int
) -> np.ndarray:
    """:func:`column_to_numpy` of one list level; ``per_row`` values of this level make one row
    of the file (1 at the top), so that an error names the file's row."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.ExtensionArray):  # datasets' Array2D..5D: lists of lists
        column = column.storage
    t = column.type
    if pa.types.is_fixed_size_list(t):
        width = t.list_size
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        if len(column) == 0 and not _is_list(t.value_type):
            return np.zeros((0, 0), dtype=t.value_type.to_pandas_dtype())
        widths = np.diff(_numpy(column.offsets))
        if len(widths) and widths.min() != widths.max():
            bad = int(np.argmax(widths != widths[0]))
            raise CorruptFileError(
                describe(
                    f"Column '{name}' holds lists of different lengths",
                    expected="the same length in every row",
                    found=f"lengths {sorted(set(widths.tolist()))}, the first other than "
                    f"{int(widths[0])} in row {first_row + bad // per_row}",
                    file=file,
                    episode=episode,
                    fix="every row of a feature holds the same number of values; download the "
                    "file again or rewrite the column",
                )
            )
        width = int(widths[0]) if len(widths) else 0
    else:
        return _numpy(column)
    values = column.flatten()
    _refuse_null_values(values, width * per_row, name, file, first_row, episode)
    if _is_list(values.type):
        inner = _to_numpy(values, name, file, first_row, episode, width * per_row)
        return inner.reshape(len(column), width, *inner.shape[1:])
    return _numpy(values).reshape(len(column), width)


def _is_list(t) -> bool:
    import pyarrow as pa

    if isinstance(t, pa.ExtensionType):
        t = t.storage_type
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _numpy(array) -> np.ndarray:
    """An Arrow array as numpy: integers and floats without nulls straight from their buffers
    (:func:`~.arrow_columns.plain_numpy`), anything else through pyarrow's ``to_numpy``. That
    imports pandas, which every fresh DataLoader worker would pay on its first read."""
    plain = plain_numpy(array)
    return plain if plain is not None else array.to_numpy(zero_copy_only=False)


def _refuse_null_values(
    values, width: int, name: str, file: str | Path, first_row: int, episode
) -> None:
    """Raise if the flattened list values of a column hold nulls (they would become NaN)."""
    if values.null_count == 0:
        return
    import pyarrow.compute as pc

    k = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
    raise CorruptFileError(
        describe(
            f"A data file's column '{name}' holds null values inside its lists",
            expected="a number in every element of every row",
            found=f"{values.null_count} null elements, the first in row "
            f"{first_row + k // max(width, 1)}",
            file=file,
            episode=episode,
            fix="the file is damaged or was written with missing values; download it again",
        )
    )
