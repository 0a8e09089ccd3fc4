"""Large read-only arrays sent to ``spawn`` and ``forkserver`` workers through shared memory.

A ``fork`` worker shares the training process's pages (copy-on-write, never written). A
``spawn`` or ``forkserver`` worker receives the dataset by pickle, and a pickled numpy array is
its bytes: each such worker would hold its own copy of the metadata columns, the plan and the
epoch layout (hundreds of MB per worker at 10^6 episodes).

:func:`reduce_for_worker` pickles an object's state for a process that is starting, and only
then: ``multiprocessing.context.get_spawning_popen()`` is set, which Python does in
``Process.start`` of a spawn or forkserver process, around the pickling of its arguments. The
state goes through :class:`_SharingPickler`, which sends every read-only numpy array of at least
:data:`MIN_SHARED_BYTES` as a file descriptor of a memory file holding its bytes; the worker
maps that file read-only (``PROT_READ``: a write faults, it cannot reach another process) and
gets a read-only numpy view of it instead of a copy. Pages mapped by the training process and
the workers exist once on the machine; a worker's own memory (USS) does not hold them.

Lifetime: the memory file is an anonymous ``memfd`` (Linux): it has no name in ``/dev/shm`` or
anywhere, so nothing can be left behind whatever happens to the processes (and the size limit
of a container's ``/dev/shm`` does not apply), and the kernel frees it when the last process
holding its descriptor or a mapping of it closes it or exits. The training process keeps one
per array in :class:`SharedArrays` (its descriptor and a mapping), reused by every worker start
(8 workers map one copy); each pickling keeps only the arrays it sent, so an older epoch
layout's file goes when the workers that map it are gone: flat across epochs. A worker maps
what it received for as long as it lives, whatever the training process drops.

Only read-only arrays are shared: a writable one may be written, and the worker's copy of it
must stay writable. Everything else is pickled as before (torch tensors by torch's own
reductions), and so is everything outside a process start: ``pickle.dumps(dataset)`` (a file,
a queue, ``copy``) is self-contained, with no descriptor in it. Without ``os.memfd_create``
(not Linux), when the memory file cannot be made, or past :data:`MAX_DESCRIPTORS` descriptors
for one process start (the forkserver takes 256), an array is pickled as bytes, as before.
"""

from __future__ import annotations

import io
import logging
import mmap
import os
import pickle
import weakref
from multiprocessing.context import get_spawning_popen
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import numpy as np

__all__ = [
    "MAX_DESCRIPTORS",
    "MIN_SHARED_BYTES",
    "SharedArrays",
    "reduce_for_worker",
    "shared_mapping",
]

logger = logging.getLogger("robo_resume")

MIN_SHARED_BYTES = 1 << 16
"""Smallest array sent through shared memory (64 KiB, an int64 column of 8,192 episodes): below
it the bytes cost about as much as a descriptor and a mapping per worker."""

MAX_DESCRIPTORS = 200
"""Most descriptors one process start may carry before arrays go as bytes again: a forkserver
receives at most 256 with a new process (``multiprocessing.forkserver.MAXFDS_TO_SEND``), 4 of
them its own. A dataset shares about 20 arrays (3 more per camera), a mix that many per source."""


class _Segment:
    """One array's bytes in an anonymous memory file: its descriptor and this process's
    mapping, both closed when the segment is dropped."""

    def __init__(self, a: np.ndarray) -> None:
        self.size = a.nbytes
        self.fd = os.memfd_create("robo_resume_array", os.MFD_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        self.map.write(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))


class SharedArrays:
    """The memory files of one owner's read-only arrays, reused by every worker start.

    Keyed by the array object (held, so its id is not reused); :meth:`dumps` keeps only the
    arrays the last pickling sent. Never pickled itself: an unpickled owner starts empty.
    """

    def __init__(self) -> None:
        self._held: dict[int, tuple[np.ndarray, _Segment]] = {}
        self._warned = False

    def dumps(self, obj: Any) -> bytes:
        """``obj`` pickled for a process that is starting: large read-only arrays as memory
        file descriptors for that process (see the module docstring)."""
        buf = io.BytesIO()
        pickler = _SharingPickler(buf, self)
        pickler.dump(obj)
        self._held = pickler.sent  # an array the owner no longer holds is released here
        return buf.getvalue()

    def segment(self, a: np.ndarray, sent: dict[int, tuple[np.ndarray, _Segment]]):
        """The memory file holding ``a``'s bytes (None: none to be had; ``a`` goes as bytes)."""
        key = id(a)
        held = sent.get(key) or self._held.get(key)
        if held is None or held[0] is not a:
            try:
                held = (a, _Segment(a))
            except OSError as exc:  # too many open files, no memory
                if not self._warned:
                    self._warned = True
                    logger.warning(
                        "robo_resume: no shared memory for a %d-byte array (%s): spawn and "
                        "forkserver workers receive their own copy of it",
                        a.nbytes,
                        exc,
                    )
                return None
        sent[key] = held
        return held[1]


class _SharingPickler(ForkingPickler):
    """A ForkingPickler (torch tensors, descriptors) that also sends large read-only numpy
    arrays as memory files (:meth:`reducer_override`)."""

    def __init__(self, file: io.BytesIO, shared: SharedArrays) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.shared = shared
        self.sent: dict[int, tuple[np.ndarray, _Segment]] = {}

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is np.ndarray
            and not obj.flags.writeable
            and obj.nbytes >= max(MIN_SHARED_BYTES, 1)
            and not obj.dtype.hasobject
        ):
            if len(getattr(get_spawning_popen(), "_fds", ())) < MAX_DESCRIPTORS:
                seg = self.shared.segment(obj, self.sent)
                if seg is not None:  # the descriptor goes to the process that is starting
                    return _mapped, (DupFd(seg.fd), seg.size, obj.dtype, obj.shape)
        return NotImplemented


def _mapped(fd: Any, size: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The array again, in the worker: a read-only view of the memory file, mapped read-only."""
    n = fd.detach()
    try:
        m = mmap.mmap(n, size, prot=mmap.PROT_READ)
    finally:
        os.close(n)
    return np.frombuffer(m, dtype=dtype, count=int(np.prod(shape))).reshape(shape)


def shared_mapping(a: np.ndarray) -> mmap.mmap | None:
    """The memory file mapping ``a`` is a view of (None: ``a`` holds its own memory)."""
    base: Any = a
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base if isinstance(base, mmap.mmap) else None


def reduce_for_worker(obj: Any, state: dict[str, Any], shared: SharedArrays) -> tuple | None:
    """What ``obj.__reduce_ex__`` returns while a spawn or forkserver process is starting: its
    class and ``state`` pickled by :meth:`SharedArrays.dumps`; None otherwise, or without
    memory files (not Linux): pickle as usual.

    The object is rebuilt with ``cls.__new__(cls)`` and ``obj.__setstate__(state)``.
    """
    if get_spawning_popen() is None or not hasattr(os, "memfd_create"):
        return None
    return _rebuild, (shared.dumps((type(obj), state)),)


def _rebuild(data: bytes) -> Any:
    cls, state = pickle.loads(data)
    obj = cls.__new__(cls)
    obj.__setstate__(state)
    return obj
