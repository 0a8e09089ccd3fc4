"""Remote datasets under faults: files replaced between runs, reads that fail for good, slow links.

- A data or video file replaced on the server (same size and other bytes, or another size)
  under the same ``meta/info.json`` is refused by a later run, naming the file, both versions,
  when the first was recorded, and the fix (robo_resume/remote/ledger.py); unchanged files pass.
- A read that fails after the store's retries (503 on every attempt) inside a DataLoader worker
  ends in an error naming the URL, the episode and the frames, after batches equal to the local
  folder's (never wrong frames).
- A slow server (100 ms a request, 1 MB/s) gives the local folder's batches; a request stalled
  past the client's timeout is retried.

The servers are tests/remote_servers.py's (FolderServer, S3Server on moto), stopped by the
fixtures that start them.
"""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import moto  # noqa: F401 - the dev extra installs it: a missing one fails, never skips
import obstore  # noqa: F401
import pytest
from remote_servers import FolderServer, S3Server, etag_of
from test_batches import assert_same_batches

from robo_resume import ChunkedEpisodeDataset, StreamTuning
from robo_resume.errors import RemoteChangedError, RemoteReadError
from robo_resume.remote import ObjectInfo, RetryPolicy
from robo_resume.remote.files import remote_meta
from robo_resume.remote.ledger import LEDGER, FileLedger

LENGTHS = (23, 41, 17, 30, 9)  # two episodes per file: files 000 (0, 1), 001 (2, 3), 002 (4)
CAM = "observation.images.cam0"
VIDEO = f"videos/{CAM}/chunk-000/file-001.mp4"  # episodes 2 and 3
DATA = "data/chunk-000/file-001.parquet"
FAST = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1, timeout=10)


@pytest.fixture(scope="module")
def small(factory) -> Path:
    return factory(episode_lengths=LENGTHS, episodes_per_file=2, num_cameras=1).root


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def env(monkeypatch, tmp_path, s3):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    monkeypatch.setenv("ROBO_RESUME_CACHE", str(tmp_path / "cache"))
    s3.faults.clear()
    yield
    s3.faults.clear()


def batches(root, num_workers=0, context=None, **kw):
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=3, **kw)
    loader_kw = {"multiprocessing_context": context} if context else {}
    return list(ds.dataloader(num_workers=num_workers, **loader_kw))


# ------------------------------------------------------------ a file replaced between runs


class Served:
    """One copy of the dataset on one server: its URL, and how to replace a file there."""

    def __init__(self, kind: str, small: Path, tmp_path: Path, s3: S3Server):
        self.kind = kind
        if kind == "http":
            self.folder = tmp_path / "served"
            shutil.copytree(small, self.folder)
            self.server = FolderServer(self.folder).start()
            self.url = self.server.url
        else:
            self.bucket = f"b-{tmp_path.name.lower().replace('_', '-')}"[:60]
            s3.upload(small, self.bucket, "ds")
            self.s3, self.url = s3, f"s3://{self.bucket}/ds"

    def replace(self, rel: str, data: bytes) -> None:
        if self.kind == "http":
            (self.folder / rel).write_bytes(data)
        else:
            self.s3.put(self.bucket, f"ds/{rel}", data)

    def stop(self) -> None:
        if self.kind == "http":
            self.server.stop()


@pytest.fixture
def served(request, small, tmp_path, s3, env):
    copy = Served(request.param, small, tmp_path, s3)
    try:
        yield copy
    finally:
        copy.stop()


