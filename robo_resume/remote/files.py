"""A remote dataset's data and video files as seekable file objects over byte ranges.

:class:`RemoteFiles` is the :class:`~robo_resume.format.file_access.FileAccess` of a remote
dataset: its metadata is the local copy of ``meta/`` that :func:`~.meta.fetch_meta` made (the
``root`` of its :class:`~robo_resume.format.metadata.DatasetMeta`), and a data or video file
``root / rel`` is served from the store as a :class:`RemoteFile`. pyarrow and PyAV read those
like local files; each read becomes byte-range requests.

A stream plans the byte ranges of the chunks it will decode (:meth:`RemoteFiles.plan`, from
``robo_resume.items.read_plan``): a :class:`~.prefetch.Prefetcher` fetches them ahead, and a
read inside a planned range is served from its bytes (:meth:`RemoteFiles.held`). Every other
read goes through one block cache per process:

- the file is cut in blocks of ``block_size`` bytes (64 KiB); a read fetches the blocks it
  needs that are not cached, consecutive ones in one request;
- sequential reads (a decoder reading on from a seek, pyarrow reading a column chunk) widen a
  read-ahead window per file by one block per request, up to :data:`MAX_READ_AHEAD` (1 MiB), so
  a long read costs few requests and a short one fetches little past its end; a seek elsewhere
  starts again at one block;
- a data file of at most ``whole_file`` bytes (1 MiB) is fetched whole on its first read
  (REMOTE.md: small parquet files are cheapest in one request); an mp4 never is: its chunks
  are planned, and each worker needs only its own;
- the cache drops the least recently used blocks past its bound; a dropped block is fetched
  again if it is read again (never a wrong byte, only a request more).

``cache_mb`` bounds both: 3/4 of it for the prefetched ranges, 1/4 for the blocks. The first
open of an mp4 in a process reads its sample tables with exact ranges and fetches, with them,
exactly the bytes FFmpeg reads to open it and the keyframe a decoder parks at
(:meth:`RemoteFiles.sample_table`), kept up to 1/8 more of ``cache_mb``.

The store is opened lazily in each process (a DataLoader worker opens its own); a Hub dataset
is read at the commit its metadata was fetched at. Every read is checked by the store: short
bodies, changed files (size or ETag differs from the first response in this process) and
failures after the retries raise the store's errors, which name the URL and the range. Across
runs, each file is held to the size and ETag its first HEAD by any run recorded
(:mod:`~.ledger`): a file replaced on the server under the same ``meta/info.json`` is refused.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MissingFileError
from ..format.ranged_file import SeekableReader, merge_spans
from .ledger import FileLedger
from .prefetch import Prefetcher, PrefetchStats, Span, SpanIndex

if TYPE_CHECKING:
    from ..format.metadata import DatasetMeta
    from ..format.mp4_ranges import SampleTable
    from .store import ObjectInfo, RetryPolicy, Store

__all__ = [
    "BLOCK_SIZE",
    "CACHE_MB",
    "BlockCache",
    "RemoteFile",
    "RemoteFiles",
    "TrafficStats",
    "is_remote",
    "remote_meta",
]

logger = logging.getLogger("robo_resume")

BLOCK_SIZE = 64 << 10
"""Bytes per cached block (a read fetches whole blocks)."""

CACHE_MB = 64
"""Default bound of the bytes a process holds, in MB: each DataLoader worker and the main
process hold at most this much, 3/4 for prefetched ranges and 1/4 for blocks, plus up to 1/8
for the opening bytes of the files it opened (``ROBO_RESUME_REMOTE_CACHE_MB`` sets it)."""

CACHE_ENV = "ROBO_RESUME_REMOTE_CACHE_MB"

MAX_READ_AHEAD = 1 << 20
"""Largest read-ahead window of sequential reads, in bytes."""

PREFETCH_THREADS = 24
"""Background fetches in flight per process: at 20 ms a request, 24 keep about 1200 ranges a
second coming (a shuffle-order stream of 2-frame chunks reads one a camera per chunk; measured
with benchmarks/remote.py: at 8, a 96x96 dataset waited on the latency)."""

PREFETCH_LAG = 64
"""Planned ranges read out of order by up to this many places stay held (see
:class:`~.prefetch.Prefetcher`'s ``lag``): cameras and chunks decoded on several threads."""

PREFETCH_AHEAD = 192
"""Planned ranges a process holds ahead of its reads at most (cached or in flight; the bytes
also bounded by the cache): enough to keep :data:`PREFETCH_THREADS` fetches going at 20 ms a
request, few enough that a stream that stops leaves little fetched for nothing."""

TABLE_HEAD = 4096
"""Bytes of an mp4's head read first for its sample tables (its box headers; FFmpeg's probe
reads 2 KiB of it)."""

TABLE_TAIL = 128 << 10
"""A top-level box header found at most this many bytes before the end of an mp4 is read
with the rest of the file: one request for the header and the ``moov`` that LeRobot's writer
puts last (those bytes are then the ``moov``, which FFmpeg reads whole; a file with its
``moov`` first and a short ``mdat`` after it fetches that ``mdat`` too)."""

WHOLE_FILE = 1 << 20
"""Data files (not mp4s, whose chunks are planned) of at most this many bytes are fetched whole
on their first read."""


@dataclass
class TrafficStats:
    """What a process fetched from the store, in bytes and requests.

    Attributes:
        requests: range (or whole-file) requests sent.
        fetched_bytes: bytes received.
        read_bytes: bytes returned to the readers (pyarrow, PyAV), repeats included.
        heads: HEAD requests (file sizes).
    """

    requests: int = 0
    fetched_bytes: int = 0
    read_bytes: int = 0
    heads: int = 0


class BlockCache:
    """Blocks ``(file, index) -> bytes``, least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> bytes | None:
        """The block, marked recently used, or None."""
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
            return data

    def holds(self, rel: str, first: int, last: int) -> bool:
        """Whether blocks ``first..last`` of ``rel`` are all held (not marked used)."""
        with self._lock:
            return all((rel, i) in self._blocks for i in range(first, last + 1))

    def put(self, key: tuple[str, int], data: bytes) -> None:
        """Keep the block, dropping the least recently used ones past the bound."""
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._blocks[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._blocks) > 1:
                _, dropped = self._blocks.popitem(last=False)
                self._bytes -= len(dropped)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        with self._lock:
            return self._bytes


class RemoteFiles:
    """The file access of a remote dataset (see the module docstring).

    Args:
        url: the dataset root (``hf://datasets/ORG/NAME``, ``s3://...``, ``gs://...``,
            ``https://...``).
        root: the local copy of its ``meta/`` (a :class:`~.meta.MetaCache` root): data and
            video paths below it are served from ``url``.
        revision: the Hub commit to read at (``hf://`` only; the one the metadata is of).
        policy: retries and timeouts (default :class:`~.store.RetryPolicy`).
        cache_mb: bound of this process's block cache, in MB (default :data:`CACHE_MB`).
        block_size: bytes per block (default :data:`BLOCK_SIZE`).
    """

    def __init__(
        self,
        url: str,
        root: str | Path,
        *,
        revision: str | None = None,
        policy: RetryPolicy | None = None,
        cache_mb: float = CACHE_MB,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        from .store import redact_url

        if cache_mb <= 0 or block_size <= 0:
            raise ValueError(f"cache_mb and block_size must be > 0, got {cache_mb}, {block_size}")
        self.url = url
        self.shown = redact_url(url).rstrip("/")
        self.root = Path(root)
        self.revision = revision
        self.policy = policy
        self.cache_mb = cache_mb
        self.block_size = block_size
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._store: Store | None = None
        self._sizes: dict[str, ObjectInfo | None] = {}
        self._lock = threading.Lock()
        total = int(self.cache_mb * (1 << 20))
        self.cache = BlockCache(total - total * 3 // 4)
        self.prefetch_bytes = total * 3 // 4
        self._prefetcher: Prefetcher | None = None
        self._last_stats: PrefetchStats | None = None
        self._held = HeldSpans(max(self.prefetch_bytes // 8, 4 << 20))
        self._opening = HeldSpans(max(total // 8, 1 << 20))  # the files opened: head, moov...
        self._tables: dict[str, SampleTable | None] = {}
        self._file_locks: dict[tuple[str, str], threading.Lock] = {}
        self._incomplete: dict[str, tuple[list[tuple[int, int]], list[tuple[int, bytes]]]] = {}
        self.stats = TrafficStats()

    def __getstate__(self) -> dict[str, Any]:
        keep = ("url", "shown", "root", "revision", "policy", "cache_mb", "block_size")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return f"RemoteFiles({self.shown!r})"

    @property
    def store(self) -> Store:
        """This process's store (opened on first use; a forked child opens its own)."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            if self._store is None:
                from .open import open_store

                self._store = open_store(self.url, revision=self.revision, policy=self.policy)
            return self._store

    def rel(self, path: Path) -> str:
        """``path`` relative to the dataset root, as the store names it."""
        return Path(path).relative_to(self.root).as_posix()

    def info(self, path: Path) -> ObjectInfo | None:
        """The file's size and ETag (one HEAD, then remembered), None if it does not exist.

        The first HEAD of a file by any run is recorded in the metadata cache folder's
        :class:`~.ledger.FileLedger` (not for a Hub commit, which cannot change); a later one
        that differs raises :class:`~robo_resume.errors.RemoteChangedError`."""
        rel = self.rel(path)
        if self._pid != os.getpid():
            self._reset()
        if rel not in self._sizes:
            try:
                found: ObjectInfo | None = self.store.head(rel)
            except MissingFileError:
                found = None
            self.stats.heads += 1
            if found is not None and self.revision is None:  # a Hub commit cannot change
                FileLedger(self.root, self.shown).check(found)
            self._sizes[rel] = found
        return self._sizes[rel]

    # -- FileAccess ---------------------------------------------------------------------------
    def is_file(self, path: Path) -> bool:
        """Whether the store has the file (a HEAD request, once per file and process)."""
        return self.info(path) is not None

    def open(self, path: Path) -> RemoteFile:
        """A :class:`RemoteFile` of ``path``.

        Raises:
            MissingFileError: the store has no such file (naming its URL).
        """
        info = self.info(path)
        if info is None:
            self.store.head(self.rel(path))  # raises the store's MissingFileError, with the URL
            raise AssertionError("unreachable")
        rel = self.rel(path)
        file = RemoteFile(self, rel, info.size)
        if rel.endswith(".mp4"):
            file.sample_table = self.sample_table(path)
        return file

    def sample_table(self, path: Path) -> SampleTable | None:
        """The sample tables of the mp4 at ``path``, read once per process, or None when they
        cannot be read (the decoder then reads the file through blocks and reports what is
        wrong with it).

        They are read with exact ranges (the head, the ``moov``), and with them the bytes
        FFmpeg reads to open the file (:meth:`~robo_resume.format.mp4_ranges.SampleTable.
        open_spans`) and the last keyframe (where a decoder parks, ``VideoReader._park``) are
        fetched exactly and kept: opening a file fetches no block. Concurrent callers wait for
        one read."""
        rel = self.rel(path)
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            if rel in self._tables:
                return self._tables[rel]
        with self.file_lock("tables", rel):
            with self._lock:
                if rel in self._tables:
                    return self._tables[rel]
            table = self._read_table(path, rel)
            with self._lock:
                self._tables[rel] = table
        return table

    def _read_table(self, path: Path, rel: str) -> SampleTable | None:
        from ..format.mp4_ranges import read_sample_table

        try:
            info = self.info(path)
            if info is None:
                return None
            size = info.size
            got: list[tuple[int, bytes]] = []

            def fetch(start: int, end: int) -> bytes:
                data = self.fetch(rel, start, end)
                got.append((start, data))
                return data

            def read(start: int, end: int) -> bytes:
                for at, data in got:  # a box header and the moov after it: one request
                    if at <= start and end <= at + len(data):
                        return data[start - at : end - at]
                if start >= TABLE_HEAD and size - start <= TABLE_TAIL:
                    return fetch(start, size)[: end - start]  # the moov LeRobot writes last
                return fetch(start, end)

            table = read_sample_table(read, size, name=self.where(path), head=TABLE_HEAD)
            # exactly the spans FFmpeg reads to open and to park (reads stop at their ends:
            # where a parked decoder stands is then known, SampleTable.first_park)
            want = merge_spans([*table.open_spans(), table.last_key_span])
        except Exception as exc:  # a hint only: the decoder reports what is wrong with it
            logger.debug("robo_resume: no sample tables for %s: %s", self.where(path), exc)
            return None
        # the parts of those spans already fetched are held now; the rest is fetched on the
        # first read that needs it (a decoder's: reading the tables, as the keyframe scan of
        # a dataset's construction does, needs none of it)
        have = [(a, a + len(d)) for a, d in got]
        missing = _missing(want, have)
        for a, b in _missing(want, missing):
            self._opening.put(Span(rel, a, b), _cut(got, a, b))
        if missing:
            with self._lock:
                self._incomplete[rel] = (want, got)
        return table

    def opened_ahead(self, path: Path) -> SampleTable | None:
        """:meth:`sample_table`, with every opening byte of the file fetched too: what a plan
        calls for the files it reaches (their decoders then open them without a request)."""
        table = self.sample_table(path)
        rel = self.rel(path)
        if table is not None and rel in self._incomplete:
            self._complete(rel)
        return table

    def _complete(self, rel: str) -> None:
        """Fetch the opening spans of ``rel`` that its sample tables' reads did not hold (the
        first packet, the last keyframe), at once, and keep them; what fails is left to the
        reads (they fetch blocks, and report the error if it lasts)."""
        with self.file_lock("tables", rel):
            with self._lock:
                pending = self._incomplete.pop(rel, None)
            if pending is None:
                return
            want, got = pending
            missing = _missing(want, [(a, a + len(d)) for a, d in got])

            def fetch(span: tuple[int, int]) -> tuple[int, bytes]:
                return span[0], self.fetch(rel, *span)

            try:
                if len(missing) > 1:  # independent requests: at once
                    with ThreadPoolExecutor(len(missing)) as pool:
                        got = [*got, *pool.map(fetch, missing)]
                else:
                    got = [*got, *map(fetch, missing)]
            except Exception as exc:  # a hint only: the reads fetch and report
                logger.debug("robo_resume: could not fetch the opening of %s: %s", rel, exc)
                return
            for a, b in want:
                self._opening.put(Span(rel, a, b), _cut(got, a, b))

    def where(self, path: Path) -> str:
        """The file's URL (credentials left out)."""
        return f"{self.shown}/{self.rel(path)}"

    plans = True
    """:meth:`plan` prefetches."""

    def plan(self, ranges: Iterable[tuple[Path, int, int]]) -> None:
        """Fetch ``ranges`` (``(path, start, end)``, lazily, in the order the stream will read
        them) ahead of the readers, replacing the plan before: see :class:`~.prefetch.Prefetcher`
        (at most 3/4 of ``cache_mb`` held). A read inside a planned range is served from its
        bytes; a read outside every range fetches blocks as before, so a wrong or late plan
        costs requests, never correctness."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            if self._prefetcher is None:
                self._prefetcher = Prefetcher(
                    self._fetch_span,
                    budget_bytes=self.prefetch_bytes,
                    threads=PREFETCH_THREADS,
                    lag=PREFETCH_LAG,
                    max_ahead=PREFETCH_AHEAD,
                    have=self._read_through_blocks,
                )
            prefetcher = self._prefetcher
        prefetcher.plan(self._spans(ranges))

    def _read_through_blocks(self, span: Span) -> bool:
        """Whether the blocks holding ``span`` are cached: a decoder that got ahead of the plan
        (its first files were still being opened) read them, so the prefetch passes over it
        instead of fetching its bytes a second time."""
        bs = self.block_size
        return span.size > 0 and self.cache.holds(span.path, span.start // bs, (span.end - 1) // bs)

    def _spans(self, ranges: Iterable[tuple[Path, int, int]]) -> Iterator[Span]:
        rels: dict[Path, str] = {}  # a plan names a few files many times
        for path, start, end in ranges:
            rel = rels.get(path)
            if rel is None:
                rel = rels[path] = self.rel(path)
            yield Span(rel, start, end)

    def end_plan(self) -> None:
        """Stop the prefetch: its threads end (without waiting for fetches in flight) and its
        bytes are let go; the counters stay in :attr:`prefetch_stats`. The next :meth:`plan`
        starts a new one."""
        with self._lock:
            prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None and self._pid == os.getpid():
            self._last_stats = prefetcher.stats
            prefetcher.close(wait=False)

    @property
    def prefetch_stats(self) -> PrefetchStats | None:
        """This process's prefetch counters: of the plan in force, else of the last one (None
        before any)."""
        return self._last_stats if self._prefetcher is None else self._prefetcher.stats

    def held(self, rel: str, offset: int) -> tuple[int, bytes] | None:
        """``(start, data)`` of a planned range of ``rel`` holding byte ``offset``: one a read
        took from the prefetch before, or one the prefetch fetched or is fetching (its fetch is
        then awaited); None if no planned range holds it."""
        found = self._opening.get(rel, offset)
        if found is None and rel in self._incomplete:  # the first read past the tables' bytes
            self._complete(rel)
            found = self._opening.get(rel, offset)
        found = found or self._held.get(rel, offset)
        if found is not None or self._prefetcher is None:
            return found
        span = self._prefetcher.find(rel, offset)
        if span is None:
            return None
        data = self._prefetcher.read(span)
        self._held.put(span, data)
        return span.start, data

    def file_lock(self, kind: str, rel: str) -> threading.Lock:
        """The lock of ``kind`` ("blocks": block fetches; "tables": the sample tables and
        opening bytes) of file ``rel``, one per file and process: two readers of a file fetch
        its bytes once."""
        with self._lock:
            lock = self._file_locks.get((kind, rel))
            if lock is None:
                lock = self._file_locks[kind, rel] = threading.Lock()
            return lock

    def _fetch_span(self, span: Span) -> bytes:
        return self.fetch(span.path, span.start, span.end)

    # -- reads --------------------------------------------------------------------------------
    def fetch(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``rel`` from the store (one request)."""
        data = self.store.get_range(rel, start, end)
        with self._lock:
            self.stats.requests += 1
            self.stats.fetched_bytes += len(data)
        return data


class RemoteFile(SeekableReader):
    """A read-only, seekable file object over a remote file's blocks (see the module docstring).

    Args:
        files: the dataset's :class:`RemoteFiles` (store, block cache, counters).
        rel: the file's path relative to the dataset root.
        size: its size in bytes.
    """

    parks = True
    """A decoder moves its read position to the first sample before each seek (see
    ``VideoReader._park``): a jump between two planned ranges is then never read through."""

    sample_table: SampleTable | None = None
    """An mp4's sample tables (:meth:`RemoteFiles.sample_table`), where a decoder parks."""

    def __init__(self, files: RemoteFiles, rel: str, size: int) -> None:
        super().__init__()
        self.files, self.rel, self.size = files, rel, size
        self.name = files.where(files.root / rel)
        self._pos = 0
        self._next_block = -1  # the block after the last one read (sequential reads)
        self._window = 1  # read-ahead, in blocks

    def readinto(self, buffer: Any) -> int:
        """Read up to ``len(buffer)`` bytes at the position into ``buffer``; 0 at the end."""
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.size - self._pos)
        if n <= 0:
            return 0
        held = self.files.held(self.rel, self._pos)
        if held is not None:  # a planned range: up to its end (a short read)
            start, data = held
            a = self._pos - start
            take = min(n, len(data) - a)
            view[:take] = data[a : a + take]
            self._pos += take
            with self.files._lock:
                self.files.stats.read_bytes += take
            return take
        bs = self.files.block_size
        first, last = self._pos // bs, (self._pos + n - 1) // bs
        blocks = self._blocks(first, last)
        out = 0
        for i, data in zip(range(first, last + 1), blocks, strict=True):
            a = self._pos + out - i * bs
            take = min(len(data) - a, n - out)
            view[out : out + take] = data[a : a + take]
            out += take
        self._pos += out
        with self.files._lock:
            self.files.stats.read_bytes += out
        return out

    def _blocks(self, first: int, last: int) -> list[bytes]:
        """Blocks ``first..last``, fetching the missing ones (and the read-ahead) in one request
        per run of consecutive missing blocks."""
        with self.files.file_lock("blocks", self.rel):  # two readers fetch a block once
            return self._blocks_locked(first, last)

    def _blocks_locked(self, first: int, last: int) -> list[bytes]:
        bs, cache = self.files.block_size, self.files.cache
        nblocks = -(-self.size // bs)
        wanted = first
        if self.size <= WHOLE_FILE and not self.rel.endswith(".mp4"):
            first, want_last = 0, nblocks - 1  # small data file: all of it at once
        else:
            if first == self._next_block:
                self._window = min(self._window + 1, max(MAX_READ_AHEAD // bs, 1))
            elif not (self._next_block - 1 <= first < self._next_block):
                self._window = 1
            want_last = min(max(last, first + self._window - 1), nblocks - 1)
        self._next_block = last + 1
        got: dict[int, bytes] = {}
        missing: list[int] = []
        for i in range(first, want_last + 1):
            data = cache.get((self.rel, i))
            if data is None:
                if i > last and missing and missing[-1] != i - 1:
                    break  # read-ahead stops at the first cached block after the gap
                missing.append(i)
            else:
                got[i] = data
                if i > last:
                    break  # the read-ahead reached cached blocks: they are there already
        for a, b in _runs(missing):
            data = self.files.fetch(self.rel, a * bs, min((b + 1) * bs, self.size))
            for i in range(a, b + 1):
                block = data[(i - a) * bs : (i - a + 1) * bs]
                cache.put((self.rel, i), block)
                got[i] = block
        return [got[i] for i in range(wanted, last + 1)]


class HeldSpans:
    """The planned ranges readers took from the prefetch, kept while they read on in them (a
    decoder reads a range in many short reads), least recently used dropped past
    ``max_bytes`` (a dropped one is read from blocks if it is read again)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._spans: OrderedDict[Span, bytes] = OrderedDict()
        self._by_path = SpanIndex()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, rel: str, offset: int) -> tuple[int, bytes] | None:
        """``(start, data)`` of a kept range of ``rel`` holding ``offset``, or None."""
        with self._lock:
            span = self._by_path.find(rel, offset)
            if span is None:
                return None
            self._spans.move_to_end(span)
            return span.start, self._spans[span]

    def put(self, span: Span, data: bytes) -> None:
        """Keep ``span``'s bytes, dropping the least recently used ranges past the bound."""
        with self._lock:
            if span in self._spans:
                return
            self._spans[span] = data
            self._by_path.add(span)
            self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._spans) > 1:
                old, dropped = self._spans.popitem(last=False)
                self._bytes -= len(dropped)
                self._by_path.remove(old)


def _missing(want: list[tuple[int, int]], have: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the spans ``want`` (merged) that no span of ``have`` covers, in order."""
    out: list[tuple[int, int]] = []
    for a, b in merge_spans(want):
        for c, d in merge_spans(have):
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def _cut(pieces: list[tuple[int, bytes]], start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` put together from ``pieces`` (``(offset, data)``, which cover
    them)."""
    out = bytearray(end - start)
    for at, data in pieces:
        a, b = max(at, start), min(at + len(data), end)
        if a < b:
            out[a - start : b - start] = data[a - at : b - at]
    return bytes(out)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive integers ``(first, last)`` of a sorted list."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


REMOTE_SCHEMES = ("hf", "s3", "gs", "http", "https")


def is_remote(root: object) -> bool:
    """Whether ``root`` is a remote dataset URL (``hf://``, ``s3://``, ``gs://``, ``http(s)://``);
    a :class:`~pathlib.Path` never is."""
    if not isinstance(root, str):
        return False
    scheme, sep, _ = root.partition("://")
    return bool(sep) and scheme in REMOTE_SCHEMES


def remote_meta(
    url: str,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    policy: RetryPolicy | None = None,
    cache_mb: float | None = None,
) -> DatasetMeta:
    """The metadata of the remote dataset at ``url``, its files served from the store.

    ``meta/`` is fetched once per version into the cache (:func:`~.meta.fetch_meta`) and read
    there; the returned metadata's ``files`` (a :class:`RemoteFiles`) reads the data and video
    files as byte ranges, a Hub dataset at the commit its metadata is of.

    Args:
        url: the dataset root (``hf://datasets/ORG/NAME``, ``s3://...``, ``gs://...``,
            ``https://...``).
        revision: the Hub revision (branch, tag or commit); ``hf://`` only.
        cache_dir: the metadata cache (default :func:`~.meta.default_cache_dir`).
        policy: retries and timeouts.
        cache_mb: bound of each process's block cache, in MB (default:
            ``$ROBO_RESUME_REMOTE_CACHE_MB``, else :data:`CACHE_MB`).

    Returns:
        A :class:`~robo_resume.format.metadata.DatasetMeta` whose ``root`` is the local copy
        of ``meta/``.

    Raises:
        ImportError: the ``remote`` extra is not installed (the message says how).
        The errors of :func:`~.meta.fetch_meta` and
        :func:`~robo_resume.format.metadata.load_metadata`.
    """
    from dataclasses import replace

    from ..format.metadata import load_metadata

    try:
        import obstore  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"reading {url} needs the remote extra: pip install 'robo_resume[remote]' "
            "(obstore, huggingface_hub, boto3)"
        ) from exc
    from .hub import HubStore
    from .meta import fetch_meta
    from .open import open_store

    if cache_mb is None:
        text = os.environ.get(CACHE_ENV, "")
        try:
            cache_mb = float(text) if text else CACHE_MB
        except ValueError:
            raise ValueError(
                f"{CACHE_ENV} must be a number of MB (e.g. 64); found {text!r}"
            ) from None
    store = open_store(url, revision=revision, policy=policy)
    cached = fetch_meta(url, revision, cache_dir, store=store)
    sha = store.sha if isinstance(store, HubStore) else None
    files = RemoteFiles(url, cached.root, revision=sha, policy=policy, cache_mb=cache_mb)
    return replace(load_metadata(cached.root), files=files)
