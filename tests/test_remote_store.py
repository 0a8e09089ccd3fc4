"""robo_resume.remote against loopback servers: plain HTTP, a Hub endpoint, S3 (moto).

Every test that reads runs once per kind (http, hf, s3) on a small factory dataset; open50 is
served over HTTP in place. The servers (tests/remote_servers.py) inject the faults and count
the requests and bytes they served, which is what the assertions on traffic read.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import moto  # noqa: F401 - the dev extra installs it: a missing one fails, never skips
import obstore  # noqa: F401
import pytest
from remote_servers import COMMIT, FolderServer, HubServer, S3Server, port_refuses

from robo_resume.errors import (
    MissingFileError,
    RemoteChangedError,
    RemotePathError,
    RemoteReadError,
)
from robo_resume.format.metadata import load_metadata
from robo_resume.remote import RetryPolicy, fetch_meta, open_store
from robo_resume.remote.store import merge_ranges, redact_url, safe_path

HF_TOKEN = "hf_loopbackSECRETtoken123"
AWS_SECRET = "awsLoopbackSECRETkey456"
BUCKET = "bucket"
KINDS = ["http", "hf", "s3"]
FAST = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1, timeout=10)


@pytest.fixture(scope="module")
def small(factory) -> Path:
    """A v3.0 factory dataset with two episodes per file (three data files, three mp4s)."""
    return factory(episode_lengths=(23, 41, 17, 30, 9), episodes_per_file=2, files_per_chunk=1).root


@pytest.fixture(scope="module")
def servers(small):
    """The three servers on ``small`` for this module; stopped afterwards whatever happens."""
    started = []
    try:
        http = FolderServer(small).start()
        started.append(http)
        hub = HubServer(small, token=HF_TOKEN).start()
        started.append(hub)
        s3 = S3Server().start()
        started.append(s3)
        s3.upload(small, BUCKET, "datasets/small")
        yield {"http": http, "hf": hub, "s3": s3}
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def env(monkeypatch, servers):
    """Where the clients find the servers and (dummy) credentials."""
    monkeypatch.setenv("HF_ENDPOINT", servers["hf"].url)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", servers["s3"].url)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for server in servers.values():
        server.faults.clear()
    yield servers
    for server in servers.values():
        server.faults.clear()


def url_of(kind: str, servers) -> str:
    return {
        "http": servers["http"].url,
        "hf": "hf://datasets/org/ds",
        "s3": f"s3://{BUCKET}/datasets/small",
    }[kind]


def change(kind: str, servers, path: str, data: bytes) -> None:
    """Serve ``data`` at ``path`` from now on (other size and ETag)."""
    if kind == "s3":
        servers["s3"].put(BUCKET, f"datasets/small/{path}", data)
    else:
        servers[kind].faults.changed[path] = data


VIDEO = "videos/observation.images.cam0/chunk-000/file-000.mp4"
PARQUET = "data/chunk-001/file-000.parquet"


@pytest.mark.parametrize("kind", KINDS)
def test_ranges_equal_the_local_bytes(kind, env, small):
    store = open_store(url_of(kind, env))
    faults = env[kind].faults
    video = (small / VIDEO).read_bytes()
    assert store.head(VIDEO).size == len(video)
    assert store.get_range(VIDEO, 100, 1100) == video[100:1100]
    ranges = [(len(video) - 50, len(video)), (0, 32), (40, 90), (10, 20)]
    assert store.get_ranges(VIDEO, ranges) == [video[s:e] for s, e in ranges]
    assert store.get(PARQUET) == (small / PARQUET).read_bytes()
    # the four nearby ranges went as one request of the span they cover
    spans = merge_ranges(ranges)
    assert spans == [(0, len(video))]
    assert faults.sent(VIDEO) == 1000 + len(video)
    assert faults.count("GET", VIDEO) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_meta_is_fetched_once_and_reads_like_the_local_dataset(kind, env, small, tmp_path):
    url = url_of(kind, env)
    first = fetch_meta(url, cache_dir=tmp_path)
    assert first.fetched
    assert sorted(first.manifest) == sorted(
        p.relative_to(small).as_posix() for p in (small / "meta").rglob("*") if p.is_file()
    )
    if kind == "hf":
        assert first.key == COMMIT
    faults = env[kind].faults
    faults.clear()
    second = fetch_meta(url, cache_dir=tmp_path)
    assert not second.fetched and second.root == first.root and second.manifest == first.manifest
    assert faults.count("GET", "/info.json") + faults.count("GET", ".parquet") == 0
    assert sum(faults.requests.values()) == 1  # the validation only: HEAD info.json or the sha
    remote, local = load_metadata(second.root), load_metadata(small)
    assert remote.fingerprint() == local.fingerprint()
    assert remote.tasks == local.tasks and remote.info == local.info
    assert remote.columns.dataset_from_index.tolist() == local.columns.dataset_from_index.tolist()


def test_v21_meta_over_http_is_probed_by_name(factory, tmp_path):
    root = factory(version="v2.1", episode_lengths=(5, 8, 3), files_per_chunk=2).root
    server = FolderServer(root).start()
    try:
        cache = fetch_meta(server.url, cache_dir=tmp_path)
    finally:
        server.stop()
    assert load_metadata(cache.root).fingerprint() == load_metadata(root).fingerprint()
    assert "meta/episodes.jsonl" in cache.manifest


def test_open50_over_http(open50, tmp_path):
    server = FolderServer(open50).start()
    try:
        cache = fetch_meta(server.url, cache_dir=tmp_path)
        store = open_store(server.url, expected=cache.manifest)
        mp4 = next(iter(sorted((open50 / "videos").rglob("*.mp4"))))
        rel = mp4.relative_to(open50).as_posix()
        local = mp4.read_bytes()
        got = store.get_ranges(rel, [(0, 65536), (len(local) - (1 << 20), len(local))])
        assert got == [local[:65536], local[-(1 << 20) :]]
    finally:
        server.stop()
    assert load_metadata(cache.root).fingerprint() == load_metadata(open50).fingerprint()
    assert load_metadata(cache.root).num_episodes == 50


@pytest.mark.parametrize("kind", KINDS)
def test_5xx_twice_is_retried(kind, env, small):
    store = open_store(url_of(kind, env), policy=FAST)
    faults = env[kind].faults
    faults.fail_next = 2
    assert store.get_range(VIDEO, 5, 500) == (small / VIDEO).read_bytes()[5:500]
    assert faults.count("GET", VIDEO) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_5xx_forever_ends_in_remote_read_error(kind, env):
    store = open_store(url_of(kind, env))  # the default policy: 5 attempts, about 1.5 s
    faults = env[kind].faults
    faults.fail_next = 10_000
    started = time.monotonic()
    with pytest.raises(RemoteReadError, match=r"after 5 attempt\(s\).*503.*bytes 10-20") as info:
        store.get_range(VIDEO, 10, 20)
    assert time.monotonic() - started < 10
    assert faults.count("GET", VIDEO) == 5
    assert VIDEO in str(info.value) and "Fix:" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_reset_mid_range_is_retried(kind, env, small):
    store = open_store(url_of(kind, env), policy=FAST)
    faults = env[kind].faults
    faults.reset_next = 1
    video = (small / VIDEO).read_bytes()
    assert store.get_range(VIDEO, 0, len(video)) == video
    assert faults.count("GET", VIDEO) == 2
    assert faults.sent(VIDEO) == len(video) // 2 + len(video)


@pytest.mark.parametrize("kind", KINDS)
def test_a_short_body_is_retried_never_returned(kind, env, small):
    store = open_store(url_of(kind, env), policy=FAST)
    faults = env[kind].faults
    faults.truncate_next = 1
    assert store.get_range(VIDEO, 0, 1000) == (small / VIDEO).read_bytes()[:1000]
    assert faults.count("GET", VIDEO) == 2
    faults.truncate_next = 100
    with pytest.raises(RemoteReadError, match=r"short read: got 500 of 1000 bytes"):
        store.get_range(VIDEO, 0, 1000)


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_is_retried_then_reported(kind, env, small):
    store = open_store(
        url_of(kind, env), policy=RetryPolicy(attempts=2, first_delay=0.05, timeout=0.3)
    )
    faults = env[kind].faults
    faults.stall_next, faults.stall = 1, 1.0
    assert store.get_range(VIDEO, 0, 64) == (small / VIDEO).read_bytes()[:64]
    assert faults.count("GET", VIDEO) == 2
    faults.stall_next = 2
    started = time.monotonic()
    with pytest.raises(
        RemoteReadError, match=r"after 2 attempt\(s\).*timed out after 0.3 s"
    ) as info:
        store.get_range(VIDEO, 0, 64)
    assert time.monotonic() - started < 3
    assert "bytes 0-64" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_range_past_the_end_is_an_error_not_short_data(kind, env, small):
    store = open_store(url_of(kind, env), policy=FAST)
    size = (small / VIDEO).stat().st_size
    with pytest.raises(RemoteReadError, match=rf"past the end.*the file has {size} bytes"):
        store.get_range(VIDEO, size - 10, size + 10)


@pytest.mark.parametrize("kind", KINDS)
def test_slow_server_still_gives_the_bytes(kind, env, small):
    store = open_store(url_of(kind, env))
    faults = env[kind].faults
    faults.latency, faults.bandwidth = 0.1, 1e6
    video = (small / VIDEO).read_bytes()
    started = time.monotonic()
    assert store.get_ranges(VIDEO, [(0, 100), (len(video) - 10, len(video))]) == [
        video[:100],
        video[-10:],
    ]
    assert time.monotonic() - started >= 0.1 + len(video) / 1e6 * 0.9


@pytest.mark.parametrize("kind", KINDS)
def test_a_changed_file_raises_remote_changed_error(kind, env, small):
    store = open_store(url_of(kind, env))
    original = (small / PARQUET).read_bytes()
    assert store.get_range(PARQUET, 0, 4) == original[:4]
    try:
        change(kind, env, PARQUET, original + b"appended")
        with pytest.raises(RemoteChangedError, match=rf"Expected size {len(original)}, ETag .*"):
            store.get_range(PARQUET, 0, 4)
    finally:
        change(kind, env, PARQUET, original)


@pytest.mark.parametrize("kind", KINDS)
def test_the_manifest_pins_meta_files(kind, env, small, tmp_path):
    cache = fetch_meta(url_of(kind, env), cache_dir=tmp_path)
    store = open_store(url_of(kind, env), expected=cache.manifest)
    path = "meta/tasks.parquet"
    original = (small / path).read_bytes()
    try:
        change(kind, env, path, original[:-1])
        with pytest.raises(RemoteChangedError, match=r"pin a revision .* clear the metadata cache"):
            store.get(path)
    finally:
        change(kind, env, path, original)


@pytest.mark.parametrize("kind", KINDS)
def test_secrets_never_appear_in_messages(kind, env):
    store = open_store(url_of(kind, env), policy=FAST)
    faults = env[kind].faults
    texts = [repr(store), store.url]
    faults.fail_next = 10_000
    with pytest.raises(RemoteReadError) as failed:
        store.get_range(VIDEO, 0, 10)
    faults.clear()
    with pytest.raises(MissingFileError) as missing:
        store.get("meta/none.json")
    texts += [str(failed.value), str(missing.value)]
    for text in texts:
        assert HF_TOKEN not in text and AWS_SECRET not in text, text


def test_wrong_hub_token_is_denied_without_showing_it(env, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrongSECRETvalue")
    with pytest.raises(RemoteReadError, match=r"Hub API failed resolving revision") as info:
        open_store("hf://datasets/org/ds", policy=FAST)
    assert "hf_wrongSECRETvalue" not in str(info.value)
    assert env["hf"].faults.count("GET", "api/info/main") == 1  # a 401 is not retried


def test_credentials_in_a_url_are_redacted(env):
    server = env["http"]
    url = server.url.replace("http://", "http://user:pw-SECRET@") + "/?sig=tok-SECRET"
    assert redact_url(url) == server.url + "/"
    store = open_store(server.url.replace("http://", "http://user:pw-SECRET@"), policy=FAST)
    server.faults.fail_next = 10_000
    with pytest.raises(RemoteReadError) as info:
        store.get("meta/info.json")
    assert "SECRET" not in str(info.value) + repr(store)


@pytest.mark.parametrize(
    "path", ["../secret", "meta/../../x", "/etc/passwd", "meta\\info.json", "C:/x", "a//b", ""]
)
def test_paths_that_leave_the_root_are_refused(path, env):
    with pytest.raises(RemotePathError, match="could leave the dataset root"):
        safe_path(path)
    store = open_store(env["http"].url)
    with pytest.raises(RemotePathError):
        store.get(path)
    assert sum(env["http"].faults.requests.values()) == 0  # refused before any request


def test_a_listing_that_leaves_the_root_is_refused(env, tmp_path):
    env["hf"].extra_tree_paths = ["meta/../../../home/evil"]
    try:
        with pytest.raises(RemotePathError, match=r"Found 'meta/../../../home/evil'"):
            fetch_meta("hf://datasets/org/ds", cache_dir=tmp_path)
    finally:
        env["hf"].extra_tree_paths = []
    assert not list(tmp_path.rglob("evil"))


def test_a_revision_is_pinned_to_its_commit(env, tmp_path):
    by_branch = fetch_meta("hf://datasets/org/ds", revision="main", cache_dir=tmp_path)
    by_commit = fetch_meta(f"hf://datasets/org/ds@{COMMIT}", cache_dir=tmp_path)
    assert by_branch.key == by_commit.key == COMMIT
    assert by_branch.fetched and not by_commit.fetched  # one cache folder per commit
    assert f"/resolve/{COMMIT}" in open_store("hf://datasets/org/ds").url


def test_unknown_revision_names_the_repo(env):
    with pytest.raises(RemoteReadError, match=r"revision 'nope'.*org/ds"):
        open_store("hf://datasets/org/ds@nope", policy=FAST)


def test_merge_ranges_and_delays():
    assert merge_ranges([(10, 20), (0, 5), (5, 5), (15, 30)], gap=0) == [(0, 5), (10, 30)]
    assert merge_ranges([(0, 5), (6, 8)], gap=2) == [(0, 8)]
    with pytest.raises(ValueError):
        merge_ranges([(5, 4)])
    assert RetryPolicy().delays() == [0.1, 0.2, 0.4, 0.8]
    assert RetryPolicy(attempts=6, max_delay=1.0).delays()[-2:] == [0.8, 1.0]


@pytest.mark.parametrize("make", ["http", "hf", "s3"])
def test_servers_stop_and_free_their_ports(make, small):
    threads = set(threading.enumerate())
    server = {"http": lambda: FolderServer(small), "hf": lambda: HubServer(small), "s3": S3Server}[
        make
    ]().start()
    ports = [server.port] + ([server.moto_port] if isinstance(server, S3Server) else [])
    assert not any(port_refuses(p) for p in ports)
    server.stop()
    assert all(port_refuses(p) for p in ports)
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(threading.enumerate()) - threads
