"""The epoch's layout is computed once, in the DataLoader's main process, and shared.

``BatchLoader`` calls ``dataset.share_schedule(num_workers)`` before its workers start: forked
workers inherit the layout, spawned ones receive it with the pickled dataset. These tests check
that the workers then never permute the epoch themselves, and that the frames are the same as
without workers and as a fresh (unshared) schedule's, epoch after epoch and after a resume.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from robo_resume import ChunkedEpisodeDataset
from robo_resume.audit import consume
from robo_resume.index.plan import EpisodeSpans, make_chunks
from robo_resume.index.schedule import Schedule, ScheduleConfig, Topology
from robo_resume.testing import make_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("share") / "ds", episode_lengths=(23, 31, 17, 40, 29, 12)
    ).root


def _indices(batches):
    return [b for _, b in batches]


def _no_worker_layout(monkeypatch):
    """Make a worker that computes an epoch layout itself fail (fork workers inherit this)."""
    from torch.utils.data import get_worker_info

    original = Schedule._epoch_layout_uncached

    def guarded(self, epoch):
        if get_worker_info() is not None:
            raise AssertionError(f"a worker computed epoch {epoch}'s layout itself")
        return original(self, epoch)

    monkeypatch.setattr(Schedule, "_epoch_layout_uncached", guarded)


def test_fork_workers_use_the_main_process_layout(root, monkeypatch):
    def make(**k):
        return ChunkedEpisodeDataset(root, batch_size=4, seed=3, chunk_frames=8, **k)

    ds = make()
    sched = ds.schedule(2)
    want = [  # the schedule's own frames, epoch by epoch, stream by stream (nothing shared)
        sorted(np.concatenate([sched.frame_indices(e, g) for g in range(2)]).tolist())
        for e in range(3)
    ]
    _no_worker_layout(monkeypatch)
    shared, _ = consume(
        make, num_workers=2, epochs=3, loader_kwargs={"multiprocessing_context": "fork"}
    )
    got, per_epoch = _indices(shared), len(shared) // 3
    for e in range(3):
        assert sorted(i for b in got[e * per_epoch : (e + 1) * per_epoch] for i in b) == want[e]


def test_fork_workers_share_after_a_resume(root, monkeypatch):
    def make(**k):
        return ChunkedEpisodeDataset(root, batch_size=4, seed=1, chunk_frames=8, **k)

    full, _ = consume(make, num_workers=2, epochs=2)
    before, state = consume(make, num_workers=2, epochs=2, stop_after=9)
    _no_worker_layout(monkeypatch)
    after, _ = consume(
        make,
        num_workers=2,
        epochs=2,
        resume_state=state,
        loader_kwargs={"multiprocessing_context": "fork"},
    )
    assert _indices(before) + _indices(after)[: len(full) - len(before)] == _indices(full)


def test_spawn_workers_receive_the_layout_and_yield_the_same_frames(root):
    def make(**k):
        return ChunkedEpisodeDataset(root, batch_size=4, seed=2, chunk_frames=8, **k)

    fork, _ = consume(make, num_workers=2, epochs=2)
    spawn, _ = consume(
        make, num_workers=2, epochs=2, loader_kwargs={"multiprocessing_context": "spawn"}
    )
    assert _indices(spawn) == _indices(fork)


def test_a_pickled_schedule_carries_the_shared_layout_and_nothing_else():
    lengths = np.array([40, 17, 64, 5, 33] * 20)
    spans = EpisodeSpans(np.arange(100), np.cumsum(lengths) - lengths, lengths)
    sched = Schedule(make_chunks(spans, 8), ScheduleConfig(seed=5, batch_size=4), Topology(2, 3))
    fresh = pickle.loads(pickle.dumps(sched))
    assert fresh._layout is None  # nothing shared yet: nothing carried
    sched.share_epoch(4)
    sched.locate(4, 1, 3)  # per-stream caches are not pickled
    copy = pickle.loads(pickle.dumps(sched))
    assert copy._layout[0] == 4
    for got, want in zip(copy._layout[1], sched._epoch_layout_uncached(4), strict=True):
        assert np.array_equal(got, want) and got.dtype == want.dtype
    assert copy._rows.currsize == 0 and copy.segments.currsize == 0
    for epoch in (4, 5):  # the carried epoch and a later one: the same frames as a fresh one
        for g in range(6):
            want = fresh.frame_indices(epoch, g)
            assert np.array_equal(copy.frame_indices(epoch, g), want)
    assert copy._layout[0] == 5  # one layout at a time


def test_the_dataset_keeps_its_episode_selection_as_an_array(root):
    """``ds.episodes`` is the tuple it always was, but the dataset (and every spawned worker's
    copy of it) holds the selection as one int64 array, not one Python int per episode."""
    ds = ChunkedEpisodeDataset(root, batch_size=4, episodes=[0, 2, 3, 5])
    assert ds.episodes == (0, 2, 3, 5) and isinstance(ds.episodes, tuple)
    assert all(type(e) is int for e in ds.episodes)
    held = [v for v in vars(ds).values() if isinstance(v, tuple | list) and len(v) == 4]
    assert not held, held
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.episodes == ds.episodes and copy.fingerprint == ds.fingerprint


def test_a_mix_shares_each_source_s_layout_with_its_workers(root, tmp_path_factory, monkeypatch):
    """A MixedDataset's loader shares every source's epoch layout too (``exhausted="stop"``:
    each mix epoch plays one epoch of every source), after a resume as well; the frames are the
    ones of a run whose workers computed their layouts themselves."""
    from robo_resume.mix import MixedDataset, MixSource

    other = make_dataset(
        tmp_path_factory.mktemp("share_mix") / "ds", episode_lengths=(19, 27, 12, 33, 21)
    ).root

    def make(**k):
        sources = [MixSource(root, 1), MixSource(other, 2)]
        return MixedDataset(sources, batch_size=4, seed=5, chunk_frames=8, exhausted="stop", **k)

    def run(epochs, stop_after=None, **k):
        mix = make(**k)
        tracker = mix.tracker()
        loader = mix.dataloader(num_workers=2, multiprocessing_context="fork")
        out = []
        for _ in range(epochs):
            for batch in loader:
                out.append(tracker.consume(batch)["index"].tolist())
                if len(out) == stop_after:
                    return out, tracker.state_dict()
        return out, None

    full, _ = run(2)  # workers compute their layouts (nothing guarded yet)
    before, state = run(2, stop_after=len(full) // 2 + 1)
    _no_worker_layout(monkeypatch)
    assert run(2)[0] == full
    after, _ = run(1, resume_state=state)  # the rest of epoch 1
    assert before + after == full