@pytest.mark.parametrize(
    ("served", "rel", "change"),
    [
        ("http", VIDEO, "same size"),
        ("http", VIDEO, "other size"),
        ("http", DATA, "same size"),
        ("http", DATA, "other size"),
        ("s3", VIDEO, "same size"),
        ("s3", DATA, "other size"),
    ],
    indirect=["served"],
)
def test_a_file_replaced_on_the_server_between_runs_is_refused(served, small, rel, change):
    # the first run: two workers (processes of their own) HEAD and read every file
    context = "spawn" if served.kind == "s3" else None  # spawn: workers get this env's AWS_*
    first = batches(served.url, num_workers=2, context=context)
    assert_same_batches(first, batches(small, num_workers=2))
    old = (small / rel).read_bytes()
    new = bytes([old[0] ^ 0xFF]) + old[1:] if change == "same size" else old + b"\0" * 64
    served.replace(rel, new)
    folder = remote_meta(served.url).files.root  # the metadata cache folder of this version
    recorded = FileLedger(folder, served.url).recorded(rel)
    assert recorded is not None and recorded["size"] == len(old)

    # a later run (a new dataset object: a fresh store and block cache) refuses the file
    with pytest.raises(RemoteChangedError) as err:
        batches(served.url)
    text = str(err.value)
    assert text.startswith("A remote file changed on the server since a run first read it.")
    assert f"Expected size {len(old)}, ETag {etag_of(old)} (recorded {recorded['recorded']})" in (
        text
    )
    assert re.search(r"\(recorded \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", text)
    assert f"Found size {len(new)}, ETag {etag_of(new)}." in text
    assert f"At file {served.url}/{rel}" in text
    assert "a resume state is not exact across that change" in text
    assert f"remove the cache folder {folder} to accept the new version" in text
    # the files not replaced pass: the episodes of file 000 read as before
    assert_same_batches(batches(served.url, episodes=[0, 1]), batches(small, episodes=[0, 1]))
    # the fix works: without the cache folder, the new version is recorded and read
    shutil.rmtree(folder)
    files = remote_meta(served.url).files
    assert files.info(files.root / rel) == ObjectInfo(rel, len(new), etag_of(new))
    assert FileLedger(files.root, served.url).recorded(rel)["size"] == len(new)


@pytest.mark.parametrize("served", ["http", "s3"], indirect=True)
def test_an_unchanged_dataset_reads_again_with_its_ledger(served, small):
    assert_same_batches(batches(served.url), batches(small))
    folder = remote_meta(served.url).files.root
    assert len(list((folder / LEDGER).glob("*.json"))) == 6  # three parquets, three mp4s
    assert_same_batches(batches(served.url), batches(small))


