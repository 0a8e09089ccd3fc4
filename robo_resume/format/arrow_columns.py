"""Arrow columns as numpy without pandas, the columnar reader of v2.1 ``episodes.jsonl``, and
:func:`release_freed_memory` (the allocators' cache after a load).

pyarrow's own ``to_numpy``, ``fill_null`` and ``read_table`` import pandas (a slow part of a
cold start); these do not. Anything unusual (nulls, other types, a line pyarrow cannot parse)
returns None, and the caller takes its row-by-row path, which names the bad row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .episode_table import take_ragged
from .validate import int_values

__all__ = ["jsonl_episode_columns", "plain_numpy", "release_freed_memory"]


def plain_numpy(col: Any) -> np.ndarray | None:
    """An integer or floating Arrow (Chunked)Array without nulls as numpy, from its buffers;
    None for anything else. pyarrow's own ``to_numpy`` imports pandas (a slow part of a cold
    ``robo-resume plan``); this does not."""
    import pyarrow as pa

    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    kind = col.type
    if col.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return None
    if pa.types.is_float16(kind):
        return None
    dtype = np.dtype(kind.to_pandas_dtype())
    parts = [
        np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * dtype.itemsize)
        for c in chunks
        if len(c)
    ]
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def integers_of(col: Any) -> np.ndarray:
    """:func:`plain_numpy` of an Arrow integer array that has no nulls by construction (a list
    array's offsets, a dictionary encoding's indices)."""
    out = plain_numpy(col)
    assert out is not None, col.type  # integers without nulls: plain_numpy's own case
    return out


def offsets_of(lists: Any) -> np.ndarray:
    """The offsets of an Arrow list array (``len(lists) + 1`` integers)."""
    return integers_of(lists.offsets)


def jsonl_episode_columns(
    path: Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]] | None:
    """``meta/episodes.jsonl`` as ``(episode_index, length, task_offsets, task_codes,
    task_names)``, stably sorted by episode_index, task names numbered in order of first use
    (what the row-by-row reader and :func:`~.episode_table.task_columns` give); None when
    pyarrow cannot read it or a column is not as lerobot writes it (integers without nulls,
    lists of strings without null strings) or the file is not UTF-8 (pyarrow does not check;
    the row-by-row reader names the byte). Columnar, so much faster than json per line."""
    import pyarrow as pa
    import pyarrow.json as pj

    data = path.read_bytes()
    try:
        data.decode("utf-8")  # the text is only checked: JSON is UTF-8, pyarrow takes any bytes
        table = pj.read_json(pa.BufferReader(data))
    except Exception:  # the row-by-row reader names the line
        return None
    names = table.column_names
    if "episode_index" not in names or "length" not in names:
        return None
    ep = plain_numpy(table.column("episode_index"))
    length = plain_numpy(table.column("length"))
    if ep is None or length is None or ep.dtype.kind != "i" or length.dtype.kind != "i":
        return None
    n = len(ep)
    if "tasks" in names:
        col = table.column("tasks").combine_chunks()
        kind = col.type
        if pa.types.is_null(kind):
            offsets, flat = np.zeros(n + 1, np.int64), None
        elif pa.types.is_list(kind) and pa.types.is_string(kind.value_type):
            flat = col.flatten()  # the values of the lists that are not null
            if flat.null_count:
                return None
            lengths = np.diff(offsets_of(col).astype(np.int64))
            if col.null_count:  # a missing or null list is no tasks
                bits = np.frombuffer(col.buffers()[0], np.uint8)
                valid = np.unpackbits(bits, bitorder="little")[col.offset : col.offset + n]
                lengths[valid == 0] = 0
            if int(lengths.sum()) != len(flat):
                return None
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
        else:
            return None
    else:
        offsets, flat = np.zeros(n + 1, np.int64), None
    if flat is not None and len(flat):
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(flat)
        codes = integers_of(encoded.indices).astype(np.int32)
        task_names = encoded.dictionary.to_pylist()
    else:
        codes, task_names = np.zeros(0, np.int32), []
    ep = int_values(ep, "episode_index", file=path)  # the row-by-row reader's checks
    length = int_values(length, "length", file=path, episodes=ep)
    if n and not (ep[1:] >= ep[:-1]).all():
        order = np.argsort(ep, kind="stable")
        ep, length = ep[order], length[order]
        offsets, codes = take_ragged(offsets, codes, order)
    if len(codes):  # number the names in order of first use, as task_columns does
        used, first = np.unique(codes, return_index=True)
        rank = np.empty(len(task_names), np.int32)
        by_first = used[np.argsort(first)]
        rank[by_first] = np.arange(len(by_first), dtype=np.int32)
        codes = rank[codes]
        task_names = [task_names[k] for k in by_first.tolist()]
    return ep, length, offsets, codes, tuple(task_names)


def release_freed_memory() -> None:
    """Hand the pages freed by a large load back to the system: Arrow's pool
    (``release_unused``) and glibc's heap (``malloc_trim``, Linux only; elsewhere nothing).

    Loading 10^6 episodes decodes about twice the columns it keeps, and both allocators keep
    the freed pages for reuse: without this the process keeps about three times the memory
    its columns need."""
    import ctypes
    import ctypes.util
    import sys

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass
