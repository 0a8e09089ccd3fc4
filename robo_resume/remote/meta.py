"""A local copy of a remote dataset's ``meta/`` folder, fetched once per version.

:func:`fetch_meta` copies ``meta/`` (info.json, the episode tables, tasks, stats) of a remote
dataset into ``CACHE/<url hash>/<version key>/meta/`` so that
:func:`robo_resume.format.metadata.load_metadata` reads it like a local root:

1. The version key is the Hub revision's commit sha (one API call resolves it), or for
   s3/gs/http the ETag and size of ``meta/info.json`` (one HEAD): a rewritten dataset gets a
   new info.json, hence a new folder, and an old folder is never read for a new version.
2. A folder that holds its manifest is complete (the manifest is written last, inside a
   temporary folder that is renamed into place): it is returned without any GET.
3. Otherwise the files are listed (S3, GCS, Hub) or, for plain HTTP, probed by the names the
   format gives them; every listed path is checked with
   :func:`~robo_resume.remote.store.safe_path` before it becomes a local path.
4. The manifest (path -> size, ETag) goes back to the caller, who opens the data store with
   it as ``expected=`` so that a data file read later is held to one version too.
5. The data and video files are not in the key: the folder also holds their
   :class:`~robo_resume.remote.ledger.FileLedger`, the size and ETag each had when a run first
   read it, so that a file replaced on the server under the same info.json is refused.

The cache folder is ``cache_dir``, else ``$ROBO_RESUME_CACHE/remote``, else
``~/.cache/robo_resume/remote``. Deleting a folder there is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import NamedTuple

from ..errors import DatasetFormatError, MissingFileError, describe
from .hub import HubStore
from .open import open_store
from .store import ObjectInfo, RetryPolicy, Store, redact_url, safe_path

__all__ = ["MANIFEST", "MetaCache", "default_cache_dir", "fetch_meta"]

MANIFEST = "robo_resume_manifest.json"
"""Name of the manifest file beside ``meta/`` in a cache folder; its presence marks it complete."""


class MetaCache(NamedTuple):
    """Where :func:`fetch_meta` put ``meta/``, and what the server said about each file.

    Args:
        root: a local dataset root holding ``meta/`` (for ``load_metadata``).
        manifest: relative path -> :class:`ObjectInfo` for every file fetched.
        key: the version key (commit sha, or ``etag-...`` of info.json).
        fetched: True when the files were fetched by this call, False when the cache held them.
    """

    root: Path
    manifest: dict[str, ObjectInfo]
    key: str
    fetched: bool


def default_cache_dir() -> Path:
    """``$ROBO_RESUME_CACHE/remote``, else ``~/.cache/robo_resume/remote``.

    Returns:
        The folder (not created here).
    """
    base = os.environ.get("ROBO_RESUME_CACHE") or Path.home() / ".cache" / "robo_resume"
    return Path(base) / "remote"


def fetch_meta(
    url: str,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    *,
    store: Store | None = None,
    policy: RetryPolicy | None = None,
) -> MetaCache:
    """Copy the remote dataset's ``meta/`` into the local cache once per version.

    Args:
        url: the dataset root (``hf://datasets/ORG/NAME``, ``s3://...``, ``gs://...``,
            ``https://...``).
        revision: Hub revision (branch, tag or commit); ``hf://`` only.
        cache_dir: cache folder (default :func:`default_cache_dir`).
        store: an already opened store for ``url`` (default :func:`open_store`).
        policy: retries and timeouts when the store is opened here.

    Returns:
        A :class:`MetaCache`; ``load_metadata(result.root)`` reads the dataset's metadata.

    Raises:
        MissingFileError: ``meta/info.json`` or another required metadata file is missing.
        RemoteReadError, RemoteChangedError, RemotePathError: see
            :mod:`robo_resume.remote.store`.
        DatasetFormatError: ``meta/info.json`` is not JSON.
    """
    store = store or open_store(url, revision=revision, policy=policy)
    if isinstance(store, HubStore):  # one folder per repo whatever names the revision
        ident, key = f"{store.endpoint}/datasets/{store.repo_id}", store.sha
    else:
        info = store.head("meta/info.json")
        ident = redact_url(url).rstrip("/")
        key = "etag-" + _digest(f"{info.etag}|{info.size}|{info.version}")
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = base / _digest(ident) / key
    cached = _read_manifest(folder)
    if cached is not None:
        return MetaCache(folder, cached, key, False)
    paths = _meta_paths(store)
    tmp = folder.parent / f".{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        manifest: dict[str, ObjectInfo] = {}
        for path, data in paths.items():
            target = tmp.joinpath(*path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            manifest[path] = store.pinned(path) or ObjectInfo(path, len(data))
        body = {
            p: {"size": i.size, "etag": i.etag, "version": i.version} for p, i in manifest.items()
        }
        (tmp / MANIFEST).write_text(
            json.dumps({"url": redact_url(url), "key": key, "files": body}, indent=1)
        )
        try:
            os.rename(tmp, folder)  # atomic: a reader sees no folder or a complete one
        except OSError:
            if _read_manifest(folder) is None:  # not another process's complete copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return MetaCache(folder, manifest, key, True)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read_manifest(folder: Path) -> dict[str, ObjectInfo] | None:
    try:
        body = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = {
        safe_path(p): ObjectInfo(safe_path(p), int(v["size"]), v.get("etag"), v.get("version"))
        for p, v in body.get("files", {}).items()
    }
    if any(not folder.joinpath(*p.split("/")).is_file() for p in files):
        return None
    return files


def _meta_paths(store: Store) -> dict[str, bytes]:
    """Every file of ``meta/`` with its bytes: listed where the store lists, else probed."""
    if store.listable:
        return {i.path: store.get(i.path) for i in store.list("meta")}
    out = {"meta/info.json": store.get("meta/info.json")}
    try:
        info = json.loads(out["meta/info.json"])
        version = str(info.get("codebase_version", ""))
    except (ValueError, AttributeError) as e:
        raise DatasetFormatError(
            describe(
                "meta/info.json is not a JSON object",
                expected="LeRobot info.json",
                found=f"{type(e).__name__}: {e}",
                file=f"{store.url}/meta/info.json",
                fix="check that the URL points at a LeRobot dataset root",
            )
        ) from None
    if version.startswith("v2"):
        required, optional = (
            ["episodes.jsonl", "tasks.jsonl"],
            ["episodes_stats.jsonl", "stats.json"],
        )
    else:
        required, optional = ["tasks.parquet"], ["stats.json"]
    for name in required:
        out[f"meta/{name}"] = store.get(f"meta/{name}")
    for name in optional:
        _get_if_present(store, f"meta/{name}", out)
    if not version.startswith("v2"):
        chunk = 0
        while True:
            file = 0
            while _get_if_present(
                store, f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet", out
            ):
                file += 1
            if file == 0:
                break
            chunk += 1
    return out


def _get_if_present(store: Store, path: str, out: dict[str, bytes]) -> bool:
    try:
        out[path] = store.get(path)
    except MissingFileError:
        return False
    return True
