"""Items as rows of their batch: what a plain ``DataLoader(ds, batch_size=...)`` collates.

The item path of a ChunkedEpisodeDataset builds each batch's columns once (decoded straight into
place, images converted once per batch) and yields every item as a :class:`BlockItem`, a plain
``dict`` of :class:`BlockRow` views of its row of those columns. torch's ``default_collate``
would stack the rows of each column into a new tensor: at 480x640 float32, three cameras and
batch 32, that copy moves 350 MB per batch into freshly faulted memory and can take more time
than decoding. Two ways back to the batch
without the copy, each giving the values the copy would:

- :func:`collate_items`, registered for :class:`BlockItem` in ``default_collate_fn_map`` (the
  documented way to extend ``default_collate``): consecutive intact items of one batch, in
  order, collate to that batch's columns, with no Python work per item or per key. In a
  DataLoader worker the batch then reaches the main process as a :class:`RingBatch`, whose
  cameras live in the worker's reusable shared buffers (``robo_resume.stream.blocks``), freed
  when the main process drops the batch; there it is a plain ``dict`` of plain tensors.
- :class:`BlockRow` of :func:`rows_of` knows its column and row: ``torch.stack`` of consecutive
  rows of one column, in order, along dim 0, returns those rows of the column itself (with
  ``out=``, as default_collate passes in a DataLoader worker, ``out`` is pointed at them).

Any other stack or collation, and every other operation, is torch's own and returns plain
tensors. The one difference from a copy: the batch shares memory with the items it was collated
from. default_collate's items are dropped right after, so nothing can see it; code that keeps
items and modifies the batch in place sees the items change too.
"""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Sequence
from typing import Any, SupportsIndex

import torch
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from ..format.language import LANGUAGE_COLUMNS
from .buffers import release_when_dropped


class BlockRow(torch.Tensor):
    """Row ``i`` of a batch column (a view of it); stacks back without a copy (see the module).

    Behaves as a plain tensor everywhere: operations return plain tensors, pickling and
    ``copy.deepcopy`` give a plain compact copy of the row (never the whole column).
    """

    _rr_column: torch.Tensor
    _rr_row: int

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.stack:
            fast = _stack_rows(*args, **kwargs)
            if fast is not None:
                return fast
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return self.as_subclass(torch.Tensor).clone().__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()


def rows_of(column: torch.Tensor, i: int) -> BlockRow:
    """Row ``i`` of ``column`` (a plain tensor, rows along dim 0) as a :class:`BlockRow`."""
    row = column[i].as_subclass(BlockRow)
    row._rr_column, row._rr_row = column, i
    return row


def _stack_rows(tensors: Any, dim: int = 0, *, out: torch.Tensor | None = None):
    """The rows' column slice when ``tensors`` are consecutive rows of one column, else None."""
    if dim != 0 or not isinstance(tensors, (list, tuple)) or not tensors:
        return None
    first = tensors[0]
    column = getattr(first, "_rr_column", None)
    if column is None:
        return None
    start = first._rr_row
    for k, t in enumerate(tensors):
        if type(t) is not BlockRow or t._rr_column is not column or t._rr_row != start + k:
            return None
    n = len(tensors)
    if start == 0 and n == column.shape[0]:
        view = column
    else:
        view = column[start : start + n]
    if out is None:
        return view
    if out.dtype != view.dtype or out.device != view.device:
        return None
    return out.set_(view.untyped_storage(), view.storage_offset(), view.shape, view.stride())


logger = logging.getLogger("robo_resume")

OTHER_BATCH_NOTE = (
    "robo_resume: a DataLoader collated %d items that are not one whole batch of the dataset "
    "(its batch_size is %d), so they are stacked (copied) as torch does. "
    "DataLoader(ds, batch_size=ds.batch_size) gets the dataset's batches without a copy."
)
"""Logged once per process at INFO (see :func:`collate_items`)."""
_noted: list[bool] = []


class BlockItem(dict):
    """An item of a batch built whole: a plain ``dict`` of its rows, which knows its batch.

    ``default_collate`` of consecutive, unmodified items of one batch, in order, returns that
    batch (the columns themselves, or their rows ``[start, stop)``): the dataset registers
    :func:`collate_items` for this type in ``torch.utils.data`` 's ``default_collate_fn_map``,
    the documented way to extend ``default_collate``. An item whose keys or values were replaced
    (or any other list of items) is collated by torch as a plain dict, as before. Pickling and
    ``copy`` give a plain ``dict`` (of compact row copies for pickle and ``deepcopy``).
    """

    __slots__ = ("_rr_row", "_rr_source", "_rr_values")
    _rr_row: int
    _rr_source: _Source
    _rr_values: tuple[Any, ...]

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (dict, (dict(self),))

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict) -> dict[str, Any]:
        return {k: copy.deepcopy(v, memo) for k, v in self.items()}


class _Source:
    """What the items of one batch share: the batch, its keys, how many rows."""

    __slots__ = ("batch", "keys", "release", "size")

    def __init__(self, batch: dict[str, Any], size: int, release: Any) -> None:
        self.batch, self.keys, self.size, self.release = batch, tuple(batch), size, release


