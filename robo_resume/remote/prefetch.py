"""Schedule-driven prefetch of byte ranges into a bounded in-memory cache.

A stream of :class:`~robo_resume.dataset.ChunkedEpisodeDataset` knows, by arithmetic, every
chunk it will read and in which order. On a remote source each chunk is a few byte ranges
(a parquet row group's span, an mp4's samples from the keyframe on): :class:`Prefetcher` takes
those ranges as a lazy iterator in consumption order (:meth:`Prefetcher.plan`) and fetches them
ahead of the reader on background threads, into a cache of at most ``budget_bytes``.

Contract:

- :meth:`Prefetcher.read` returns exactly the bytes ``fetch(span)`` returns for that span,
  whether the span was prefetched, is in flight (the read waits for it), or was never reached
  (the read fetches it itself). Correctness never depends on the cache.
- The bytes held (cached plus in flight) never exceed ``budget_bytes``. A span larger than the
  budget is not prefetched; its read fetches it directly. A full cache pauses the prefetch
  until reads free room: it never blocks a read.
- A cached span is dropped when it is read (every chunk of a stream is read once per epoch),
  so the bytes fetched are the bytes the planned spans need, plus at most ``budget_bytes`` of
  spans prefetched but never read (the stream stopped, or a read skipped them: spans planned
  before the one read are dropped once fetched, so they do not hold the budget).
- A read of a span the prefetch has not reached yet fetches it itself, and the prefetch then
  passes over its next occurrence in the plan (a span read twice before the prefetch reaches
  it is fetched by both reads: correct, only not prefetched). So does a span whose bytes the
  reader already holds when the prefetch reaches it (``have``: a reader that got ahead of the
  plan and read them another way).
- A background fetch that fails is not retried in the background; the read of that span
  fetches it again itself (``fetch``'s own retries apply) and raises what that raises.
- One :class:`Prefetcher` per process (a DataLoader worker builds its own after the fork).

The fetch function is the only I/O; a store's ``get_range`` (``fetch(span) ->
store.get_range(span.path, span.start, span.end)``) is what a remote dataset passes.
"""

from __future__ import annotations

import bisect
import functools
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

__all__ = ["PrefetchStats", "Prefetcher", "Span", "SpanIndex"]


@dataclass(frozen=True)
class Span:
    """A byte range ``[start, end)`` of the file at ``path`` (relative to the dataset root)."""

    path: str
    start: int
    end: int

    @property
    def size(self) -> int:
        """Its length in bytes."""
        return self.end - self.start


class SpanIndex:
    """Spans by file, found by a byte offset in O(log n) (not thread-safe: its owner locks).

    A lookup looks at the :data:`LOOK_BACK` spans starting last at or before the offset, so a
    span overlapped by many later-starting ones may be missed: callers treat a miss as "not
    held" (a fetch), never as an error.
    """

    LOOK_BACK = 8

    def __init__(self) -> None:
        self._starts: dict[str, list[int]] = {}
        self._spans: dict[str, list[Span]] = {}

    def add(self, span: Span) -> None:
        """Index ``span`` (a span added twice is indexed twice)."""
        starts = self._starts.setdefault(span.path, [])
        spans = self._spans.setdefault(span.path, [])
        i = bisect.bisect_right(starts, span.start)
        starts.insert(i, span.start)
        spans.insert(i, span)

    def remove(self, span: Span) -> None:
        """Forget ``span`` (one of its entries; nothing if it is not indexed)."""
        starts, spans = self._starts.get(span.path), self._spans.get(span.path)
        if not starts or spans is None:
            return
        i = bisect.bisect_left(starts, span.start)
        while i < len(starts) and starts[i] == span.start:
            if spans[i] == span:
                del starts[i], spans[i]
                break
            i += 1
        if not starts:
            del self._starts[span.path], self._spans[span.path]

    def find(self, path: str, offset: int) -> Span | None:
        """An indexed span of ``path`` holding byte ``offset`` (the latest starting), or None."""
        starts = self._starts.get(path)
        if not starts:
            return None
        spans = self._spans[path]
        i = bisect.bisect_right(starts, offset)
        for j in range(i - 1, max(i - 1 - self.LOOK_BACK, -1), -1):
            if offset < spans[j].end:
                return spans[j]
        return None

    def clear(self) -> None:
        """Forget every span."""
        self._starts.clear()
        self._spans.clear()


@dataclass
class PrefetchStats:
    """Counters of a :class:`Prefetcher` (bytes and spans).

    Attributes:
        fetched_bytes: bytes fetched, in the background and by reads.
        read_bytes: bytes returned by :meth:`Prefetcher.read`.
        hits: reads served from the cache or from a fetch in flight.
        misses: reads that fetched their span themselves.
        peak_bytes: the most bytes held at once (cached plus in flight).
        failed: background fetches that failed (their reads fetched again).
        dropped_bytes: bytes prefetched and dropped unread (a later span of the plan was read
            first: the reader skipped them).
        passed: planned spans not fetched because the reader held their bytes already
            (``have``: it got there first and read them another way).
    """

    fetched_bytes: int = 0
    read_bytes: int = 0
    hits: int = 0
    misses: int = 0
    peak_bytes: int = 0
    failed: int = 0
    dropped_bytes: int = 0
    passed: int = 0

    def fetched_over_read(self) -> float:
        """Bytes fetched / bytes read (1.0 when every fetched byte was read once)."""
        return self.fetched_bytes / self.read_bytes if self.read_bytes else 0.0


