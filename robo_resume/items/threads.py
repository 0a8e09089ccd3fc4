"""The decoding threads of one process: where an :class:`~robo_resume.items.builder.ItemBuilder`
runs its reads (the cameras of a range, the chunks of a block), and the wait that keeps a fork
from happening in the middle of one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

_ON_POOL = threading.local()  # .active: this thread is one of the decoding threads

# Reads running on the decoding threads of this process (queued or decoding). A process that
# forks while a decoder is in the middle of a call on another thread leaves the child with
# that decoder's locks held (FFmpeg's codec-open lock, say) and no thread to release them; with
# num_workers=0 a stream reads one block ahead, so a script that forks DataLoader workers right
# after taking a batch could do exactly that. Forks wait for these reads first.
_RUNNING = threading.Condition()
_running = 0


def settle_reads(timeout: float = 60.0) -> bool:
    """Wait until no read of this process runs on a decoding thread (at most ``timeout``
    seconds); True if none does. Called before every fork (``os.register_at_fork``)."""
    with _RUNNING:
        return _RUNNING.wait_for(lambda: _running == 0, timeout)


def _reads_started(n: int) -> None:
    global _running
    with _RUNNING:
        _running += n


def _read_ended() -> None:
    global _running
    with _RUNNING:
        _running -= 1
        if _running == 0:
            _RUNNING.notify_all()


def _no_reads_in_child() -> None:
    global _running
    _running = 0  # the child has no decoding threads (a pool is made anew on first use)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=settle_reads, after_in_child=_no_reads_in_child)


def _mark_pool_thread() -> None:
    _ON_POOL.active = True


def balanced_runs(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """Split ``range(len(sizes))`` into at most ``parts`` consecutive ``(start, stop)`` runs of
    about equal total size (each run non-empty; greedy: a run closes before the job that would
    take it further past its share of what is left than stopping short does)."""
    runs: list[tuple[int, int]] = []
    start, acc, left_total = 0, 0, sum(sizes)
    for i, size in enumerate(sizes):
        left = parts - len(runs)
        share = left_total / left
        if left > 1 and i > start and acc + size - share > share - acc:
            runs.append((start, i))
            left_total -= acc
            start, acc = i, 0
        acc += size
    runs.append((start, len(sizes)))
    return runs


class DecodingThreads:
    """Reads on the decoding threads: a mixin of :class:`~robo_resume.items.builder.ItemBuilder`.

    The instance sets ``camera_threads`` (how many threads decode concurrently; the stream sets
    it) and ``_pool`` (None until first use; ``(pid, ThreadPoolExecutor)``, made anew in a
    forked child). Reads started here are counted for :func:`settle_reads`.
    """

    camera_threads: int
    _pool: tuple[int, Any] | None

    def map_cameras(self, fn: Callable[[str], Any], cameras: Sequence[str]) -> list[Any]:
        """``[fn(cam) for cam in cameras]``, on the decoding threads when there are several.

        PyAV decodes and swscale converts frames without holding the GIL, so the cameras of one
        range decode in parallel. Each camera has its own decoder; nothing else is shared. On a
        decoding thread already (:meth:`map_reads`), the cameras are read in turn.
        """
        if self.camera_threads <= 1 or len(cameras) < 2 or getattr(_ON_POOL, "active", False):
            return [fn(cam) for cam in cameras]
        return list(self._threads().map(fn, cameras))

    def map_reads(
        self,
        fn: Callable[[Any], Any],
        jobs: Sequence[Any],
        sizes: Sequence[int] | None = None,
    ) -> list[tuple[Any, Any]]:
        """``(fn(job), None)`` or ``(None, exception)`` for each job, in order.

        On the decoding threads when there are several jobs and threads: the stream reads the
        chunks of one block this way, each with its own decoders (a job must not share a
        decoder with another). Every job runs even when an earlier one failed; the caller
        raises or skips in job order, as if they had run one after the other. Jobs are handed
        to the threads in at most two runs of consecutive jobs per thread, balanced by
        ``sizes`` (e.g. frames per job; equal if not given): a wide interleave makes blocks of
        many one-frame jobs, and one pool task per job cost more than the decoding it spread; with
        few jobs (interleave 4: 4 chunks per block) each job is still a task of its own.
        """
        return self.submit_reads(fn, jobs, sizes)()

    def submit_reads(
        self,
        fn: Callable[[Any], Any],
        jobs: Sequence[Any],
        sizes: Sequence[int] | None = None,
        *,
        background: bool = False,
    ) -> Callable[[], list[tuple[Any, Any]]]:
        """:meth:`map_reads` started: the returned function waits for the jobs and gives its list.

        With ``background``, the jobs run on the decoding threads even when they are one run
        (the caller works on while they decode: a stream reads its next block while its
        consumer builds a batch); without, as :meth:`map_reads`, a single run runs here before
        this returns. The caller must call the returned function before it touches the jobs'
        decoders or destinations again (closing a reader included).
        """

        def run(job):
            try:
                return fn(job), None
            except Exception as exc:  # handed to the caller, in job order
                return None, exc

        def inline():
            done = [run(job) for job in jobs]
            return lambda: done

        threads = self.camera_threads
        if not jobs or getattr(_ON_POOL, "active", False):
            return inline()
        if threads <= 1 or len(jobs) < 2:
            if not background:
                return inline()
            runs = [(0, len(jobs))]
        else:
            # two runs per thread: a thread that finished its first run takes another's
            weights = list(sizes) if sizes is not None else [1] * len(jobs)
            runs = balanced_runs(weights, 2 * threads)
            if len(runs) < 2 and not background:
                return inline()

        def part(r):
            try:
                return [run(job) for job in jobs[r[0] : r[1]]]
            finally:
                _read_ended()

        pool = self._threads()
        _reads_started(len(runs))
        parts = []
        try:
            for r in runs:
                parts.append(pool.submit(part, r))
        finally:
            if len(parts) < len(runs):  # the pool refused (shut down): those never run
                for _ in range(len(runs) - len(parts)):
                    _read_ended()
        return lambda: [out for p in parts for out in p.result()]

    def _threads(self):
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:  # none yet, or inherited over a fork
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(
                self.camera_threads, "robo_resume-decode", initializer=_mark_pool_thread
            )
            self._pool = (pid, pool)
        return self._pool[1]
