"""Hub datasets as a :class:`~robo_resume.remote.store.Store`, pinned to one commit.

``hf://datasets/ORG/NAME`` (optionally ``@REVISION``, or ``revision=``) is read with plain
Range requests on ``{endpoint}/datasets/{repo}/resolve/{sha}/{path}``, where ``sha`` is the
revision resolved once (``HfApi.dataset_info``), so every read of a run sees one commit. The
endpoint is ``HF_ENDPOINT`` read at call time (huggingface_hub reads it once at import), else
huggingface_hub's default; the token is ``HF_TOKEN`` or the one ``hf auth login`` saved
(``huggingface_hub.get_token()``), sent as a header and never shown. Files are listed with
``HfApi.list_repo_tree`` at the commit.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from ..errors import RemoteReadError, describe
from .store import ObjectInfo, ObstoreStore, RetryPolicy, client_options, no_retries, safe_path

__all__ = ["HubStore", "hub_endpoint", "parse_hf_url"]

_T = TypeVar("_T")
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_endpoint() -> str:
    """The Hub endpoint: ``HF_ENDPOINT`` now, else huggingface_hub's configured default.

    Returns:
        The endpoint URL without a trailing slash.
    """
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def parse_hf_url(url: str) -> tuple[str, str | None]:
    """``hf://datasets/ORG/NAME[@REVISION]`` -> ``("ORG/NAME", REVISION or None)``.

    Args:
        url: the dataset URL.

    Returns:
        The repo id and the revision written in the URL.

    Raises:
        ValueError: not a Hub dataset URL.
    """
    rest = url.removeprefix("hf://datasets/")
    repo, _, rev = rest.rstrip("/").partition("@")
    if rest == url or not _REPO.match(repo):
        raise ValueError(
            describe(
                "Not a Hub dataset URL",
                expected="hf://datasets/ORG/NAME or hf://datasets/ORG/NAME@REVISION",
                found=repr(url),
                fix="write the dataset's repo id after hf://datasets/",
            )
        )
    return repo, rev or None


class HubStore(ObstoreStore):
    """A Hub dataset at one commit, read with Range requests on its resolve URLs.

    Args:
        repo_id: ``ORG/NAME``.
        revision: a branch, tag or commit; resolved to a commit sha once, here.
        policy: retries and timeouts (also for the Hub API calls).
        expected: sizes/ETags the files must have (a metadata manifest).
        endpoint: the Hub endpoint (default :func:`hub_endpoint`).
        token: a Hub token (default ``huggingface_hub.get_token()``: HF_TOKEN or the saved
            login); False sends none.

    Raises:
        RemoteReadError: the revision cannot be resolved (unknown repo or revision, or the
            Hub is unreachable after the retries).
    """

    def __init__(
        self,
        repo_id: str,
        revision: str | None = None,
        *,
        policy: RetryPolicy | None = None,
        expected: Mapping[str, ObjectInfo] | None = None,
        endpoint: str | None = None,
        token: str | bool | None = None,
    ):
        import huggingface_hub
        from obstore.store import HTTPStore

        policy = policy or RetryPolicy()
        self.repo_id = repo_id
        self.endpoint = (endpoint or hub_endpoint()).rstrip("/")
        secret = huggingface_hub.get_token() if token is None or token is True else token or None
        self._api = huggingface_hub.HfApi(endpoint=self.endpoint, token=secret or False)
        self._policy = policy
        self._secret = secret
        self.revision = revision or "main"
        self.sha: str = self._call(
            f"resolving revision {self.revision!r}",
            lambda: self._api.dataset_info(repo_id, revision=self.revision).sha or "",
        )
        if not re.fullmatch(r"[0-9a-f]{40}", self.sha):
            raise RemoteReadError(
                describe(
                    "The Hub did not resolve the revision to a commit",
                    expected="a 40-hex commit sha in dataset_info",
                    found=repr(self.sha),
                    file=f"{self.endpoint}/datasets/{repo_id}",
                    fix="check HF_ENDPOINT points at a Hugging Face Hub",
                )
            )
        base = f"{self.endpoint}/datasets/{repo_id}/resolve/{self.sha}"
        headers = {"authorization": f"Bearer {secret}"} if secret else None
        store = HTTPStore(
            base,
            client_options=client_options(
                policy, allow_http=base.startswith("http://"), headers=headers
            ),
            retry_config=no_retries(),
        )
        super().__init__(store, url=base, policy=policy, expected=expected, secrets=[secret or ""])

    def __repr__(self) -> str:
        return f"HubStore({self.repo_id!r}, sha={self.sha!r})"

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every file under the folder ``prefix`` at the pinned commit (``list_repo_tree``).

        Args:
            prefix: a folder path relative to the repo root, e.g. ``"meta"``.

        Returns:
            :class:`ObjectInfo` per file (size only; the ETag is pinned on first read).

        Raises:
            RemoteReadError: the listing failed after the retries.
            RemotePathError: the Hub listed a path that leaves the root.
        """
        prefix = safe_path(prefix, url=self.url)

        def run() -> list[ObjectInfo]:
            entries = self._api.list_repo_tree(
                self.repo_id,
                path_in_repo=prefix,
                recursive=True,
                revision=self.sha,
                repo_type="dataset",
            )
            return [
                ObjectInfo(safe_path(e.path, url=self.url), int(e.size))
                for e in entries
                if hasattr(e, "size")  # RepoFolder has none
            ]

        return sorted(self._call(f"listing {prefix}/", run), key=lambda i: i.path)

    def _call(self, what: str, call: Callable[[], _T]) -> _T:
        """A Hub API call, retried on 5xx and connection errors, failing with RemoteReadError."""
        from huggingface_hub.errors import HfHubHTTPError

        delays = self._policy.delays()
        last: Exception | None = None
        for attempt in range(self._policy.attempts):
            try:
                return call()
            except HfHubHTTPError as e:
                last = e
                status = e.response.status_code if e.response is not None else None
                if status is not None and status < 500 and status not in (408, 429):
                    break
            except OSError as e:
                last = e
            except Exception as e:  # httpx transport errors: not OSError subclasses
                if type(e).__module__.split(".")[0] not in ("httpx", "httpcore"):
                    raise
                last = e
            if attempt < len(delays):
                time.sleep(delays[attempt])
        lines = str(last).strip().splitlines()
        text = f"{type(last).__name__}: {lines[0] if lines else ''}"
        if self._secret:
            text = text.replace(self._secret, "<redacted>")
        raise RemoteReadError(
            describe(
                f"The Hub API failed {what} after {attempt + 1} attempt(s)",
                expected=f"dataset {self.repo_id} at revision {self.revision}",
                found=re.sub(r"(https?://[^\s?#]+)[?#]\S*", r"\1", text),
                file=f"{self.endpoint}/datasets/{self.repo_id}",
                fix="check the repo id, the revision and HF_TOKEN (private or gated datasets), "
                "and that HF_ENDPOINT is reachable",
            )
        ) from None
