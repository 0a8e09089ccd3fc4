"""Byte ranges of remote files: the :class:`Store` interface and its obstore implementation.

A store is rooted at a dataset folder (``s3://bucket/prefix``, ``gs://bucket/prefix``,
``https://host/path``, or a Hub dataset at one commit, see :mod:`robo_resume.remote.hub`) and
reads files under it by relative POSIX path. Its contract:

1. Paths are untrusted (they come from listings and metadata): :func:`safe_path` refuses any
   path that could leave the root (``..``, absolute, backslash, empty parts) before a request.
2. Every read is retried on transient failures (HTTP 5xx, a connection reset mid-body, a
   timeout, a short body) with the bounded exponential backoff of :class:`RetryPolicy`, then
   raises :class:`~robo_resume.errors.RemoteReadError` naming the URL without credentials or
   query string, the byte range, the attempts and the last error. Missing files raise
   :class:`~robo_resume.errors.MissingFileError` at once; access denied is not retried.
3. Data is never silently short: a body with fewer bytes than asked is an error.
4. A file is pinned to the size and ETag it had when first seen (or that the caller's
   manifest recorded); a response for another version raises
   :class:`~robo_resume.errors.RemoteChangedError` instead of mixing two versions.

obstore was chosen by measurement (docs/performance.md, benchmarks/remote_clients.py): the
least client CPU per request on S3 and HTTP, and a ranged GET needs no HEAD first. Its own
retries are switched off so that the attempts counted here are the requests made.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePosixPath
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from ..errors import (
    MissingFileError,
    RemoteChangedError,
    RemotePathError,
    RemoteReadError,
    describe,
)

__all__ = [
    "MERGE_GAP",
    "ObjectInfo",
    "ObstoreStore",
    "RetryPolicy",
    "Store",
    "client_options",
    "merge_ranges",
    "no_retries",
    "redact_url",
    "safe_path",
]

MERGE_GAP = 1 << 20
"""Ranges of one file closer than this many bytes are fetched in one request: below about a
MiB, another request costs more than reading the gap (obstore's own coalescing default)."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class ObjectInfo:
    """What a server says about one file: enough to notice that it changed.

    Args:
        path: POSIX path relative to the store's root.
        size: length in bytes.
        etag: the server's ETag (quotes kept as sent), or None when it sends none.
        version: an object version id (S3 versioning), or None.
    """

    path: str
    size: int
    etag: str | None = None
    version: str | None = None

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"ObjectInfo.size must be >= 0, got {self.size}")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a transient failure is retried.

    The defaults, 5 attempts with delays of 0.1, 0.2, 0.4, 0.8 s (doubling, capped at
    ``max_delay``), give up within about 1.5 s plus the requests' own time: long enough for a
    server restart or a dropped connection, short enough that a dead endpoint fails fast.

    Args:
        attempts: requests made at most for one read (>= 1).
        first_delay: seconds before the second attempt.
        max_delay: cap on the doubling delay, in seconds.
        timeout: seconds one request may take end to end (raise it for slow links and large
            ranges: a 64 MiB range at 10 MB/s needs about 7 s).
        connect_timeout: seconds to establish a connection.
    """

    attempts: int = 5
    first_delay: float = 0.1
    max_delay: float = 2.0
    timeout: float = 60.0
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_delay < 0 or self.max_delay < self.first_delay:
            raise ValueError(
                f"RetryPolicy needs attempts >= 1 and 0 <= first_delay <= max_delay: {self}"
            )
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError(f"RetryPolicy timeouts must be > 0: {self}")

    def delays(self) -> list[float]:
        """The sleeps between attempts, in seconds.

        Returns:
            ``attempts - 1`` delays: ``first_delay * 2**i`` capped at ``max_delay``.
        """
        return [min(self.first_delay * 2**i, self.max_delay) for i in range(self.attempts - 1)]


@runtime_checkable
class Store(Protocol):
    """Read-only access to the files under one remote dataset root.

    Implementations are thread-safe, hold no credentials in ``url`` or ``repr``, and follow
    the module's contract: safe paths, bounded retries, never short data, pinned versions.
    ``end`` offsets are exclusive.
    """

    url: str
    """The root's URL with credentials and query string removed (for messages)."""

    listable: bool
    """Whether :meth:`list` works (a plain HTTP server has no listing)."""

    def head(self, path: str) -> ObjectInfo:
        """Size and ETag of the file at ``path`` (one cheap request)."""
        ...

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the file, exactly ``end - start`` of them."""
        ...

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bytes of each ``(start, end)`` of one file, in the order asked; nearby ranges merged."""
        ...

    def get(self, path: str) -> bytes:
        """The whole file."""
        ...

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every file under the folder ``prefix``, sorted by path."""
        ...

    def pinned(self, path: str) -> ObjectInfo | None:
        """The size/ETag ``path`` is held to (from the manifest or its first response)."""
        ...


def safe_path(path: str, *, url: str | None = None) -> str:
    """Check that ``path`` stays inside a dataset root, and return it normalized.

    Args:
        path: a relative POSIX path, as a listing or metadata gives it.
        url: the root's URL, named in the error.

    Returns:
        The path with ``.`` parts dropped (``meta/./info.json`` -> ``meta/info.json``).

    Raises:
        RemotePathError: the path is empty, absolute, holds a backslash, a NUL, a drive
            letter, an empty part, or a ``..`` part.
    """
    bad = (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or re.match(r"^[A-Za-z]:", path) is not None
        or "//" in path
        or any(part == ".." for part in path.split("/"))
    )
    if bad:
        raise RemotePathError(
            describe(
                "Refusing a remote path that could leave the dataset root",
                expected="a relative POSIX path without '..', '\\' or a leading '/'",
                found=repr(path),
                file=url,
                fix="the server or metadata that gave this path is broken or hostile; "
                "use a dataset whose file names are plain relative paths",
            )
        )
    return str(PurePosixPath(*[p for p in path.split("/") if p not in ("", ".")]))


def redact_url(url: str) -> str:
    """``url`` without user info, query string or fragment (where signatures and tokens go).

    Args:
        url: any URL.

    Returns:
        ``scheme://host[:port]/path``.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def merge_ranges(ranges: Iterable[tuple[int, int]], gap: int = MERGE_GAP) -> list[tuple[int, int]]:
    """The spans to request for ``ranges``: sorted, with ranges closer than ``gap`` joined.

    Args:
        ranges: ``(start, end)`` pairs, ``0 <= start <= end``, in any order, may overlap.
        gap: ranges separated by fewer bytes than this share one span.

    Returns:
        Sorted, disjoint ``(start, end)`` spans that cover every non-empty range.

    Raises:
        ValueError: a range with ``start < 0`` or ``end < start``.
    """
    spans: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if start < 0 or end < start:
            raise ValueError(f"a byte range needs 0 <= start <= end, got ({start}, {end})")
        if start == end:
            continue
        if spans and start - spans[-1][1] < gap:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