class _DaemonPool:
    """Threads running submitted calls, as daemons: a process exits without waiting for the
    fetches it planned but no longer needs (a ThreadPoolExecutor's threads are joined at exit,
    after running everything queued)."""

    def __init__(self, threads: int) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[bytes], Callable[[], bytes]] | None]
        self._queue = queue.SimpleQueue()
        self._pending: set[Future[bytes]] = set()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, name="robo_resume-prefetch", daemon=True)
            for _ in range(threads)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[Span], bytes], span: Span) -> Future[bytes]:
        """Run ``fn(span)`` on a thread; its future."""
        future: Future[bytes] = Future()
        with self._lock:
            self._pending.add(future)
        self._queue.put((future, functools.partial(fn, span)))
        return future

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call = item
            with self._lock:
                self._pending.discard(future)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # given to the reader, which fetches again
                future.set_exception(exc)

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop the threads (the queued calls cancelled with ``cancel_futures``)."""
        if cancel_futures:
            with self._lock:
                pending, self._pending = self._pending, set()
            for future in pending:
                future.cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join()


@dataclass
class _Entry:
    future: Future[bytes]
    size: int
    seq: int = 0  # its place in the plan
    readers: int = 0  # reads of this span waiting on it


class Prefetcher:
    """Fetch the planned spans ahead of their reads (see the module docstring).

    Args:
        fetch: returns the bytes of a span (the only I/O); called from background threads and
            from :meth:`read`, so it must be thread-safe.
        budget_bytes: the most bytes held at once (cached plus in flight); 0 disables the
            prefetch (every read fetches its span).
        threads: background fetches in flight at once.
        lag: how many reads decide that the reader skipped a span: a fetched span is dropped
            unread once each of the last ``lag`` reads (0: the last one) took a span planned
            after it. A read that jumps ahead now and then (a decoder opening a file reads its
            first samples) drops nothing; a reader going on past a span does.
        max_ahead: the most spans held at once (cached or in flight; None: no bound but the
            budget): how far the prefetch runs ahead of the reads, so that a stream that stops
            leaves few spans fetched for nothing.
        have: whether the reader holds a span's bytes already (it reached them before the
            prefetch did, and read them another way): such a span is passed over, not
            fetched (called under the prefetch's lock; it must be quick and take no lock
            that a fetch holds while it waits on the prefetch).
    """

    def __init__(
        self,
        fetch: Callable[[Span], bytes],
        *,
        budget_bytes: int,
        threads: int = 2,
        lag: int = 0,
        max_ahead: int | None = None,
        have: Callable[[Span], bool] | None = None,
    ) -> None:
        if budget_bytes < 0 or threads < 1:
            raise ValueError(
                f"budget_bytes must be >= 0 and threads >= 1; got {budget_bytes}, {threads}"
            )
        self._fetch = fetch
        self._have = have
        self.budget_bytes = budget_bytes
        self.lag = max(int(lag), 0)
        self.max_ahead = max_ahead if max_ahead is not None else 1 << 62
        self._recent: deque[int] = deque(maxlen=max(self.lag, 1))  # plan places of the last reads
        self._seq = 0
        self.stats = PrefetchStats()
        self._lock = threading.Condition()
        self._held = 0  # bytes cached or in flight
        self._entries: OrderedDict[Span, _Entry] = OrderedDict()
        self._by_path = SpanIndex()  # the entries of each file (find())
        self._skip: set[Span] = set()  # spans a read fetched itself before the prefetch got there
        self._pool = _DaemonPool(threads)
        self._walker: threading.Thread | None = None
        self._closed = False
        self._generation = 0
        self.plan_error: Exception | None = None  # what stopped the last plan's walk, if anything

    # -- the plan ---------------------------------------------------------------------------
    def plan(self, spans: Iterable[Span]) -> None:
        """Prefetch ``spans`` (lazy, in the order they will be read), replacing any earlier plan.

        The earlier plan's walk stops at its next span and its unread spans are dropped (a
        read of one fetches it directly), so they do not hold the budget.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the Prefetcher is closed")
            self._generation += 1
            gen = self._generation
            self._lock.notify_all()
        if self._walker is not None:
            self._walker.join()  # it stops at its next span: the generation changed
        with self._lock:
            self._skip.clear()
            for key, e in list(self._entries.items()):
                if e.readers == 0:
                    self._remove(key)
                    if e.future.cancel():
                        self._release(e.size, fetched=False)
                    elif e.future.done():
                        self._release(e.size)
                    else:  # running: its bytes are held until it ends
                        e.future.add_done_callback(
                            functools.partial(self._release_when_done, e.size)
                        )
        if self.budget_bytes == 0:
            return
        walker = threading.Thread(
            target=self._walk, args=(iter(spans), gen), name="robo_resume-plan", daemon=True
        )
        self._walker = walker
        walker.start()

    def _walk(self, spans: Iterator[Span], gen: int) -> None:
        try:
            self._walk_plan(spans, gen)
        except Exception as exc:  # a plan that fails stops the prefetch; reads fetch directly
            with self._lock:
                self.plan_error = exc

    def _walk_plan(self, spans: Iterator[Span], gen: int) -> None:
        for span in spans:
            with self._lock:
                while (
                    not self._closed
                    and gen == self._generation
                    and span.size <= self.budget_bytes
                    and (
                        self._held + span.size > self.budget_bytes
                        or len(self._entries) >= self.max_ahead
                    )
                ):
                    self._lock.wait(0.5)
                if self._closed or gen != self._generation:
                    return
                if span.size > self.budget_bytes:
                    continue  # too big for the cache: its read fetches it
                if span in self._skip:
                    self._skip.discard(span)
                    continue
                if span in self._entries:
                    continue
                if self._have is not None and self._have(span):
                    self.stats.passed += 1  # the reader got there first
                    continue
                self._held += span.size
                self.stats.peak_bytes = max(self.stats.peak_bytes, self._held)
                future = self._pool.submit(self._fetch_counted, span)
                self._seq += 1
                self._add(span, _Entry(future, span.size, self._seq))

    def _fetch_counted(self, span: Span) -> bytes:
        data = self._fetch(span)
        with self._lock:
            self.stats.fetched_bytes += len(data)
        return data

    # -- reads --------------------------------------------------------------------------------
    def read(self, span: Span) -> bytes:
        """The bytes of ``span``: prefetched, awaited in flight, or fetched now.

        Raises:
            Whatever ``fetch`` raises for this span (after a failed background fetch, the read
            fetches once more itself).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the Prefetcher is closed")
            entry = self._entries.get(span)
            if entry is None:
                if span.size <= self.budget_bytes:  # the walk may not have reached it yet
                    self._skip.add(span)
                self.stats.misses += 1
            else:
                entry.readers += 1
                self._recent.append(entry.seq)
                if len(self._recent) == self._recent.maxlen:
                    self._drop_before(min(self._recent))
        if entry is None:
            data = self._fetch_counted(span)
        else:
            try:
                data = entry.future.result()
                failed = False
            except Exception:  # fetched again below, raising what that raises
                failed = True
            with self._lock:
                entry.readers -= 1
                if self._entries.get(span) is entry:
                    self._remove(span)
                    self._held -= entry.size
                    self._lock.notify_all()
                if failed:
                    self.stats.failed += 1
                    self.stats.misses += 1
                else:
                    self.stats.hits += 1
            if failed:
                data = self._fetch_counted(span)
        with self._lock:
            self.stats.read_bytes += len(data)
        return data

    def find(self, path: str, offset: int) -> Span | None:
        """A span of ``path`` holding byte ``offset`` that the prefetch fetched or is fetching
        (its :meth:`read` then costs no request of its own), or None."""
        with self._lock:
            return self._by_path.find(path, offset)

    def _add(self, span: Span, entry: _Entry) -> None:
        self._entries[span] = entry
        self._by_path.add(span)

    def _remove(self, span: Span) -> None:
        del self._entries[span]
        self._by_path.remove(span)

    def _release_when_done(self, size: int, _future: Future[bytes]) -> None:
        self._release(size)

    def _release(self, size: int, *, fetched: bool = True) -> None:
        with self._lock:
            self._held -= size
            self.stats.dropped_bytes += size if fetched else 0
            self._lock.notify_all()

    def _drop_before(self, seq: int) -> None:
        """Drop the fetched, unread spans planned before place ``seq`` (the reader skipped
        them), so that they do not hold the budget (under the lock)."""
        before = []
        for key, e in self._entries.items():
            if e.seq >= seq:
                break
            before.append(key)
        for key in before:
            e = self._entries[key]
            if e.readers == 0 and e.future.done():
                self._remove(key)
                self._held -= e.size
                self.stats.dropped_bytes += e.size
                self._lock.notify_all()

    @property
    def held_bytes(self) -> int:
        """Bytes cached or in flight now."""
        with self._lock:
            return self._held

    def close(self, *, wait: bool = True) -> None:
        """Stop the prefetch and drop the cache (reads after this raise RuntimeError).

        Args:
            wait: wait for the plan's walk and the fetches in flight to end (else they end
                on their own, their results dropped: a stream that ended does not wait on
                the network).
        """
        with self._lock:
            self._closed = True
            self._generation += 1
            self._lock.notify_all()
        if wait and self._walker is not None:
            self._walker.join()
        self._pool.shutdown(wait=wait, cancel_futures=True)
        with self._lock:
            self._entries.clear()
            self._by_path.clear()
            self._held = 0

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
