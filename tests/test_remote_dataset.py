"""ChunkedEpisodeDataset on a remote URL: the same batches as the local folder, resumable.

The dataset is served by the loopback servers of tests/remote_servers.py (plain HTTP, a Hub
endpoint, moto's S3); every test compares with the same dataset read from its local folder.
open50 (a real published dataset, mpeg4 with a keyframe every 12 frames, so its chunks are cut
at keyframes from the mp4 index) is served over HTTP in place.
"""

from __future__ import annotations

import moto  # noqa: F401 - the dev extra installs it: a missing one fails, never skips
import obstore  # noqa: F401
import pytest
from remote_servers import FolderServer, HubServer, S3Server
from test_batches import assert_same_batches, assert_same_streams

from robo_resume import (
    ChunkedEpisodeDataset,
    MissingFileError,
    WorkerStartError,
    readable_episodes,
)
from robo_resume.dataset import SKIPPED_KEY
from robo_resume.remote.files import RemoteFiles, is_remote

BUCKET = "bucket"
KINDS = ["http", "hf", "s3"]


@pytest.fixture(scope="module")
def small(factory):
    """Two cameras, five episodes, two episodes per file (three data files and mp4s each)."""
    return factory(episode_lengths=(23, 41, 17, 30, 9), episodes_per_file=2, num_cameras=2).root


@pytest.fixture(scope="module")
def servers(small):
    started = []
    try:
        for server in (FolderServer(small), HubServer(small), S3Server()):
            started.append(server.start())
        started[2].upload(small, BUCKET, "datasets/small")
        yield dict(zip(KINDS, started, strict=True))
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def env(monkeypatch, servers, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", servers["hf"].url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", servers["s3"].url)
    monkeypatch.setenv("ROBO_RESUME_CACHE", str(tmp_path / "cache"))
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


def batches(root, num_workers=0, context=None, **kw):
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=3, **kw)
    loader_kw = {"multiprocessing_context": context} if context else {}
    return list(ds.dataloader(num_workers=num_workers, **loader_kw))


@pytest.mark.parametrize("kind", KINDS)
def test_remote_batches_equal_the_local_ones(kind, env, small):
    url = url_of(kind, env)
    assert is_remote(url) and not is_remote(str(small)) and not is_remote(small)
    ds = ChunkedEpisodeDataset(url, batch_size=4, seed=3)
    assert isinstance(ds.meta.files, RemoteFiles)
    assert (
        ds.meta.files.where(ds.meta.root / "data/x.parquet") == f"{url.rstrip('/')}/data/x.parquet"
    )
    assert_same_batches(list(ds.dataloader(num_workers=0)), batches(small))
    served = env[kind].faults
    assert served.count("GET") > 0  # the frames came over the wire


def test_remote_with_workers_and_windows(env, small):
    delta = {"observation.images.cam0": [-0.2, 0.0], "action": [0.0, 0.1, 0.2]}
    url = url_of("http", env)
    ours = batches(url, num_workers=2, delta_timestamps=delta)
    assert_same_batches(ours, batches(small, num_workers=2, delta_timestamps=delta))


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_a_resume_on_the_remote_dataset_continues_the_local_run(kind, env, small):
    """A state saved while streaming the local folder resumes on the remote URL, elastically
    (2 workers -> 1): the state's fingerprint is the dataset's content, not where it is read."""
    local = ChunkedEpisodeDataset(small, batch_size=4, seed=3)
    tracker = local.tracker()
    for k, b in enumerate(local.dataloader(num_workers=2)):
        tracker.consume(b)
        if k == 6:
            break
    state = tracker.state_dict()
    rest_local = batches(small, num_workers=1, resume_state=state)
    assert rest_local
    # spawn: a worker of this test's environment (AWS_* set by monkeypatch); the forkserver
    # of robo_resume.worker_context(), if an earlier test started it, has the environment of then
    remote = batches(url_of(kind, env), num_workers=1, context="spawn", resume_state=state)
    assert_same_batches(remote, rest_local)


