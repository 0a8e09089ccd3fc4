"""The size and ETag each data and video file had when a run first read it, kept across runs.

Within one process the store holds every file to its first response (a changed size or ETag
raises :class:`~robo_resume.errors.RemoteChangedError`). Across runs that is not enough: the
metadata cache of :func:`~robo_resume.remote.meta.fetch_meta` is keyed by ``meta/info.json``
only, so an mp4 or parquet replaced on the server under the same info.json would be read by a
resumed run as if it were the file the interrupted run read, and the resume would not be exact.

A :class:`FileLedger` lives in the cache folder of one metadata version (``<folder>/``
:data:`LEDGER`) and holds one small JSON file per data file:

1. The first HEAD of a file, by any process of any run, records its size and ETag: the record
   is written to a temporary file and hard-linked to its name, which fails if the name exists,
   so of two DataLoader workers writing at once the first one wins and neither sees a torn file.
2. Every later HEAD (this run or a later one) is compared with the record; a different size or
   ETag raises :class:`~robo_resume.errors.RemoteChangedError` naming the URL, both versions,
   when the record was made, and the fix.
3. Removing the cache folder drops the ledger with the metadata: the next run reads the
   dataset as it is now and records it afresh.

A Hub dataset read at a resolved commit cannot change, so it keeps no ledger.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

from ..errors import RemoteChangedError, describe
from .store import ObjectInfo, redact_url

__all__ = ["LEDGER", "FileLedger"]

LEDGER = "robo_resume_files"
"""Name of the ledger folder inside a metadata cache folder (beside ``meta/``)."""


class FileLedger:
    """The recorded versions of a remote dataset's files (see the module docstring).

    Args:
        folder: the metadata cache folder of one version (a :class:`~.meta.MetaCache` root);
            the ledger is ``folder / LEDGER``.
        url: the dataset root's URL (messages show it without credentials or query string).
    """

    def __init__(self, folder: str | Path, url: str) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LEDGER
        self.url = redact_url(url).rstrip("/")

    def __repr__(self) -> str:
        return f"FileLedger({str(self.path)!r})"

    def check(self, info: ObjectInfo) -> None:
        """Record ``info`` if its file has no record yet; else hold it to the record.

        Args:
            info: what a HEAD of the file just said (``info.path`` relative to the root).

        Raises:
            RemoteChangedError: the record has another size or ETag (the message names the
                file's URL, both versions, when the record was made, and the fix).
        """
        recorded = self.recorded(info.path)
        if recorded is None:
            recorded = self._record(info)
        size, etag = int(recorded["size"]), recorded.get("etag")
        if size != info.size or (etag and info.etag and etag != info.etag):
            raise RemoteChangedError(
                describe(
                    "A remote file changed on the server since a run first read it",
                    expected=f"size {size}, ETag {etag} (recorded {recorded.get('recorded')})",
                    found=f"size {info.size}, ETag {info.etag}",
                    file=f"{self.url}/{info.path}",
                    fix="the dataset changed on the server since a run first read it, so a "
                    "resume state is not exact across that change: pin a version (an immutable "
                    "copy of the bucket prefix, or a Hub commit), or remove the cache folder "
                    f"{self.folder} to accept the new version",
                )
            )

    def recorded(self, path: str) -> dict | None:
        """The record of ``path`` (``size``, ``etag``, ``version``, ``recorded``), or None."""
        try:
            body = json.loads(self._file(path).read_text())
        except (OSError, ValueError):
            return None  # no record (or one cut by a crash: written again)
        if not isinstance(body, dict) or body.get("path") != path or "size" not in body:
            return None
        return body

    def _file(self, path: str) -> Path:
        return self.path / (hashlib.sha256(path.encode()).hexdigest()[:32] + ".json")

    def _record(self, info: ObjectInfo) -> dict:
        """Write the record of ``info`` unless another process wrote one first; the record."""
        body = {
            "path": info.path,
            "size": info.size,
            "etag": info.etag,
            "version": info.version,
            "recorded": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        }
        self.path.mkdir(parents=True, exist_ok=True)
        target = self._file(info.path)
        tmp = self.path / f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_text(json.dumps(body))  # complete before it gets its name
        try:
            try:
                os.link(tmp, target)  # atomic, and fails if a record exists: first one wins
            except FileExistsError:
                theirs = self.recorded(info.path)
                if theirs is not None:
                    return theirs
                os.replace(tmp, target)  # the existing one was cut by a crash
            except OSError:  # a file system without hard links: last writer wins
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return self.recorded(info.path) or body
