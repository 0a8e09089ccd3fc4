"""The chunks of a batch decoded on several threads (num_workers=0) give the same batches."""

from __future__ import annotations

import itertools

import pytest
import torch

from robo_resume import ChunkedEpisodeDataset, StreamTuning


def _batches(root, threads: int, n: int = 12, **kw) -> list[dict]:
    ds = ChunkedEpisodeDataset(
        root,
        batch_size=8,
        chunk_frames=8,
        seed=5,
        infinite=True,
        tuning=StreamTuning(camera_threads=threads, interleave=6),
        **kw,
    )
    return list(itertools.islice(ds.dataloader(num_workers=0), n))


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


@pytest.mark.parametrize("cameras", [1, 2])
@pytest.mark.parametrize("delta", [False, True])
def test_threads_give_the_batches_of_one_thread(factory, cameras, delta):
    ds = factory(num_cameras=cameras, episode_lengths=(30, 21, 40, 17, 26), gop=4, codec="h264")
    kw = {}
    if delta:
        cams = [f"observation.images.cam{i}" for i in range(cameras)]
        kw["delta_timestamps"] = {c: [-2 / ds.fps, 0.0] for c in cams}
        kw["delta_timestamps"]["action"] = [0.0, 1 / ds.fps, 2 / ds.fps]
    one = _batches(ds.root, 1, image_dtype="uint8", **kw)
    _same(one, _batches(ds.root, 2, image_dtype="uint8", **kw))
    _same(one, _batches(ds.root, 4, image_dtype="uint8", **kw))
    # the batches really hold several chunks (what the threads split)
    assert max(len(set(b["episode_index"].tolist())) for b in one) >= 3


@pytest.mark.parametrize(
    ("size", "cameras", "threads"),
    [((48, 64), 2, 1), ((96, 96), 2, 1), ((128, 128), 1, 2), ((128, 128), 3, 3)],
)
def test_default_threads_follow_the_frame_size(factory, size, cameras, threads, monkeypatch):
    """num_workers=0: one thread below 128x128-pixel frames (small frames lose more to GIL
    hand-offs than a second thread gives), from there one per camera and at least 2."""
    import robo_resume.stream.reading as reading

    monkeypatch.setattr(reading, "_cores", lambda: 2)
    h, w = size
    ds = factory(num_cameras=cameras, episode_lengths=(20, 20), height=h, width=w)
    data = ChunkedEpisodeDataset(ds.root, batch_size=4, chunk_frames=8)
    next(iter(data.dataloader(num_workers=0)))
    assert data.items.camera_threads == threads


def test_balanced_runs_cover_the_jobs_in_order():
    # the runs handed to the decoding threads: consecutive, non-empty, every job once, at most
    # `parts` of them, and not lopsided (none past its share by more than one job)
    import numpy as np

    from robo_resume.items.threads import _balanced_runs

    rng = np.random.default_rng(0)
    for _ in range(500):
        sizes = rng.integers(0, 20, size=int(rng.integers(1, 40))).tolist()
        parts = int(rng.integers(1, 6))
        runs = _balanced_runs(sizes, parts)
        assert 1 <= len(runs) <= parts
        assert runs[0][0] == 0 and runs[-1][1] == len(sizes)
        assert all(a < b for a, b in runs)
        assert all(x[1] == y[0] for x, y in itertools.pairwise(runs))
        biggest = max(sizes)
        assert all(sum(sizes[a:b]) <= sum(sizes) / len(runs) + 2 * biggest for a, b in runs)
    assert _balanced_runs([1] * 32, 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]


@pytest.mark.parametrize("threads", [1, 2])
def test_an_abandoned_iterator_closes_its_readers_after_the_reads_in_flight(
    factory, monkeypatch, threads
):
    """A 0-worker stream reads its next block in the background; an iterator dropped in the
    middle of a group (here: with a slow read in flight) waits for that read to end before it
    closes the chunks' readers, so no decoder is closed under a read that still uses it."""
    import gc
    import threading
    import time

    from robo_resume.items.ranges import EpisodeRangeReader
    from robo_resume.stream.group_read import GroupRead

    root = factory(episode_lengths=(40, 36, 44), num_cameras=2).root
    lock, running, events = threading.Lock(), [0], []
    read, close = GroupRead._read, EpisodeRangeReader.close

    def slow_read(self, job):
        with lock:
            running[0] += 1
        try:
            time.sleep(0.2)
            return read(self, job)
        finally:
            with lock:
                running[0] -= 1

    def checked_close(self):
        with lock:
            events.append(running[0])  # reads still running when a reader closes
        return close(self)

    monkeypatch.setattr(GroupRead, "_read", slow_read)
    monkeypatch.setattr(EpisodeRangeReader, "close", checked_close)
    ds = ChunkedEpisodeDataset(
        root,
        batch_size=4,
        chunk_frames=12,
        infinite=True,
        tuning=StreamTuning(camera_threads=threads, interleave=3),
    )
    it = iter(ds.dataloader(num_workers=0))
    next(it)
    next(it)  # the next block's reads now run in the background
    assert running[0] > 0, "no read in flight: the test would not test the wait"
    del it  # the stream's generator is closed here (its finally waits, then closes)
    gc.collect()
    assert events, "the abandoned iterator closed no reader"
    assert events == [0] * len(events), f"readers closed with reads still running: {events}"
