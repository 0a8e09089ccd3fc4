"""Credentials of remote datasets: ``AWS_PROFILE`` (through boto3) and ``gs://`` (bearer token).

Both run on loopback only: moto's S3 (tests/remote_servers.py S3Server, whose proxy records
the access key id each request was signed with) and the GCS XML-API server GCSServer, pointed
at by ``GOOGLE_BASE_URL``. Every credential variable of the machine is removed first, so that
nothing here reads real credentials or reaches a metadata server.
"""

from __future__ import annotations

import re
import sys

import boto3  # noqa: F401 - the remote and dev extras install it: a missing one fails
import moto  # noqa: F401
import obstore  # noqa: F401
import pytest
from remote_servers import GCSServer, S3Server
from test_batches import assert_same_batches

from robo_resume import ChunkedEpisodeDataset, MissingFileError
from robo_resume.errors import RemoteReadError
from robo_resume.remote.open import open_store
from robo_resume.remote.store import RetryPolicy

BUCKET = "bucket"
PREFIX = "datasets/small"
PROFILE = "robo-test"
PROFILE_KEY = "AKIAPROFILEROBOTEST1"  # moto takes any key; the proxy records which one signed
PROFILE_SECRET = "profileSECRETvalue/doNotPrint+1234567890"
GCS_TOKEN = "ya29.gcsSECRETbearerToken"
FAST = RetryPolicy(attempts=2, first_delay=0.01, max_delay=0.01, timeout=5.0)
VIDEO = "videos/observation.images.cam0/chunk-000/file-000.mp4"

CREDENTIAL_VARS = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BASE_URL",
    "GOOGLE_BEARER_TOKEN",
    "GOOGLE_SKIP_SIGNATURE",
    "GOOGLE_BUCKET",
    "GOOGLE_BUCKET_NAME",
]


@pytest.fixture(scope="module")
def small(factory):
    """Two cameras, five episodes, two episodes per file."""
    return factory(episode_lengths=(23, 41, 17, 30, 9), episodes_per_file=2, num_cameras=2).root


@pytest.fixture(scope="module")
def servers(small):
    started = []
    try:
        s3 = S3Server()
        started.append(s3.start())
        s3.upload(small, BUCKET, PREFIX)
        started.append(GCSServer(small, BUCKET, PREFIX, token=GCS_TOKEN).start())
        yield {"s3": started[0], "gs": started[1]}
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def env(monkeypatch, servers, tmp_path):
    """No credential of the machine; the metadata cache in tmp_path; clean server counts."""
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROBO_RESUME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # boto3 never asks 169.254.169.254
    for server in servers.values():
        server.faults.clear()
    servers["s3"].access_keys.clear()
    yield servers
    for server in servers.values():
        server.faults.clear()


@pytest.fixture
def profile(env, monkeypatch, tmp_path):
    """AWS_PROFILE naming a profile of temporary shared credentials and config files."""
    credentials, config = tmp_path / "aws" / "credentials", tmp_path / "aws" / "config"
    credentials.parent.mkdir()
    credentials.write_text(
        f"[default]\naws_access_key_id = AKIADEFAULTNOTUSED00\naws_secret_access_key = x\n\n"
        f"[{PROFILE}]\naws_access_key_id = {PROFILE_KEY}\n"
        f"aws_secret_access_key = {PROFILE_SECRET}\n"
    )
    config.write_text(f"[profile {PROFILE}]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", PROFILE)
    monkeypatch.setenv("AWS_ENDPOINT_URL", env["s3"].url)
    return env


@pytest.fixture
def gcs(env, monkeypatch):
    """GOOGLE_BASE_URL at the loopback GCS server, its bearer token in GOOGLE_BEARER_TOKEN."""
    monkeypatch.setenv("GOOGLE_BASE_URL", env["gs"].url)
    monkeypatch.setenv("GOOGLE_BEARER_TOKEN", GCS_TOKEN)
    return env


def batches(root, **kw):
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=3, **kw)
    return list(ds.dataloader(num_workers=0))


# --------------------------------------------------------------------------- AWS_PROFILE


def test_aws_profile_reads_the_same_batches_as_the_local_folder(profile, small):
    url = f"s3://{BUCKET}/{PREFIX}"
    assert_same_batches(batches(url), batches(small))
    keys = profile["s3"].access_keys
    assert profile["s3"].faults.count("GET") > 0
    assert set(keys) == {PROFILE_KEY}, keys  # every request signed with the profile's key


def test_the_profile_secret_never_appears_in_messages_or_reprs(profile):
    url = f"s3://{BUCKET}/{PREFIX}"
    store = open_store(url, policy=FAST)
    texts = [repr(store), store.url]
    with pytest.raises(MissingFileError) as missing:
        store.get("meta/none.json")
    profile["s3"].faults.fail_next = 10_000
    with pytest.raises(RemoteReadError, match=r"failed after 2 attempt\(s\)") as failed:
        store.get_range(VIDEO, 0, 10)
    profile["s3"].faults.clear()
    with pytest.raises(MissingFileError) as no_dataset:
        ChunkedEpisodeDataset(f"s3://{BUCKET}/no/such/prefix", batch_size=4)
    texts += [str(missing.value), str(failed.value), str(no_dataset.value)]
    assert f"s3://{BUCKET}/{PREFIX}/meta/none.json" in texts[2]
    assert set(profile["s3"].access_keys) == {PROFILE_KEY}
    for text in texts:
        assert PROFILE_SECRET not in text and PROFILE_SECRET[:16] not in text, text