def test_the_first_of_concurrent_writers_wins(tmp_path):
    """Eight threads record eight versions of one file at once: one record, kept by all."""
    ledger = FileLedger(tmp_path, "https://user:SECRET@host/ds?token=SECRET2")
    start = threading.Barrier(8)
    outcome: dict[int, str] = {}

    def record(i: int) -> None:
        start.wait()
        try:
            ledger.check(ObjectInfo("videos/a.mp4", 100, f'"etag{i}"'))
            outcome[i] = "kept"
        except RemoteChangedError as exc:
            outcome[i] = str(exc)

    threads = [threading.Thread(target=record, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = [i for i, o in outcome.items() if o == "kept"]
    assert len(kept) == 1, outcome
    winner = ledger.recorded("videos/a.mp4")
    assert winner is not None and winner["etag"] == f'"etag{kept[0]}"'
    refused = [o for o in outcome.values() if o != "kept"]
    assert all(f'Expected size 100, ETag "etag{kept[0]}"' in o for o in refused)
    assert all("At file https://host/ds/videos/a.mp4." in o for o in refused)
    assert not any("SECRET" in o for o in refused)  # credentials and the query string dropped
    assert [p.name for p in (tmp_path / LEDGER).iterdir() if p.name.startswith(".")] == []


# ---------------------------------------------------------------- reads that fail for good


SEQUENTIAL = StreamTuning(interleave=1)  # one chunk at a time: a file is first read mid-epoch


@pytest.fixture(scope="module")
def one_per_file(factory) -> Path:
    """Six episodes, one data file and one mp4 each."""
    return factory(
        episode_lengths=(20, 17, 23, 14, 19, 21), episodes_per_file=1, num_cameras=1
    ).root


@pytest.fixture
def http(one_per_file):
    server = FolderServer(one_per_file).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("kind", "on_error"), [("mp4", "raise"), ("parquet", "raise"), ("mp4", "skip")]
)
def test_a_read_failing_after_the_retries_names_url_episode_and_frames(
    http, one_per_file, env, kind, on_error
):
    """503 on every attempt for one file inside a worker: the error names the URL, the
    episode and the frames, is not skipped, and the batches before it are the local ones."""
    kw = dict(chunk_frames=8, tuning=SEQUENTIAL, on_error=on_error)
    local = batches(one_per_file, num_workers=2, **kw)
    # the episode read last: its file fails, after the batches of the others
    first_use = {}
    for k, b in enumerate(local):
        for e in b["episode_index"].tolist():
            first_use.setdefault(e, k)
    episode = max(first_use, key=first_use.__getitem__)
    name = f"chunk-{episode // 2:03d}/file-{episode % 2:03d}"
    rel = f"videos/{CAM}/{name}.mp4" if kind == "mp4" else f"data/{name}.parquet"
    url = http.url
    meta = remote_meta(url, policy=FAST)
    ds = ChunkedEpisodeDataset(url, batch_size=4, seed=3, meta=meta, **kw)
    http.faults.only, http.faults.fail_status = f"GET {rel}", 503
    http.faults.fail_next = 10**6
    got = []
    with pytest.raises(RemoteReadError) as err:
        for b in ds.dataloader(num_workers=2):
            got.append(b)
    text = str(err.value)
    assert "in DataLoader worker process" in text  # raised in a worker, re-raised here
    last = text.strip().splitlines()[-1]
    assert "Reading a remote file failed after 3 attempt(s)" in last
    assert "503 Service Unavailable" in last
    assert f"At file {url}/{rel} bytes " in last
    found = re.search(
        r"Raised while streaming frames (\d+)\.\.(\d+) of episode (\d+) \(chunk \d+, epoch 0, "
        r"stream position \d+\)\.$",
        last,
    )
    assert found, last
    first, stop, named = map(int, found.groups())
    assert named == episode and 0 <= first <= stop < 23
    assert "on_error='skip'" not in last  # not skipped, and not offered
    assert http.faults.count("GET", rel) >= 3
    assert 0 < len(got) < len(local)
    assert_same_batches(got, local[: len(got)])
    print(
        f"\n{kind} {rel}: {len(got)} of {len(local)} batches (episode {episode} first used in "
        f"batch {first_use[episode]}), then: ...{last[-230:]}"
    )


# ------------------------------------------------------------------------------ slow links


@pytest.fixture(scope="module")
def tiny(factory) -> Path:
    return factory(episode_lengths=(12, 9, 14), episodes_per_file=2, num_cameras=1).root


def test_a_slow_server_gives_the_local_batches(tiny, env):
    server = FolderServer(tiny).start()
    try:
        server.faults.latency, server.faults.bandwidth = 0.1, 1_000_000
        ours = batches(server.url, num_workers=2)
        assert_same_batches(ours, batches(tiny, num_workers=2))
        assert server.faults.count("GET", ".mp4") >= 2 and server.faults.count("GET", ".parquet")
    finally:
        server.stop()


@pytest.mark.parametrize("what", ["GET videos/", "GET data/", "HEAD videos/"])
def test_a_request_stalled_past_the_timeout_is_retried(tiny, env, what):
    server = FolderServer(tiny).start()
    try:
        policy = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1, timeout=0.5)
        ds = ChunkedEpisodeDataset(
            server.url, batch_size=4, seed=3, meta=remote_meta(server.url, policy=policy)
        )
        faults = server.faults
        faults.only, faults.stall, faults.stall_next = what, 1.5, 2
        ours = list(ds.dataloader(num_workers=1))
        assert faults.stall_next == 0  # both stalls happened (and were retried)
        assert_same_batches(ours, batches(tiny, num_workers=1))
        method, prefix = what.split()
        paths = [p for m, p, _ in faults.log if m == method and p.startswith(prefix)]
        assert len(paths) > len(set(paths))  # a stalled request was sent again
    finally:
        server.stop()


def test_a_server_that_stalls_every_attempt_fails_naming_the_timeout_and_episode(tiny, env):
    server = FolderServer(tiny).start()
    try:
        policy = RetryPolicy(attempts=2, first_delay=0.05, max_delay=0.1, timeout=0.5)
        meta = remote_meta(server.url, policy=policy)
        ds = ChunkedEpisodeDataset(server.url, batch_size=4, seed=3, meta=meta)
        server.faults.only, server.faults.stall, server.faults.stall_next = "GET data/", 1.5, 99
        with pytest.raises(RemoteReadError) as err:
            list(ds.dataloader(num_workers=1))
        last = str(err.value).strip().splitlines()[-1]
        assert "failed after 2 attempt(s)" in last
        assert "(the last attempt timed out after 0.5 s)" in last
        assert re.search(rf"At file {server.url}/data/chunk-000/file-00\d\.parquet bytes ", last)
        assert re.search(r"Raised while streaming frames \d+\.\.\d+ of episode \d ", last), last
    finally:
        server.stop()
