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

    from robo_resume.items.threads import balanced_runs

    rng = np.random.default_rng(0)
    for _ in range(500):
        sizes = rng.integers(0, 20, size=int(rng.integers(1, 40))).tolist()
        parts = int(rng.integers(1, 6))
        runs = balanced_runs(sizes, parts)
        assert 1 <= len(runs) <= parts
        assert runs[0][0] == 0 and runs[-1][1] == len(sizes)
        assert all(a < b for a, b in runs)
        assert all(x[1] == y[0] for x, y in itertools.pairwise(runs))
        biggest = max(sizes)
        assert all(sum(sizes[a:b]) <= sum(sizes) / len(runs) + 2 * biggest for a, b in runs)
    assert balanced_runs([1] * 32, 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]


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


def test_overlap_decides_per_window_from_the_consumers_share():
    from robo_resume.stream.group_read import Overlap

    fixed = Overlap(adaptive=False)
    for _ in range(3 * Overlap.WINDOW):
        fixed.batch(0.0, 1.0)
    assert fixed.on  # large frames (several decoding threads): always ahead
    o = Overlap(adaptive=True)
    assert o.on  # until the first window is seen
    for k in range(Overlap.WINDOW):
        assert o.on, k  # no decision inside a window
        o.batch(0.01, 1.0)  # the consumer takes 1% of the time: a loop doing nothing
    assert not o.on
    for _ in range(Overlap.WINDOW - 1):
        o.batch(0.9, 1.0)
    assert not o.on
    o.batch(0.9, 1.0)  # a training step between batches
    assert o.on
    for _ in range(Overlap.WINDOW):
        o.batch(0.1, 1.0)
    assert not o.on
    for k in range(Overlap.WINDOW):  # one long pause (a checkpoint) in a loop doing nothing
        o.batch(30.0 if k == 3 else 0.001, 30.0 if k == 3 else 0.01)
    assert not o.on


@pytest.mark.parametrize("step", [0.0, 0.05])
def test_one_thread_reads_ahead_only_while_the_consumer_works(factory, monkeypatch, step):
    """Small frames (one decoding thread), num_workers=0: after the first window of batches,
    blocks are read in the background when the loop spends time between batches (a training
    step, here a 50 ms sleep) and on the calling thread when it does nothing else. Reads are
    slowed to 5 ms so that the loop's own time is a small share either way."""
    import time

    from robo_resume.stream.group_read import GroupRead

    root = factory(episode_lengths=(60, 70), num_cameras=1).root
    plan, read, seen = GroupRead._plan, GroupRead._read, []

    def recording_plan(self, i, background):
        seen.append(background)
        return plan(self, i, background)

    def slow_read(self, job):
        time.sleep(0.005)
        return read(self, job)

    monkeypatch.setattr(GroupRead, "_plan", recording_plan)
    monkeypatch.setattr(GroupRead, "_read", slow_read)

    def make():
        return ChunkedEpisodeDataset(
            root, batch_size=4, chunk_frames=16, infinite=True, tuning=StreamTuning.fast()
        )

    ds = make()
    it = iter(ds.dataloader(num_workers=0))
    got = []
    for _ in range(24):
        got.append(next(it))
        time.sleep(step)
    assert ds.items.camera_threads == 1
    later = seen[12:]  # planned after the first window's decision (8 batches, a block each)
    assert later and all(b == (step > 0) for b in later), seen
    ref = list(itertools.islice(make().dataloader(num_workers=1), 24))  # reads no block ahead
    cursor = "robo_resume_cursor"  # (rank, role, num_workers, epoch, position): 0 vs 1 worker
    _same(
        [{k: v for k, v in b.items() if k != cursor} for b in got],
        [{k: v for k, v in b.items() if k != cursor} for b in ref],
    )