def test_an_unknown_profile_is_a_clear_error(profile, monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(RemoteReadError) as err:
        open_store(f"s3://{BUCKET}/{PREFIX}")
    text = str(err.value)
    assert "The AWS profile 'no-such-profile' gives no credentials." in text
    assert "ProfileNotFound" in text and f"At file s3://{BUCKET}/{PREFIX}." in text
    assert "check AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE" in text
    assert PROFILE_SECRET not in text


def test_aws_profile_without_boto3_says_how_to_install_it(profile, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` fails
    monkeypatch.delitem(sys.modules, "obstore.auth.boto3", raising=False)  # imported again
    with pytest.raises(ImportError) as err:
        open_store(f"s3://{BUCKET}/{PREFIX}")
    text = str(err.value)
    assert f"Reading s3://{BUCKET}/{PREFIX} with AWS_PROFILE='{PROFILE}' needs boto3." in text
    assert re.search(r"Found (ModuleNotFound|Import)Error: [^.]*boto3", text), text
    assert "pip install boto3 (or 'robo_resume[remote]', which includes it)" in text
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead of AWS_PROFILE" in text


def test_keys_in_the_environment_win_over_the_profile(profile, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENTKEY00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envSECRET")
    monkeypatch.setitem(sys.modules, "boto3", None)  # not needed: no ImportError
    monkeypatch.delitem(sys.modules, "obstore.auth.boto3", raising=False)
    store = open_store(f"s3://{BUCKET}/{PREFIX}", policy=FAST)
    assert store.get("meta/info.json").startswith(b"{")
    assert set(profile["s3"].access_keys) == {"AKIAENVIRONMENTKEY00"}


# --------------------------------------------------------------------------- gs://


def test_gs_reads_the_same_batches_as_the_local_folder(gcs, small):
    url = f"gs://{BUCKET}/{PREFIX}"
    assert_same_batches(batches(url), batches(small))
    faults = gcs["gs"].faults
    assert faults.count("GET", ".mp4") > 0 and faults.count("GET", ".parquet") > 0


def test_gs_store_reads_ranges_lists_and_pins_the_generation(gcs, small):
    store = open_store(f"gs://{BUCKET}/{PREFIX}", policy=FAST)
    local = (small / VIDEO).read_bytes()
    assert store.get_range(VIDEO, 100, 200) == local[100:200]
    info = store.head(VIDEO)
    assert info.size == len(local) and info.etag and info.version
    assert store.pinned(VIDEO) == info
    listed = store.list("meta")
    expected = sorted(
        p.relative_to(small).as_posix() for p in (small / "meta").rglob("*") if p.is_file()
    )
    assert [i.path for i in listed] == expected
    assert all(i.size == (small / i.path).stat().st_size for i in listed)


def test_a_wrong_gcs_token_is_denied_without_showing_it(gcs, monkeypatch):
    monkeypatch.setenv("GOOGLE_BEARER_TOKEN", "ya29.wrongSECRETtoken")
    with pytest.raises(RemoteReadError) as err:
        ChunkedEpisodeDataset(f"gs://{BUCKET}/{PREFIX}", batch_size=4)
    text = str(err.value)
    assert "Access to a remote file was denied" in text
    assert f"gs://{BUCKET}/{PREFIX}/meta/" in text
    assert "GOOGLE_APPLICATION_CREDENTIALS" in text
    assert "wrongSECRET" not in text and GCS_TOKEN not in text
    assert len(gcs["gs"].faults.log) == 1  # a 401 is not retried


def test_the_gcs_token_never_appears_in_messages_or_reprs(gcs):
    store = open_store(f"gs://{BUCKET}/{PREFIX}", policy=FAST)
    texts = [repr(store), store.url]
    with pytest.raises(MissingFileError) as missing:
        store.get("meta/none.json")
    gcs["gs"].faults.fail_next = 10_000
    with pytest.raises(RemoteReadError, match=r"failed after 2 attempt\(s\)") as failed:
        store.get_range(VIDEO, 0, 10)
    texts += [str(missing.value), str(failed.value)]
    assert f"gs://{BUCKET}/{PREFIX}/meta/none.json" in texts[2]
    for text in texts:
        assert GCS_TOKEN not in text and "gcsSECRET" not in text, text


@pytest.mark.parametrize("kind", ["s3-profile", "gs"])
def test_credentials_reach_spawned_workers(kind, env, monkeypatch, tmp_path, small, request):
    """Each worker opens its own store from the environment (a store does not pickle)."""
    request.getfixturevalue("profile" if kind == "s3-profile" else "gcs")
    url = f"{kind[:2]}://{BUCKET}/{PREFIX}"
    ds = ChunkedEpisodeDataset(url, batch_size=4, seed=3)
    got = list(ds.dataloader(num_workers=1, multiprocessing_context="spawn"))
    local = ChunkedEpisodeDataset(small, batch_size=4, seed=3)
    assert_same_batches(got, list(local.dataloader(num_workers=1)))
    if kind == "s3-profile":
        assert set(env["s3"].access_keys) == {PROFILE_KEY}
