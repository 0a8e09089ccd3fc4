"""lerobot 0.6's language annotation columns, read as ``LeRobotDataset`` returns them.

``language_persistent`` and ``language_events`` (info.json dtype ``language``, written by
``lerobot-annotate``) hold per frame a list of message rows: structs ``{role, content, style,
timestamp, camera, tool_calls}`` (persistent: the episode's plan, subtasks, memory, repeated on
every frame) and ``{role, content, style, camera, tool_calls}`` (events: the rows that fire at
this frame's timestamp). ``LeRobotDataset.__getitem__`` returns them as Python objects, decoded
by HF ``datasets`` from lerobot's schema (``lerobot.datasets.language``), and leaves them raw:
rendering into chat messages is a processor step (``RenderMessagesStep``), not the dataset's.

:func:`language_column` gives the same values, exactly:

- a frame's value is a ``list`` of ``dict`` rows, or ``None`` where the column is null (a
  declared column that ``lerobot-annotate`` has not filled yet);
- each row has the schema's keys in the schema's order (a field the file lacks is ``None``, as
  HF's cast fills it); ``role``, ``content``, ``style`` and ``camera`` are ``str`` or ``None``;
  a persistent ``timestamp`` is the float32 value as a Python ``float`` (lerobot's writer stores
  float64; HF casts to the schema's float32);
- ``tool_calls`` is ``None`` or a list of JSON values: HF stores each call as a JSON string (its
  ``Json`` feature, through pandas' ujson, whose ``dumps`` keeps 10 significant decimals), so a
  call stored as a struct comes back as the ``dict`` of its fields (``None`` for the fields
  another call of the file has) after that same round trip.

A field the schema does not have, or a value that is not a list of structs, is refused with
:class:`~robo_resume.errors.CorruptFileError` (HF's cast fails on them too).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ..errors import CorruptFileError, describe

__all__ = [
    "EVENT_ROW_FIELDS",
    "LANGUAGE_COLUMNS",
    "PERSISTENT_ROW_FIELDS",
    "is_language_column",
    "is_language_type",
    "language_column",
]

LANGUAGE_COLUMNS = ("language_persistent", "language_events")
"""lerobot 0.6's language annotation columns (``lerobot.datasets.language``)."""

PERSISTENT_ROW_FIELDS = ("role", "content", "style", "timestamp", "camera", "tool_calls")
"""The keys of a ``language_persistent`` row, in lerobot's schema order."""

EVENT_ROW_FIELDS = ("role", "content", "style", "camera", "tool_calls")
"""The keys of a ``language_events`` row, in lerobot's schema order."""

_STRING_FIELDS = ("role", "content", "style", "camera")


def is_language_column(key: str) -> bool:
    """True for the two column names lerobot 0.6 reads as language annotations (it goes by
    the name, as ``lerobot.datasets.language.is_language_column`` does)."""
    return key in LANGUAGE_COLUMNS


def is_language_type(t: Any) -> bool:
    """True for an Arrow type a language column can have: a list of structs, a list of nulls
    (no row anywhere in the file), or null (a column never filled)."""
    import pyarrow as pa

    if pa.types.is_null(t):
        return True
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    return pa.types.is_struct(t.value_type) or pa.types.is_null(t.value_type)


def _json_round_trip(values: list[Any]) -> list[Any]:
    """``values`` as HF ``datasets``' ``Json`` feature stores and decodes them (pandas' ujson)."""
    import pandas as pd

    dumps, loads = pd.io.json.ujson_dumps, pd.io.json.ujson_loads
    return [loads(dumps(v)) for v in values]


