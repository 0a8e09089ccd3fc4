"""Open a :class:`~robo_resume.remote.store.Store` for a dataset URL.

``s3://bucket/prefix`` and ``gs://bucket/prefix`` use obstore with credentials from the
client's usual places (``AWS_*`` variables; ``AWS_PROFILE`` through boto3, which the
``remote`` extra installs; ``GOOGLE_BEARER_TOKEN``, ``GOOGLE_APPLICATION_CREDENTIALS`` or the
metadata server), ``AWS_ENDPOINT_URL`` for S3-compatible servers, ``GOOGLE_BASE_URL`` for a
GCS emulator or gateway (``http://`` allowed there). ``https://`` (and ``http://``) is plain
HTTP with Range requests and no listing. ``hf://datasets/ORG/NAME[@REV]`` is a
:class:`~robo_resume.remote.hub.HubStore`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import RemoteReadError, describe
from .hub import HubStore, parse_hf_url
from .store import ObjectInfo, ObstoreStore, RetryPolicy, Store, client_options, no_retries

__all__ = ["SCHEMES", "open_store"]

SCHEMES = ("hf", "s3", "gs", "https", "http")
"""URL schemes :func:`open_store` reads."""


def open_store(
    url: str,
    *,
    revision: str | None = None,
    policy: RetryPolicy | None = None,
    expected: Mapping[str, ObjectInfo] | None = None,
) -> Store:
    """The store rooted at the dataset folder ``url``.

    Args:
        url: ``hf://datasets/ORG/NAME[@REV]``, ``s3://bucket/prefix``, ``gs://bucket/prefix``
            or ``https://host/path``.
        revision: the Hub revision (branch, tag, commit); overrides one in the URL. Only for
            ``hf://``.
        policy: retries and timeouts (default :class:`RetryPolicy()`).
        expected: sizes/ETags the files must have (a metadata manifest).

    Returns:
        A :class:`Store`; opening makes no request except the Hub's revision lookup.

    Raises:
        ValueError: an unknown scheme, or ``revision`` for a non-Hub URL.
        RemoteReadError: the Hub revision cannot be resolved.
    """
    policy = policy or RetryPolicy()
    scheme = urlsplit(url).scheme
    if scheme == "hf":
        repo, rev = parse_hf_url(url)
        return HubStore(repo, revision or rev, policy=policy, expected=expected)
    if revision is not None:
        raise ValueError(
            describe(
                "A revision applies to Hub datasets only",
                expected="revision=None for an s3/gs/http URL",
                found=f"revision={revision!r} for {url}",
                fix="drop revision=, or point the URL at an immutable copy",
            )
        )
    parts = urlsplit(url)
    prefix = parts.path.strip("/")
    retry = no_retries()
    if scheme == "s3":
        from obstore.store import S3Store

        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kwargs: dict[str, Any] = {}
        if endpoint:
            kwargs["endpoint"] = endpoint
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        profile = os.environ.get("AWS_PROFILE")
        if profile and not os.environ.get("AWS_ACCESS_KEY_ID"):
            kwargs["credential_provider"] = _profile_credentials(url, profile)
        store: Any = S3Store(
            parts.netloc,
            prefix=prefix or None,
            client_options=client_options(policy, allow_http=str(endpoint).startswith("http://")),
            retry_config=retry,
            **kwargs,
        )
        secrets = [os.environ.get(k, "") for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
        return ObstoreStore(store, url=url, policy=policy, expected=expected, secrets=secrets)
    if scheme == "gs":
        from obstore.store import GCSStore

        base = os.environ.get("GOOGLE_BASE_URL", "")  # obstore reads it too; http:// needs this
        store = GCSStore(
            parts.netloc,
            prefix=prefix or None,
            client_options=client_options(policy, allow_http=base.startswith("http://")),
            retry_config=retry,
        )
        secrets = [os.environ.get("GOOGLE_BEARER_TOKEN", "")]
        return ObstoreStore(store, url=url, policy=policy, expected=expected, secrets=secrets)
    if scheme in ("https", "http"):
        from obstore.store import HTTPStore

        store = HTTPStore(
            url.rstrip("/"),
            client_options=client_options(policy, allow_http=scheme == "http"),
            retry_config=retry,
        )
        return ObstoreStore(
            store,
            url=url,
            policy=policy,
            expected=expected,
            listable=False,
            secrets=[parts.password or ""],
        )
    raise ValueError(
        describe(
            "Unknown remote URL scheme",
            expected="one of " + ", ".join(f"{s}://" for s in SCHEMES),
            found=repr(url),
            fix="use a local path, or one of those URL forms",
        )
    )


def _profile_credentials(url: str, profile: str) -> Any:
    """obstore's boto3 credential provider for ``AWS_PROFILE``, or an error saying what is wrong.

    object_store reads no AWS profile itself, so a profile (shared credentials, SSO, assumed
    role) goes through boto3's session.
    """
    try:
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as exc:
        raise ImportError(
            describe(
                f"Reading {url} with AWS_PROFILE={profile!r} needs boto3",
                expected="the boto3 package (obstore reads AWS profiles through it)",
                found=f"{type(exc).__name__}: {str(exc).rstrip('.')}",
                fix="pip install boto3 (or 'robo_resume[remote]', which includes it), or set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead of AWS_PROFILE",
            )
        ) from exc
    from botocore.exceptions import BotoCoreError

    try:
        return Boto3CredentialProvider()
    except (BotoCoreError, ValueError) as exc:  # ValueError: the profile holds no credentials
        raise RemoteReadError(
            describe(
                f"The AWS profile {profile!r} gives no credentials",
                expected="a profile with credentials in the shared credentials or config file",
                found=f"{type(exc).__name__}: {str(exc).rstrip('.')}",
                file=url,
                fix="check AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE (aws "
                "configure list --profile NAME), or run aws sso login for an SSO profile",
            )
        ) from None
