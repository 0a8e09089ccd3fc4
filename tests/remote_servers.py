"""Loopback servers for the remote-reading tests: plain HTTP, a Hub endpoint, S3 (moto), GCS.

Each server runs in a thread of this process on 127.0.0.1 with a port of its own and is
stopped by the fixture that started it. All three share :class:`Faults`, which the test
drives: the next N requests answer 5xx, stall (a timeout), have their bodies cut mid-way
(connection reset) or send half the body with a matching Content-Length (a short read)
(``only``: just the requests whose ``"METHOD path"`` contains it, e.g. ``"GET videos/"``),
each request waits ``latency`` seconds, bodies flow at ``bandwidth`` bytes/s, and a path can be
served with other bytes (a changed file: other size and ETag). Requests and body bytes are
counted per (method, path); ``log`` holds ``(method, path, Range header)`` of each request.

- :class:`FolderServer` serves a local dataset folder with Range, HEAD, ETag and If-Match.
- :class:`HubServer` adds what huggingface_hub and robo_resume call on a Hub: ``dataset_info``
  at a revision (``/api/datasets/{repo}/revision/{rev}``), ``list_repo_tree``
  (``/api/datasets/{repo}/tree/{rev}[/{path}]``, recursive) and
  ``/datasets/{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit`` and ``ETag``.
- :class:`S3Server` is moto's ``ThreadedMotoServer`` behind a fault-injecting proxy; the
  dataset is uploaded with boto3.
- :class:`GCSServer` answers the part of the GCS XML API that obstore's ``GCSStore`` calls on
  a dataset (object GET with Range, HEAD, ``?list-type=2`` listing), with a bearer token.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

from aiohttp import ClientSession, web

COMMIT = hashlib.sha1(b"robo_resume loopback hub").hexdigest()
"""The commit sha that the Hub server's ``main`` resolves to."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_refuses(port: int) -> bool:
    """True when a connection to 127.0.0.1:``port`` is refused (the server is gone)."""
    with socket.socket() as s:
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
        except (ConnectionRefusedError, OSError):
            return True
    return False


@dataclass
class Faults:
    """What the servers do wrong, set by the test; counts of what they served."""

    fail_next: int = 0
    fail_status: int = 503
    reset_next: int = 0
    stall_next: int = 0
    truncate_next: int = 0
    stall: float = 2.0
    only: str | None = None
    latency: float = 0.0
    bandwidth: float | None = None
    changed: dict[str, bytes] = field(default_factory=dict)
    requests: Counter = field(default_factory=Counter)
    bytes_sent: Counter = field(default_factory=Counter)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        """No faults and zero counts."""
        with self.lock:
            self.fail_next = self.reset_next = self.stall_next = self.truncate_next = 0
            self.latency, self.bandwidth, self.only = 0.0, None, None
            self.changed.clear()
            self.requests.clear()
            self.bytes_sent.clear()
            self.log.clear()

    def count(self, method: str, path: str | None = None) -> int:
        """Requests made with ``method`` (to paths ending in ``path`` when given)."""
        return sum(
            n
            for (m, p), n in self.requests.items()
            if m == method and (path is None or p.endswith(path))
        )

    def sent(self, path: str) -> int:
        """Body bytes sent for paths ending in ``path``."""
        return sum(n for p, n in self.bytes_sent.items() if p.endswith(path))

    def _take(self, name: str, key: str | None = None) -> bool:
        if self.only is not None and key is not None and self.only not in key:
            return False
        with self.lock:
            if getattr(self, name) > 0:
                setattr(self, name, getattr(self, name) - 1)
                return True
        return False


async def send(
    request: web.Request, faults: Faults, key: str, status: int, headers: dict, body: bytes
) -> web.StreamResponse:
    """Write ``body`` with the faults applied (latency first, then 5xx, reset, bandwidth)."""
    with faults.lock:
        faults.requests[(request.method, key)] += 1
        faults.log.append((request.method, key, request.headers.get("Range")))
    if faults.latency:
        await asyncio.sleep(faults.latency)
    if faults._take("stall_next", f"{request.method} {key}"):  # longer than the client's timeout
        await asyncio.sleep(faults.stall)
    if faults._take("fail_next", f"{request.method} {key}"):
        return web.Response(status=faults.fail_status, text="injected failure")
    try:
        return await _write(request, faults, key, status, headers, body)
    except ConnectionResetError:  # the client gave up (its timeout): nothing left to send
        return web.Response(status=499)