def _tool_calls(array: Any, where: Mapping[str, Any]) -> list[Any]:
    """The ``tool_calls`` field of every row (``None`` or a list of JSON values)."""
    import pyarrow as pa

    t = array.type
    if pa.types.is_null(t):
        return [None] * len(array)
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        _refuse(where, f"'tool_calls' of arrow type {t}", "a list of JSON values")
    offsets = array.offsets.to_numpy()
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    base = int(offsets[0])
    flat = array.values.slice(base, int(offsets[-1]) - base)
    extension = isinstance(flat.type, pa.BaseExtensionType)  # arrow.json, HF's Json storage
    inner = flat.type.storage_type if extension else flat.type
    if pa.types.is_string(inner) or pa.types.is_large_string(inner):
        import pandas as pd

        strings = (flat.storage if extension else flat).to_pylist()
        try:  # JSON strings are decoded; other strings are stored as JSON strings first
            calls = [None if s is None else pd.io.json.ujson_loads(s) for s in strings]
        except ValueError:
            calls = _json_round_trip(strings)
    else:
        calls = _json_round_trip(flat.to_pylist())
    return [
        calls[int(offsets[i]) - base : int(offsets[i + 1]) - base] if ok else None
        for i, ok in enumerate(valid.tolist())
    ]


def _refuse(where: Mapping[str, Any], found: str, expected: str) -> NoReturn:
    raise CorruptFileError(
        describe(
            f"A data file's language column '{where['name']}' does not have lerobot's schema",
            expected=f"{expected} (lerobot.datasets.language)",
            found=found,
            file=where["file"],
            episode=where["episode"],
            fix="write the column with lerobot-annotate, or remove it: lerobot-edit-dataset "
            f"--operation.type remove_feature --operation.feature_names \"['{where['name']}']\"",
        )
    )


def language_column(
    column: Any, *, name: str, file: str | Path, first_row: int = 0, episode: int | None = None
) -> np.ndarray:
    """Convert a pyarrow language column to the values ``LeRobotDataset`` items hold.

    Args:
        column: the ``pyarrow`` (chunked) array of ``name`` for the rows read.
        name: ``language_persistent`` or ``language_events`` (which row fields to give).
        file: the parquet file (for errors).
        first_row: the file row of the column's first row (for errors).
        episode: the episode read (for errors).

    Returns:
        A 1-D object array with one value per row: ``None`` or a ``list`` of ``dict`` rows, as
        the module docstring describes. Every row's list and dicts are its own objects.

    Raises:
        CorruptFileError: the column is not a list of structs, or a row has a field lerobot's
            schema lacks.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    where = {"name": name, "file": file, "episode": episode}
    n = len(column)
    out = np.empty(n, dtype=object)
    if pa.types.is_null(column.type):
        return out  # all None
    if not is_language_type(column.type):
        _refuse(where, f"arrow type {column.type}", "a list of message structs per row")
    fields = PERSISTENT_ROW_FIELDS if name == "language_persistent" else EVENT_ROW_FIELDS
    if column.null_count == n:
        return out  # all None (kernels that build arrays fail on the JSON extension type)
    offsets = column.offsets.to_numpy()  # n + 1 of them, from the array's own offset
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    base = int(offsets[0])
    flat = column.values.slice(base, int(offsets[-1]) - base)  # the rows' elements
    m = len(flat)
    values: dict[str, list[Any]] = {}
    present = [True] * m
    if pa.types.is_struct(flat.type):
        have = [flat.type.field(i).name for i in range(flat.type.num_fields)]
        extra = [f for f in have if f not in fields]
        if extra:
            _refuse(
                where,
                f"row fields {have} (not in the schema: {extra}, first at row {first_row})",
                f"row fields {list(fields)}",
            )
        if flat.null_count:
            present = pc.is_valid(flat).to_pylist()
        for f in fields:
            if f not in have:
                continue
            child = flat.field(f)  # sliced as flat; flat's own nulls are in ``present``
            if f == "tool_calls":
                values[f] = _tool_calls(child, where)
                continue
            target = pa.float32() if f == "timestamp" else pa.string()
            try:
                values[f] = pc.cast(child, target).to_pylist()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                _refuse(where, f"field '{f}' of arrow type {child.type} ({exc})", f"{target}")
    else:  # a list of nulls: no row holds a struct
        present = [False] * m
    none = [None] * m
    columns = [values.get(f, none) for f in fields]
    rows = (
        [
            dict(zip(fields, row, strict=True)) if ok else None
            for ok, row in zip(present, zip(*columns, strict=True), strict=True)
        ]
        if m
        else []
    )
    for i in np.flatnonzero(valid).tolist():
        out[i] = rows[int(offsets[i]) - base : int(offsets[i + 1]) - base]
    return out