def block_items(batch: dict[str, Any], size: int, release: Any = None) -> list[BlockItem]:
    """The ``size`` items of ``batch`` (tensor columns with rows along dim 0, lists), in order.

    Each tensor value is a :class:`BlockRow` view of its row (made per column with one
    ``unbind``), each list value the list's element. ``release`` (in a DataLoader worker whose
    batch lives in a reusable buffer, see :class:`RingBatch`): ``(flag, token, cameras)``.
    """
    src = _Source(batch, size, release)
    cols = [
        [t.as_subclass(BlockRow) for t in v.unbind(0)] if isinstance(v, torch.Tensor) else v
        for v in batch.values()
    ]
    keys = src.keys
    out = []
    for i, values in enumerate(zip(*cols, strict=True)):
        item = BlockItem(zip(keys, values, strict=True))
        item._rr_source, item._rr_row, item._rr_values = src, i, values
        out.append(item)
    return out


def _intact(item: BlockItem) -> bool:
    """True when the item holds exactly the keys and value objects it was made with."""
    values = item._rr_values
    return (
        len(item) == len(values)
        and tuple(item) == item._rr_source.keys
        and all(map(operator.is_, item.values(), values))
    )


def collate_items(batch: Sequence[Any], *, collate_fn_map: dict | None = None) -> Any:
    """``default_collate`` for a list whose first element is a :class:`BlockItem`.

    Consecutive intact items of one batch, in order: that batch as a plain dict (tensor
    columns, or their rows ``[start, stop)``; lists of ``str`` cut the same way), the values
    ``default_collate`` would stack, without stacking. In a DataLoader worker whose batch is a
    reusable buffer, a :class:`RingBatch`. Anything else: torch's collate of plain dicts.
    Language columns (each item's list of message dicts, or None) stay a list with one value
    per item in both cases, as ``lerobot_collate_fn``'s docstring says it keeps them (torch's
    collate would transpose the lists and fails on their None fields).
    """
    first = batch[0]
    src, start = first._rr_source, first._rr_row
    n = len(batch)
    # a reusable buffer goes to the main process only whole (one release per use of it)
    fast = start + n <= src.size and (src.release is None or (start == 0 and n == src.size))
    if fast:
        for k, item in enumerate(batch):
            if (
                type(item) is not BlockItem
                or item._rr_source is not src
                or item._rr_row != start + k
                or not _intact(item)
            ):
                fast = False
                break
    whole = start == 0 and n == src.size
    if not whole and not _noted:
        _noted.append(True)
        logger.info(OTHER_BATCH_NOTE, n, src.size)
    if not fast:
        plain = [dict(d) if type(d) is BlockItem else d for d in batch]
        return _collate_plain(plain, collate_fn_map)
    out: dict[str, Any] = {}
    for key, v in src.batch.items():
        if isinstance(v, torch.Tensor):
            out[key] = v if whole else v[start : start + n]
            continue
        part = list(v[start : start + n])
        if all(type(x) is str for x in part):
            out[key] = part  # default_collate keeps a list of str as it is
        elif all(x is None or type(x) is list for x in part):
            out[key] = part  # language columns: one message list (or None) per item
        else:
            out[key] = collate(part, collate_fn_map=collate_fn_map)
    if src.release is not None:
        return RingBatch(out, src.release)
    return out


def _collate_plain(batch: list[Any], collate_fn_map: dict | None) -> Any:
    """torch's collate of ``batch``, but the language columns every item holds as a list (or
    None) are a list of the items' values, in their place among the keys."""
    first = batch[0]
    if not isinstance(first, dict):
        return collate(batch, collate_fn_map=collate_fn_map)

    def messages(d: Any, k: str) -> bool:
        return isinstance(d, dict) and k in d and (d[k] is None or type(d[k]) is list)

    kept = [k for k in LANGUAGE_COLUMNS if all(messages(d, k) for d in batch)]
    if not kept:
        return collate(batch, collate_fn_map=collate_fn_map)
    rest = collate(
        [{k: v for k, v in d.items() if k not in kept} for d in batch],
        collate_fn_map=collate_fn_map,
    )
    return {k: [d[k] for d in batch] if k in kept else rest[k] for k in first}


class RingBatch(dict):
    """A DataLoader worker's collated batch whose cameras live in a reusable shared buffer.

    Pickled to the main process (the DataLoader's result queue), which rebuilds a plain
    ``dict`` of plain tensors (:func:`_rebuild_ring_batch`) whose camera tensors set the
    buffer's flag (the batch's token since the worker took the buffer) back to 0 when the last
    of them (and of their views) is gone. The worker reuses the buffer only when the flag is 0
    and nothing in the worker refers to it (see ``robo_resume.stream.blocks._PlainRing``).
    """

    __slots__ = ("_rr_release",)

    def __init__(self, values: dict[str, Any], release: Any) -> None:
        super().__init__(values)
        self._rr_release = release

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        _, token, cameras = self._rr_release
        return (_rebuild_ring_batch, (dict(self), token, cameras))

    def __copy__(self) -> dict[str, Any]:
        return dict(self)


def _rebuild_ring_batch(batch: dict[str, Any], token: int, cameras: Sequence[str]) -> dict:
    """The batch as a plain dict; its buffer's flag (int64 at offset 0 of the cameras' storage)
    goes back to 0 when the camera tensors are dropped (see :func:`release_when_dropped`)."""
    keys = [k for k in cameras if isinstance(batch.get(k), torch.Tensor)]
    if not keys:
        return batch
    flag = torch.empty(0, dtype=torch.int64).set_(  # type: ignore[call-overload]  # stubs: stride
        batch[keys[0]].untyped_storage(), 0, (1,)
    )

    def free() -> None:
        if int(flag[0]) == token:
            flag[0] = 0

    release_when_dropped(batch, keys, free)
    return batch


default_collate_fn_map[BlockItem] = collate_items
