"""Decoded parquet row groups kept for the chunks that read them next (:class:`RowGroupCache`)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

__all__ = ["RowGroupCache"]


class RowGroupCache:
    """Decoded row groups of parquet files, least recently used dropped beyond ``max_bytes``.

    Shared by the :class:`~robo_resume.format.tabular.ParquetTable` s of one dataset (an
    :class:`~robo_resume.items.ItemBuilder`). A chunk of frames reads the row groups around
    it, and the next chunks of the same episode (or file) read most of them again: every read
    of a file written as one row group (lerobot's own, e.g. open50) decoded the whole file.
    Holds numpy columns, marked read-only; a group larger than a quarter of ``max_bytes`` is
    not kept. Thread-safe. Pickles empty (each process fills its own).
    """

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        self.max_bytes = max_bytes
        self._groups: OrderedDict[tuple, dict[str, np.ndarray]] = OrderedDict()
        self._sizes: dict[tuple, int] = {}
        self.bytes = 0
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state) -> None:
        RowGroupCache.__init__(self, state["max_bytes"])

    def get(self, key: tuple) -> dict[str, np.ndarray] | None:
        """The columns stored under ``key``, now the most recently used (None: not held)."""
        with self._lock:
            got = self._groups.get(key)
            if got is not None:
                self._groups.move_to_end(key)
            return got

    def put(self, key: tuple, columns: dict[str, np.ndarray]) -> None:
        """Keep ``columns`` under ``key`` (not when larger than a quarter of the budget)."""
        size = sum(v.nbytes for v in columns.values())
        if size * 4 > self.max_bytes:
            return
        for v in columns.values():
            v.flags.writeable = False
        with self._lock:
            if key in self._groups:
                return
            self._groups[key], self._sizes[key] = columns, size
            self.bytes += size
            while self.bytes > self.max_bytes:
                old, _ = self._groups.popitem(last=False)
                self.bytes -= self._sizes.pop(old)
