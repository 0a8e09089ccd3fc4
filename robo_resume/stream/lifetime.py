"""Worker lifetime: a DataLoader worker never outlives the training process,
and its garbage collector leaves alone what it inherited (:func:`freeze_inherited`).

torch's worker loop exits when ``os.getppid()`` changes (checked every 5 s while it waits for
work). That covers ``fork`` and ``spawn``, whose workers are children of the training process.
A ``forkserver`` worker is a child of the forkserver, and the forkserver exits only when every
holder of its *alive pipe* has closed the pipe's write end. Python hands a copy of that write end
to every process the forkserver starts (``multiprocessing.forkserver._serve_one``, so that a
child could start processes from the same server). After ``kill -9`` of the training process the
workers keep the forkserver alive and the forkserver keeps the workers' parent pid unchanged:
both wait for each other forever, holding their memory.

:func:`bind_to_trainer` runs once in each worker when it starts its stream, and on Linux:

1. asks the kernel to SIGKILL the worker when its parent exits (``prctl(PR_SET_PDEATHSIG)``),
   where the parent is a process's main thread that lives as long as the process: the
   forkserver's (it forks from its main thread), or the training process's when its main
   thread forked the worker. The signal follows the *thread* that forked, so a fork from
   another thread (which may end while the loader runs) and spawn (whose starting thread a
   child cannot know) keep torch's own check only;
2. in a forkserver worker, closes the inherited write end of the forkserver's alive pipe, after
   step 1 (while the worker holds it the forkserver cannot exit, so the parent cannot have died
   before the signal was armed). The training process is then the only holder: when it dies the
   forkserver sees EOF and exits, and its workers die with it.

No thread, no polling: the kernel delivers the signal. A worker that later wants to start
forkserver processes of its own still can (Python then starts a new server for it).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from typing import Any

from torch.utils.data import get_worker_info

__all__ = ["bind_to_trainer", "freeze_inherited"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_bound: list[int] = []  # pid of this process once bound (a forked child starts unbound)
_frozen: list[int] = []  # pid of this process once frozen (see freeze_inherited)
_IMPORTED_IN = os.getpid()  # a forked child sees its parent's pid here, a spawned one its own


def bind_to_trainer() -> None:
    """In a DataLoader worker: make it exit when the training process dies (no-op elsewhere).

    Idempotent per process; does nothing outside a worker, on other systems than Linux, or when
    the C library has no ``prctl``.
    """
    if sys.platform != "linux" or get_worker_info() is None or os.getpid() in _bound:
        return
    _bound.append(os.getpid())
    server: Any = multiprocessing.forkserver._forkserver  # private CPython state (no stubs)
    from_server = server._forkserver_alive_fd is not None and server._forkserver_pid is None
    parent = os.getppid()
    main_thread = getattr(threading, "_MainThread", ())
    forked_by_main = _IMPORTED_IN == parent and isinstance(threading.current_thread(), main_thread)
    if from_server or forked_by_main:
        if not _die_with_parent():
            return
        if os.getppid() != parent:  # the parent exited before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)
    if from_server:
        alive, server._forkserver_alive_fd = server._forkserver_alive_fd, None
        os.close(alive)


def _die_with_parent() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl in this C library
        return False


def freeze_inherited() -> None:
    """In a DataLoader worker: move every object the worker holds so far into the garbage
    collector's permanent generation (``gc.freeze()``), once per process; no-op elsewhere.

    A forked worker inherits the training process's whole heap (torch, the policy, lerobot...)
    and a spawned or forkserver worker has imported torch; every full collection in the worker
    walked all of it, stalling the batches the worker owed, and copied the pages it shared
    with its parent (the walk writes to every object it visits). Frozen objects are neither
    walked nor copied; objects made later are collected as before. What
    this gives up: a cycle among the objects held at this point that becomes garbage later is
    not freed, which Python's documentation of ``gc.freeze`` accepts for the same use (a child
    forked without exec). User code may still call ``gc.unfreeze()`` in the worker.
    The training process itself is never frozen.
    """
    if get_worker_info() is None or os.getpid() in _frozen:
        return
    _frozen.append(os.getpid())
    gc.freeze()
