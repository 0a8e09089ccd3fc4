"""Buffers for items and batches: reused tensors (:class:`BufferPool`), shared-memory views,
and the float conversion of images done once per batch (:func:`to_float`)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch


def empty_like_batch(shape: torch.Size, dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised tensor, in shared memory when ``shared`` (as default_collate does)."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    numel = 1
    for d in shape:
        numel *= d
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {}  # torch dtype -> numpy's, for BufferPool


class BufferPool:
    """Large output buffers, reused once nothing refers to them any more.

    A fresh 100 MB tensor costs more to fault in page by page (the kernel zeroes every page)
    than the uint8 -> float32 conversion that fills it; a training loop that drops each batch
    before (or right after) asking for the next needs only two buffers in turn. :meth:`empty`
    returns a tensor over a pooled numpy buffer; when the last reference to its memory goes
    (the tensor, its views, arrays made from it), the buffer returns to the pool. At most
    ``keep`` free buffers per shape and dtype are held; requests smaller than ``min_bytes``
    are plain ``torch.empty``.

    Thread-safe without a lock: a buffer returns from a finalizer, which the garbage collector
    can run at any allocation, also inside :meth:`empty` of the same thread (a lock held there
    would deadlock); the free lists only use ``list.pop`` and ``list.append``, which are
    atomic in CPython.
    """

    def __init__(self, keep: int = 2, min_bytes: int = 1 << 20) -> None:
        self.keep, self.min_bytes = keep, min_bytes
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self.reused = 0  # buffers handed out again (tests and benchmarks read it)

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised CPU tensor of ``shape`` and ``dtype`` (see the class)."""
        shape = tuple(int(d) for d in shape)
        np_dtype = _NUMPY_DTYPES.get(dtype)
        if np_dtype is None:  # looked up once per dtype (making a tensor to ask is slow)
            np_dtype = _NUMPY_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
        if math.prod(shape) * np_dtype.itemsize < self.min_bytes:
            return torch.empty(shape, dtype=dtype)
        key = (shape, np_dtype.str)
        try:
            base = self._free.setdefault(key, []).pop()
            self.reused += 1
        except IndexError:
            base = np.empty(shape, dtype=np_dtype)
        view = base.view()  # the tensor's storage holds this array; its death frees `base`
        weakref.finalize(view, self._put, key, base)
        return torch.from_numpy(view)

    def _put(self, key: tuple[tuple[int, ...], str], base: np.ndarray) -> None:
        free = self._free.setdefault(key, [])
        if len(free) < self.keep:  # two threads at once may keep one more: harmless
            free.append(base)

    def clear(self) -> None:
        """Drop the free buffers (memory in use stays with its tensors)."""
        self._free.clear()


BUFFERS = BufferPool()
"""The process's pool for float32 images and uint8 batches built in this process."""


def to_float(
    src: torch.Tensor, shared: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 images -> float32 in [0, 1] (``x / 255``, the values lerobot computes).

    One pass into ``out`` (a float32 tensor of ``src``'s shape) when given, else into a pooled
    buffer (:data:`BUFFERS`), or into shared memory when ``shared``.
    """
    if out is not None:
        dst = out
    elif shared:
        dst = empty_like_batch(src.shape, torch.float32, True)
    else:
        dst = BUFFERS.empty(src.shape, torch.float32)
    np.divide(src.numpy(), np.float32(255), out=dst.numpy(), dtype=np.float32)
    return dst


def lerobot_dtype(values: np.ndarray) -> np.dtype | None:
    """lerobot's dtype for a numpy column: floats float32, integers int64, bools bool."""
    kind = values.dtype.kind
    if kind == "f":
        return np.dtype(np.float32)
    if kind in "iu":
        return np.dtype(np.int64)
    if kind == "b":
        return np.dtype(bool)
    return None


def to_tensor(values: np.ndarray) -> torch.Tensor:
    """numpy -> torch with lerobot's dtypes: floats float32, integers int64, bools bool."""
    dtype = lerobot_dtype(values)
    if dtype is None:
        return torch.as_tensor(values)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))


_ALIGN = 64


def shared_views(specs: Mapping[str, tuple[Sequence[int], np.dtype]]) -> dict[str, torch.Tensor]:
    """Uninitialised tensors ``{key: (shape, numpy dtype)}`` over ONE shared-memory storage.

    A DataLoader worker hands each shared storage to the main process through its own file
    descriptor (a socket round trip per storage); a batch of a dozen columns in one storage
    crosses several times faster than a dozen storages. Each tensor starts on a 64-byte
    boundary.
    """
    at, total = {}, 0
    for key, (shape, dtype) in specs.items():
        total = -(-total // _ALIGN) * _ALIGN
        at[key] = total
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    storage = torch.UntypedStorage._new_shared(max(total, 1))
    out = {}
    for key, (shape, dtype) in specs.items():
        t = torch.from_numpy(np.empty(0, dtype=dtype))
        offset = at[key] // t.element_size()
        out[key] = t.set_(storage, offset, tuple(shape))  # type: ignore[call-overload]  # stubs: stride
    return out


def pack_shared(columns: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Numpy columns as lerobot-typed tensors in one shared-memory storage (see shared_views)."""
    dtypes: dict[str, np.dtype] = {}
    for k, v in columns.items():
        dtype = lerobot_dtype(v)
        if dtype is None:
            raise TypeError(f"pack_shared: column {k!r} has dtype {v.dtype}, not numeric or bool")
        dtypes[k] = dtype
    out = shared_views({k: (v.shape, dtypes[k]) for k, v in columns.items()})
    for k, v in columns.items():
        out[k].numpy()[...] = v
    return out


def release_when_dropped(
    batch: dict[str, Any], keys: Sequence[str], release: Callable[[], None]
) -> None:
    """Call ``release()`` once the tensors ``batch[k]`` for ``keys`` are all gone.

    Each tensor is replaced by a tensor over a numpy view of it (same memory, same values, a
    plain ``torch.Tensor``); the view lives as long as anything refers to that memory (the
    tensor, its views, arrays made from it). When the last view of the last key dies,
    ``release()`` runs (from a finalizer: keep it short and lock-free). Nothing is released
    while a caller still holds the original tensors (they keep the memory, not the views).
    """
    left = [len(keys)]

    def dropped() -> None:
        left[0] -= 1
        if left[0] == 0:
            release()

    for k in keys:
        view = batch[k].numpy()
        weakref.finalize(view, dropped)
        batch[k] = torch.from_numpy(view)
    if not keys:
        release()