async def _write(
    request: web.Request, faults: Faults, key: str, status: int, headers: dict, body: bytes
) -> web.StreamResponse:
    if (
        request.method == "GET"
        and len(body) > 1
        and faults._take("truncate_next", f"{request.method} {key}")
    ):
        body = body[: len(body) // 2]  # a short body that its headers do not give away
    resp = web.StreamResponse(status=status, headers=headers)
    if request.method != "HEAD" or "Content-Length" not in headers:
        resp.content_length = len(body)
    await resp.prepare(request)
    if request.method == "HEAD":
        await resp.write_eof()
        return resp
    if faults._take("reset_next", f"{request.method} {key}") and len(body) > 1:
        with faults.lock:
            faults.bytes_sent[key] += len(body) // 2
        await resp.write(body[: len(body) // 2])
        assert request.transport is not None
        request.transport.abort()  # a connection reset mid-body
        return resp
    step = 65536 if faults.bandwidth is None else max(1, int(faults.bandwidth / 20))
    for i in range(0, len(body), step):
        if faults.bandwidth:  # before the write: the client waits for every piece
            await asyncio.sleep(len(body[i : i + step]) / faults.bandwidth)
        with faults.lock:  # counted before the write: the client may return before it ends
            faults.bytes_sent[key] += len(body[i : i + step])
        await resp.write(body[i : i + step])
    await resp.write_eof()
    return resp


_ETAGS: dict[int, tuple[bytes, str]] = {}  # id -> (the object, kept alive so ids stay unique)


def etag_of(data: bytes) -> str:
    """A strong ETag: the quoted md5 of the content (what S3 gives a single-part object).

    Remembered per bytes object (``_read`` keeps one per unchanged file), so that a large file
    is not hashed on every request.
    """
    if id(data) not in _ETAGS:
        _ETAGS[id(data)] = (data, '"' + hashlib.md5(data).hexdigest() + '"')
    return _ETAGS[id(data)][1]


async def serve_bytes(
    request: web.Request, faults: Faults, key: str, data: bytes, extra: dict | None = None
) -> web.StreamResponse:
    """Answer GET/HEAD of ``data`` with Range (one range), ETag and If-Match."""
    etag = etag_of(data)
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        "Content-Type": "application/octet-stream",
        **(extra or {}),
    }
    match = request.headers.get("If-Match")
    if match and match != "*" and etag not in [m.strip() for m in match.split(",")]:
        return await send(request, faults, key, 412, {"ETag": etag}, b"")
    rng = request.headers.get("Range")
    if rng:
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
        if not m or (m.group(1) == "" and m.group(2) == ""):
            return await send(
                request, faults, key, 416, {"Content-Range": f"bytes */{len(data)}"}, b""
            )
        if m.group(1) == "":
            start, end = max(0, len(data) - int(m.group(2))), len(data) - 1
        else:
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data) or end < start:
            return await send(
                request, faults, key, 416, {"Content-Range": f"bytes */{len(data)}"}, b""
            )
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return await send(request, faults, key, 206, headers, data[start : end + 1])
    if request.method == "HEAD":
        headers["Content-Length"] = str(len(data))
    return await send(request, faults, key, 200, headers, data)


class _ThreadServer:
    """An aiohttp app on its own event loop in a daemon thread; ``stop()`` closes the port."""

    def __init__(self, faults: Faults | None = None):
        self.faults = faults or Faults()
        self.port = 0
        self._files: dict[tuple[str, int, int], bytes] = {}
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name=f"{type(self).__name__}"
        )

    def app(self) -> web.Application:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> _ThreadServer:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> int:
        self._runner = web.AppRunner(
            self.app(), handle_signals=False, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _read(self, root: Path, rel: str) -> bytes | None:
        if rel in self.faults.changed:
            return self.faults.changed[rel]
        path = (root / rel).resolve()
        if root.resolve() not in path.parents or not path.is_file():
            return None
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key not in self._files:  # one bytes object per file version: etag_of remembers it
            self._files[key] = path.read_bytes()
        return self._files[key]


class FolderServer(_ThreadServer):
    """A Range-capable static server of ``root`` at ``/``: ``{url}/{relative path}``."""

    def __init__(self, root: Path, faults: Faults | None = None):
        super().__init__(faults)
        self.root = Path(root)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/{path:.*}", self.handle)
        app.router.add_route("HEAD", "/{path:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rel = unquote(request.match_info["path"])
        data = self._read(self.root, rel)
        if data is None:
            return await send(request, self.faults, rel, 404, {}, b"not found")
        return await serve_bytes(request, self.faults, rel, data)


class HubServer(_ThreadServer):
    """A Hub endpoint serving ``root`` as dataset ``repo_id`` at commit :data:`COMMIT`.

    ``main`` and :data:`COMMIT` resolve; other revisions answer 404 RevisionNotFound.
    ``token``, when set, is required as ``Authorization: Bearer TOKEN`` (else 401).
    """

    def __init__(
        self,
        root: Path,
        repo_id: str = "org/ds",
        token: str | None = None,
        faults: Faults | None = None,
    ):
        super().__init__(faults)
        self.root, self.repo_id, self.token = Path(root), repo_id, token

    def app(self) -> web.Application:
        app = web.Application()
        r = app.router
        r.add_get("/api/datasets/{org}/{name}/revision/{rev}", self.info)
        r.add_get("/api/datasets/{org}/{name}/tree/{rev}", self.tree)
        r.add_get("/api/datasets/{org}/{name}/tree/{rev}/{path:.*}", self.tree)
        r.add_route("GET", "/datasets/{org}/{name}/resolve/{rev}/{path:.*}", self.resolve)
        r.add_route("HEAD", "/datasets/{org}/{name}/resolve/{rev}/{path:.*}", self.resolve)
        return app

    def _denied(self, request: web.Request) -> web.Response | None:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"error": "Invalid credentials"}, status=401)
        if repo != self.repo_id:
            return web.json_response(
                {"error": "Repository not found"},
                status=404,
                headers={"X-Error-Code": "RepoNotFound"},
            )
        if unquote(request.match_info["rev"]) not in ("main", COMMIT):
            return web.json_response(
                {"error": "Invalid rev id"},
                status=404,
                headers={"X-Error-Code": "RevisionNotFound"},
            )
        return None

    async def info(self, request: web.Request) -> web.StreamResponse:
        denied = self._denied(request)
        key = f"api/info/{request.match_info['rev']}"
        if denied is not None:
            return await send(
                request, self.faults, key, denied.status, dict(denied.headers), denied.body
            )  # type: ignore[arg-type]
        body = json.dumps(
            {"id": self.repo_id, "_id": "0" * 24, "sha": COMMIT, "private": False, "siblings": []}
        ).encode()
        return await send(
            request, self.faults, key, 200, {"Content-Type": "application/json"}, body
        )

    async def tree(self, request: web.Request) -> web.StreamResponse:
        denied = self._denied(request)
        sub = unquote(request.match_info.get("path", ""))
        key = f"api/tree/{sub}"
        if denied is not None:
            return await send(
                request, self.faults, key, denied.status, dict(denied.headers), denied.body
            )  # type: ignore[arg-type]
        base = self.root / sub
        recursive = request.query.get("recursive", "false").lower() == "true"
        entries = []
        for p in sorted(base.rglob("*") if recursive else base.glob("*")):
            rel = p.relative_to(self.root).as_posix()
            if p.is_dir():
                entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": rel})
            else:
                data = self._read(self.root, rel) or b""
                entries.append(
                    {
                        "type": "file",
                        "oid": hashlib.sha1(data).hexdigest(),
                        "size": len(data),
                        "path": rel,
                    }
                )
        extra = getattr(self, "extra_tree_paths", [])
        entries += [{"type": "file", "oid": "0" * 40, "size": 1, "path": p} for p in extra]
        return await send(
            request,
            self.faults,
            key,
            200,
            {"Content-Type": "application/json"},
            json.dumps(entries).encode(),
        )

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        rel = unquote(request.match_info["path"])
        denied = self._denied(request)
        if denied is not None:
            return await send(
                request, self.faults, rel, denied.status, dict(denied.headers), denied.body
            )  # type: ignore[arg-type]
        data = self._read(self.root, rel)
        if data is None:
            return await send(
                request,
                self.faults,
                rel,
                404,
                {"X-Error-Code": "EntryNotFound"},
                b"Entry not found",
            )
        extra = {
            "X-Repo-Commit": COMMIT,
            "X-Linked-Size": str(len(data)),
            "X-Linked-Etag": etag_of(data),
        }
        return await serve_bytes(request, self.faults, rel, data, extra)