class _Permanent(Exception):
    """Wraps an error that another attempt cannot fix (not found, denied, changed)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class ObstoreStore:
    """A :class:`Store` over an obstore store (``S3Store``, ``GCSStore``, ``HTTPStore``).

    Args:
        store: the obstore store, rooted at the dataset folder, with its own retries off
            (:func:`client_options` and :func:`no_retries` build its options).
        url: the root's URL for messages (redacted with :func:`redact_url`).
        policy: retries and timeouts.
        expected: the size/ETag each file must have (a metadata manifest); files not in it
            are pinned to what the first response says.
        listable: whether ``store`` can list (obstore's ``HTTPStore`` lists only WebDAV).
        secrets: strings scrubbed from every message (tokens, keys), in case a client error
            text quotes them.
        max_concurrency: requests in flight at once for :meth:`get_ranges`.
    """

    def __init__(
        self,
        store: Any,
        *,
        url: str,
        policy: RetryPolicy | None = None,
        expected: Mapping[str, ObjectInfo] | None = None,
        listable: bool = True,
        secrets: Sequence[str] = (),
        max_concurrency: int = 8,
    ):
        self._store = store
        self.url = redact_url(url).rstrip("/")
        self.listable = listable
        self.policy = policy or RetryPolicy()
        self._pinned: dict[str, ObjectInfo] = dict(expected or {})
        self._lock = threading.Lock()
        self._secrets = tuple(s for s in secrets if s)
        self._max_concurrency = max(1, max_concurrency)

    def __repr__(self) -> str:
        return f"ObstoreStore({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(
            "an ObstoreStore holds a network client and does not pickle; open a new store in "
            "each process (robo_resume.remote.open_store)"
        )

    # --- the Store interface ------------------------------------------------------------

    def head(self, path: str) -> ObjectInfo:
        """Size and ETag of ``path`` (one HEAD request, retried; pins the file).

        Args:
            path: relative path under the root.

        Returns:
            The file's :class:`ObjectInfo`.

        Raises:
            MissingFileError, RemoteReadError, RemoteChangedError, RemotePathError.
        """
        import obstore

        path = safe_path(path, url=self.url)
        meta = self._retry(path, None, lambda: obstore.head(self._store, path))
        info = self._info(path, meta)
        self._check(info, None)
        return info

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of ``path`` in one request (retried).

        Args:
            path: relative path under the root.
            start: first byte.
            end: one past the last byte (exclusive), ``> start``.

        Returns:
            Exactly ``end - start`` bytes.

        Raises:
            MissingFileError, RemoteReadError (also for a short body or a range past the end
            of the file), RemoteChangedError, RemotePathError, ValueError (empty range).
        """
        if start < 0 or end <= start:
            raise ValueError(f"a byte range needs 0 <= start < end, got ({start}, {end})")
        return self._fetch(safe_path(path, url=self.url), (start, end))

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bytes of each range of ``path``; ranges within :data:`MERGE_GAP` share a request.

        Args:
            path: relative path under the root.
            ranges: ``(start, end)`` pairs (exclusive ends), any order, may overlap.

        Returns:
            One ``bytes`` per range, in the order of ``ranges``.

        Raises:
            The errors of :meth:`get_range`.
        """
        path = safe_path(path, url=self.url)
        spans = merge_ranges(ranges)
        if len(spans) > 1 and self._max_concurrency > 1:
            with ThreadPoolExecutor(min(self._max_concurrency, len(spans))) as pool:
                bodies = list(pool.map(lambda s: self._fetch(path, s), spans))
        else:
            bodies = [self._fetch(path, s) for s in spans]
        out = []
        for start, end in ranges:
            if start == end:
                out.append(b"")
                continue
            i = _span_of(spans, start)
            s0 = spans[i][0]
            out.append(bytes(bodies[i][start - s0 : end - s0]))
        return out

    def get(self, path: str) -> bytes:
        """The whole file at ``path`` (one request, retried, length checked).

        Args:
            path: relative path under the root.

        Returns:
            The file's bytes.

        Raises:
            The errors of :meth:`get_range`.
        """
        return self._fetch(safe_path(path, url=self.url), None)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every file under the folder ``prefix`` (retried; each path checked with safe_path).

        Args:
            prefix: a folder path relative to the root, e.g. ``"meta"``.

        Returns:
            :class:`ObjectInfo` per file, sorted by path, paths relative to the root.

        Raises:
            RemoteReadError: listing failed, or this store cannot list.
            RemotePathError: the server listed a path that leaves the root.
        """
        import obstore

        if not self.listable:
            raise RemoteReadError(
                describe(
                    "This remote store cannot list files",
                    expected="an S3, GCS or Hub store",
                    found="a plain HTTP store",
                    file=self.url,
                    fix="read files by their known paths (fetch_meta probes meta/ by name)",
                )
            )
        prefix = safe_path(prefix, url=self.url)

        def run() -> list[Any]:
            return [m for chunk in obstore.list(self._store, prefix=prefix + "/") for m in chunk]

        metas = self._retry(prefix + "/", None, run)
        infos = [self._info(safe_path(str(m["path"]), url=self.url), m) for m in metas]
        return sorted(infos, key=lambda i: i.path)

    def pinned(self, path: str) -> ObjectInfo | None:
        """The size/ETag that reads of ``path`` are held to, if any yet.

        Args:
            path: relative path under the root.

        Returns:
            The manifest's or first response's :class:`ObjectInfo`, or None before any read.
        """
        with self._lock:
            return self._pinned.get(safe_path(path, url=self.url))

    # --- internals ----------------------------------------------------------------------

    def _fetch(self, path: str, rng: tuple[int, int] | None) -> bytes:
        import obstore

        def once() -> bytes:
            options: Any = {} if rng is None else {"range": rng}
            result = obstore.get(self._store, path, options=options)
            info = self._info(path, result.meta)
            self._check(info, rng)
            data = result.bytes()
            want = info.size if rng is None else min(rng[1], info.size) - rng[0]
            if rng is not None and rng[1] > info.size:
                raise _Permanent(
                    RemoteReadError(
                        describe(
                            "A byte range reaches past the end of a remote file",
                            expected=f"bytes {rng[0]}-{rng[1]} within the file",
                            found=f"the file has {info.size} bytes",
                            file=self._where(path),
                            fix="read ranges from the file's current size (its metadata may "
                            "be stale: clear the metadata cache)",
                        )
                    )
                )
            if len(data) != want:
                raise _ShortRead(f"short read: got {len(data)} of {want} bytes")
            return bytes(data)

        return self._retry(path, rng, once)

    def _retry(self, path: str, rng: tuple[int, int] | None, call: Callable[[], _T]) -> _T:
        import obstore.exceptions as oe

        delays = self.policy.delays()
        last: Exception | None = None
        timed_out = False
        for attempt in range(self.policy.attempts):
            started = time.monotonic()
            try:
                return call()
            except _Permanent as e:
                raise e.error from None
            except (oe.NotFoundError, FileNotFoundError):
                raise MissingFileError(
                    describe(
                        "A remote file does not exist",
                        expected="the file the dataset's metadata names",
                        found="HTTP 404 / no such key",
                        file=self._where(path),
                        fix="check the URL and revision; an incomplete upload misses files",
                    )
                ) from None
            except oe.PreconditionError:
                raise self._changed(
                    path, self._pinned.get(path), "the server refused the ETag"
                ) from None
            except (oe.PermissionDeniedError, oe.UnauthenticatedError) as e:
                raise RemoteReadError(
                    describe(
                        "Access to a remote file was denied",
                        expected="read access",
                        found=self._scrub(f"{type(e).__name__}: {_first_line(e)}"),
                        file=self._where(path, rng),
                        fix="set credentials where the client looks for them (AWS_* variables "
                        "or profile, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN or hf auth login)",
                    )
                ) from None
            except (oe.BaseError, _ShortRead, OSError, TimeoutError) as e:
                timed_out = time.monotonic() - started >= 0.95 * self.policy.timeout
                if _client_error(e):
                    last = e
                    break
                last = e
                if attempt < len(delays):
                    time.sleep(delays[attempt])
        attempts = attempt + 1
        found = self._scrub(f"{type(last).__name__}: {_first_line(last)}")
        if timed_out:
            found += f" (the last attempt timed out after {self.policy.timeout:g} s)"
        raise RemoteReadError(
            describe(
                f"Reading a remote file failed after {attempts} attempt(s)",
                expected="the bytes asked for",
                found=found,
                file=self._where(path, rng),
                fix="check that the server is reachable and healthy, then run again; raise "
                "RetryPolicy(attempts=..., timeout=...) for a flaky or slow link",
            )
        ) from None

    def _info(self, path: str, meta: Mapping[str, Any]) -> ObjectInfo:
        return ObjectInfo(
            path=path,
            size=int(meta["size"]),
            etag=meta.get("e_tag") or None,
            version=meta.get("version") or None,
        )

    def _check(self, info: ObjectInfo, rng: tuple[int, int] | None) -> None:
        """Pin ``info`` the first time its path is seen; raise if a later response differs."""
        with self._lock:
            pinned = self._pinned.setdefault(info.path, info)
            if pinned.etag is None and info.etag and pinned.size == info.size:
                self._pinned[info.path] = pinned = info  # a listing gave the size only
        if pinned.size != info.size or (pinned.etag and info.etag and pinned.etag != info.etag):
            raise _Permanent(self._changed(info.path, pinned, info))

    def _changed(self, path: str, pinned: ObjectInfo | None, found: object) -> RemoteChangedError:
        if isinstance(found, ObjectInfo):
            found = f"size {found.size}, ETag {found.etag}"
        expected = (
            "the version first read"
            if pinned is None
            else f"size {pinned.size}, ETag {pinned.etag}"
        )
        return RemoteChangedError(
            describe(
                "A remote file changed while it was being read",
                expected=expected,
                found=found,
                file=self._where(path),
                fix="pin a revision (a Hub commit sha, or an immutable copy of the bucket "
                "prefix) or clear the metadata cache of this dataset and start again",
            )
        )

    def _where(self, path: str, rng: tuple[int, int] | None = None) -> str:
        where = f"{self.url}/{path}"
        return where if rng is None else f"{where} bytes {rng[0]}-{rng[1]} (end exclusive)"

    def _scrub(self, text: str) -> str:
        text = re.sub(r"(\w+://)[^/\s@]+@", r"\1", text)  # user:password@
        text = re.sub(r"(https?://[^\s?#\"']+)[?#][^\s\"']*", r"\1", text)
        text = re.sub(
            r"(?i)(authorization|x-amz-security-token|signature)[=:]\s*\S+", r"\1=<redacted>", text
        )
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text


class _ShortRead(Exception):
    """A body shorter than its range: the connection dropped; another attempt may work."""


def _span_of(spans: Sequence[tuple[int, int]], start: int) -> int:
    lo, hi = 0, len(spans)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if spans[mid][0] <= start else (lo, mid)
    return lo


def _first_line(error: BaseException | None) -> str:
    text = str(error).strip() if error is not None else "no error recorded"
    return text.splitlines()[0][:300] if text else type(error).__name__


def _client_error(error: BaseException) -> bool:
    """A 4xx other than 408/429 in a client's message: the request itself is wrong."""
    match = re.search(r"\b(?:status|Status|code)[: ]+(4\d\d)\b", str(error))
    return match is not None and match.group(1) not in ("408", "429")


def client_options(
    policy: RetryPolicy, *, allow_http: bool = False, headers: Mapping[str, str] | None = None
) -> Any:
    """obstore ``client_options`` for ``policy``'s timeouts.

    Args:
        policy: the timeouts to apply.
        allow_http: allow ``http://`` endpoints (loopback servers, local gateways).
        headers: headers sent with every request (the Hub's ``authorization``).

    Returns:
        A ``ClientConfig`` dict.
    """
    options: dict[str, Any] = {
        "timeout": timedelta(seconds=policy.timeout),
        "connect_timeout": timedelta(seconds=policy.connect_timeout),
        "allow_http": allow_http,
    }
    if headers:
        options["default_headers"] = dict(headers)
    return options


def no_retries() -> Any:
    """obstore ``retry_config`` with its retries off (:class:`ObstoreStore` counts attempts).

    Returns:
        A ``RetryConfig`` dict.
    """
    return {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}