def test_transient_failures_are_retried_and_the_batches_stay_the_same(env, small):
    url = url_of("http", env)
    faults = env["http"].faults
    faults.fail_next, faults.reset_next = 2, 1  # two 503s, then a reset mid-body
    ds = ChunkedEpisodeDataset(url, batch_size=4, seed=3)
    injected, got = 3, []
    for i, b in enumerate(ds.dataloader(num_workers=0)):
        if i in (2, 5):
            injected += 2 - faults.fail_next  # what is left of the last ones is not injected
            faults.fail_next = 2
        got.append(b)
    assert_same_batches(got, batches(small))
    consumed = injected - faults.fail_next - faults.reset_next
    assert consumed >= 3, (injected, faults.fail_next, faults.reset_next)


def test_a_missing_remote_file_names_its_url(env, small, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(small, copy)
    (copy / "videos/observation.images.cam1/chunk-000/file-001.mp4").unlink()
    server = FolderServer(copy).start()
    try:
        with pytest.raises(MissingFileError) as err:
            batches(server.url)
        text = str(err.value)
        assert f"{server.url}/videos/observation.images.cam1/chunk-000/file-001.mp4" in text
        assert "episode" in text
        # the library's answers work as for the local copy: readable episodes, on_error="skip"
        assert readable_episodes(server.url) == readable_episodes(copy) == (0, 1, 4)
        ours, theirs = batches(server.url, on_error="skip"), batches(copy, on_error="skip")
        for a, b in zip(ours, theirs, strict=True):  # skip records name the URL, not the path
            for rec in a.get(SKIPPED_KEY, []):
                assert rec.pop("file").startswith(server.url) and server.url in rec.pop("error")
            for rec in b.get(SKIPPED_KEY, []):
                rec.pop("file"), rec.pop("error")
        assert_same_batches(ours, theirs)
        assert any(b.get(SKIPPED_KEY) for b in theirs)
    finally:
        server.stop()


def test_open50_over_http_equals_the_local_copy_and_reports_traffic(open50):
    server = FolderServer(open50).start()
    try:
        eps = [0, 3]  # episodes whose mp4s exist (open50 lacks some); more: test_remote_plan
        kw = dict(episodes=eps, batch_size=8, seed=1)
        remote = ChunkedEpisodeDataset(server.url, **kw)
        local = ChunkedEpisodeDataset(open50, **kw)
        assert_same_streams(remote.dataloader(num_workers=0), local.dataloader(num_workers=0))
        stats = remote.meta.files.stats
        sizes = sum(
            (open50 / remote.meta.episode(e).videos["image"].path).stat().st_size for e in eps
        )
        print(
            f"open50 episodes {eps}: {stats.requests} requests, {stats.fetched_bytes} bytes "
            f"fetched for mp4s of {sizes} bytes"
        )
        assert stats.fetched_bytes > 0 and server.faults.count("GET") >= stats.requests
    finally:
        server.stop()


def test_forked_workers_are_refused_with_the_fix(env):
    """obstore's runtime does not survive a fork (forked workers hang): refused, and the
    default start method of a remote dataset's workers is a forkserver."""
    ds = ChunkedEpisodeDataset(url_of("http", env), batch_size=4, seed=3)
    with pytest.raises(WorkerStartError) as err:
        next(iter(ds.dataloader(num_workers=1, multiprocessing_context="fork")))
    text = str(err.value)
    assert "The DataLoader workers of a remote dataset cannot be forked" in text
    assert f"At file {env['http'].url}." in text
    assert "drop multiprocessing_context=, or pass multiprocessing_context=robo_resume." in text
    import robo_resume.dataset as module

    default = module.WORKER_START_METHOD
    module.WORKER_START_METHOD = None  # the library default (the tests set a forkserver)
    try:
        loader = ds.dataloader(num_workers=1)
    finally:
        module.WORKER_START_METHOD = default
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