class S3Server(_ThreadServer):
    """moto's S3 (server mode) on 127.0.0.1 behind a proxy that applies :class:`Faults`.

    ``url`` is the proxy's endpoint (what clients use); ``moto_url`` is moto itself (for
    uploads that must not be faulted or counted). ``access_keys`` counts the access key ids
    that requests were signed with (None: unsigned); moto itself accepts any key.
    """

    def __init__(self, faults: Faults | None = None):
        super().__init__(faults)
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

        self.moto_port = free_port()
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.moto_port, verbose=False)
        self._session: ClientSession | None = None
        self.access_keys: Counter = Counter()

    @property
    def moto_url(self) -> str:
        return f"http://127.0.0.1:{self.moto_port}"

    def start(self) -> S3Server:
        self._moto.start()
        super().start()
        return self

    def stop(self) -> None:
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(10)
        super().stop()
        self._moto.stop()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{path:.*}", self.proxy)
        return app

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        if self._session is None:
            self._session = ClientSession(auto_decompress=False)
        key = request.match_info["path"]
        signed = re.search(r"Credential=([^/,\s]+)/", request.headers.get("Authorization", ""))
        with self.faults.lock:
            self.access_keys[signed.group(1) if signed else None] += 1
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        headers["Host"] = request.host  # the client signed this host
        body = await request.read()
        async with self._session.request(
            request.method,
            self.moto_url + request.path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as up:
            data = await up.read()
            out = {
                k: v
                for k, v in up.headers.items()
                if k.lower()
                not in (
                    "content-length",
                    "transfer-encoding",
                    "content-encoding",
                    "connection",
                    "server",
                    "date",
                )
            }
            if request.method == "HEAD":
                out["Content-Length"] = up.headers.get("Content-Length", "0")
            resp = await send(request, self.faults, key, up.status, out, data)
            return resp

    def _client(self):
        import boto3

        # moto takes any key; explicit dummy ones keep the uploads independent of the env
        return boto3.client(
            "s3",
            endpoint_url=self.moto_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def upload(self, root: Path, bucket: str, prefix: str = "") -> None:
        """Create ``bucket`` and upload every file under ``root`` to ``prefix/`` (boto3, direct)."""
        s3 = self._client()
        s3.create_bucket(Bucket=bucket)
        for p in sorted(Path(root).rglob("*")):
            if p.is_file():
                s3.put_object(
                    Bucket=bucket,
                    Key=f"{prefix}/{p.relative_to(root).as_posix()}".lstrip("/"),
                    Body=p.read_bytes(),
                )

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Replace one object (a changed file) directly on moto."""
        self._client().put_object(Bucket=bucket, Key=key, Body=data)


class GCSServer(_ThreadServer):
    """``root`` served as the objects ``gs://{bucket}/{prefix}/{relative path}``.

    What obstore's ``GCSStore`` (object_store's GCP client, XML API) asks for, found by
    logging its requests against this loopback port with ``GOOGLE_BASE_URL`` set to ``url``:

    - ``GET|HEAD /{bucket}/{object}`` (the object name percent-encoded, ``/`` as ``%2F``), with
      one ``Range``; answered with ``ETag`` (quoted md5), ``Last-Modified``,
      ``x-goog-generation`` and ``x-goog-hash``.
    - ``GET /{bucket}?list-type=2&prefix=P[&delimiter=/]``: a ``ListBucketResult`` XML page
      (every key at once, never truncated).

    ``token``, when set, is required as ``Authorization: Bearer TOKEN`` (else 401).
    """

    def __init__(
        self,
        root: Path,
        bucket: str = "bucket",
        prefix: str = "",
        token: str | None = None,
        faults: Faults | None = None,
    ):
        super().__init__(faults)
        self.root, self.bucket, self.token = Path(root), bucket, token
        self.prefix = prefix.strip("/")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/{path:.*}", self.handle)
        app.router.add_route("HEAD", "/{path:.*}", self.handle)
        return app

    def _rel(self, name: str) -> str | None:
        """The path under ``root`` of the object ``name``, or None outside the prefix."""
        if not self.prefix:
            return name
        return name[len(self.prefix) + 1 :] if name.startswith(self.prefix + "/") else None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = request.raw_path.split("?", 1)[0].lstrip("/")  # raw: %2F stays inside the name
        bucket, _, encoded = raw.partition("/")
        name = unquote(encoded)
        key = name or f"list/{request.query.get('prefix', '')}"
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            body = b"<Error><Code>AuthenticationRequired</Code></Error>"
            return await send(request, self.faults, key, 401, {}, body)
        if unquote(bucket) != self.bucket:
            body = b"<Error><Code>NoSuchBucket</Code></Error>"
            return await send(request, self.faults, key, 404, {}, body)
        if not name:
            return await self.list(request, key)
        rel = self._rel(name)
        data = None if rel is None else self._read(self.root, rel)
        if data is None:
            body = b"<Error><Code>NoSuchKey</Code></Error>"
            return await send(request, self.faults, key, 404, {}, body)
        return await serve_bytes(request, self.faults, key, data, self._headers(rel, data))

    def _headers(self, rel: str | None, data: bytes) -> dict:
        md5 = hashlib.md5(data).digest()
        path = self.root / (rel or "")
        mtime = path.stat().st_mtime if path.is_file() else time.time()
        return {
            "Last-Modified": formatdate(mtime, usegmt=True),
            "x-goog-generation": str(int.from_bytes(md5[:6], "big")),  # another version: another
            "x-goog-hash": "md5=" + base64.b64encode(md5).decode(),
        }

    async def list(self, request: web.Request, key: str) -> web.StreamResponse:
        query = parse_qs(request.query_string)
        want = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        contents, prefixes = [], set()
        for p in sorted(self.root.rglob("*")):
            if not p.is_file():
                continue
            rel = p.relative_to(self.root).as_posix()
            name = f"{self.prefix}/{rel}" if self.prefix else rel
            if not name.startswith(want):
                continue
            rest = name[len(want) :]
            if delimiter and delimiter in rest:
                prefixes.add(want + rest.split(delimiter, 1)[0] + delimiter)
                continue
            data = self._read(self.root, rel) or b""
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(p.stat().st_mtime))
            contents.append(
                f"<Contents><Key>{escape(name)}</Key><LastModified>{stamp}</LastModified>"
                f"<ETag>{escape(etag_of(data))}</ETag><Size>{len(data)}</Size></Contents>"
            )
        common = "".join(
            f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
            for p in sorted(prefixes)
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://doc.s3.amazonaws.com/2006-03-01">'
            f"<Name>{escape(self.bucket)}</Name><Prefix>{escape(want)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>1000</MaxKeys>"
            f"<IsTruncated>false</IsTruncated>{''.join(contents)}{common}</ListBucketResult>"
        ).encode()
        return await send(request, self.faults, key, 200, {"Content-Type": "application/xml"}, body)


def wait_until(predicate, timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed; its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
