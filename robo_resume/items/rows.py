"""Items as rows of their batch: :class:`BlockRow`, which ``torch.stack`` puts back together
without copying (what a plain ``DataLoader(ds, batch_size=...)`` collates).

The item path of a ChunkedEpisodeDataset builds each batch's columns once (decoded straight into
place, images converted once per batch) and yields every item as views of row ``i`` of them.
torch's ``default_collate`` then stacks the 32 rows of each column into a new tensor: at
480x640 float32, three cameras and batch 32, that copy moved 350 MB per batch into freshly
faulted memory and took more time than decoding (measured on open50: ``torch.stack`` 1.6 s of
3.1 s). A row knows its column and its row number; ``torch.stack`` of consecutive rows of one
column, in order, along dim 0, returns those rows of the column itself (with ``out=``, as
default_collate passes in a DataLoader worker, ``out`` is pointed at them), which holds the same
values the copy would. Any other stack, and every other operation, is torch's own and returns
plain tensors.

The one difference from a copy: the stacked batch shares memory with the items it was stacked
from. default_collate's items are dropped right after, so nothing can see it; code that keeps
items and modifies the stacked tensor in place sees the items change too.
"""

from __future__ import annotations

from typing import Any

import torch


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

    def __reduce_ex__(self, protocol: int) -> Any:
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
