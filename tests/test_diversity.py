"""Batch diversity with a large ``StreamTuning.interleave``, and the read-ahead it uses.

The default stays ``interleave=4``. A larger interleave opens more chunks per stream, so a
batch mixes more episodes (about as many as uniform random sampling at ``6 * batch_size``);
it keeps every frame exactly once per epoch and resumes exactly. With more open chunks than a
batch has frames, a chunk of small frames decodes a few frames ahead per visit
(stream/read_ahead.py): the batches are the same as read frame by frame; the default interleave
and large frames never read ahead; kept frames stay decoded (YUV) until their batch
(tests/test_read_ahead.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import robo_resume.stream.read_ahead as read_ahead
from robo_resume import ChunkedEpisodeDataset, StreamTuning
from robo_resume.audit import consume
from robo_resume.items.ranges import EpisodeRangeReader
from robo_resume.testing import make_dataset


@pytest.fixture(scope="module")
def ten(tmp_path_factory):
    """10 episodes of 300 frames, no cameras (the schedule is what is measured)."""
    root = tmp_path_factory.mktemp("diversity") / "ten"
    return make_dataset(root, episode_lengths=(300,) * 10, num_cameras=0).root


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Enough chunks per stream that interleave 4 and 32 give different orders."""
    root = tmp_path_factory.mktemp("diversity") / "small"
    return make_dataset(root, episode_lengths=(40, 56, 33, 61, 47, 38), num_cameras=0).root


@pytest.fixture(scope="module")
def cams(tmp_path_factory):
    """Two cameras, several chunks per episode (read-ahead)."""
    root = tmp_path_factory.mktemp("diversity") / "cams"
    return make_dataset(root, episode_lengths=(37, 52, 29, 44, 61, 33), num_cameras=2).root


def distinct_per_batch(ds, workers: int) -> float:
    """Mean distinct episodes per batch over two epochs of every stream (schedule only)."""
    sched = ds.schedule(workers)
    plan = ds.chunks
    episode = {}
    for c in range(len(plan)):
        a, n = int(plan.dataset_from_index[c]), int(plan.stop[c] - plan.start[c])
        for i in range(a, a + n):
            episode[i] = int(plan.episode_index[c])
    b, counts = ds.batch_size, []
    for e in range(2):
        for s in range(sched.topology.num_streams):
            idx = sched.frame_indices(e, s).tolist()
            for k in range(0, len(idx) - b + 1, b):
                counts.append(len({episode[i] for i in idx[k : k + b]}))
    return float(np.mean(counts))


def uniform_per_batch(lengths, b: int) -> float:
    """Mean distinct episodes per batch of uniform random sampling (simulated)."""
    rng = np.random.default_rng(0)
    episode = np.repeat(np.arange(len(lengths)), lengths)
    p = episode[rng.permutation(len(episode))]
    p = p[: len(p) // b * b].reshape(-1, b)
    return float(np.mean([len(set(r)) for r in p.tolist()]))


def test_the_interleave_defaults_are_unchanged():
    assert StreamTuning().interleave == 4 and StreamTuning.fast().interleave == 4


@pytest.mark.parametrize("batch_size", [8, 16, 32])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_larger_interleave_gives_more_diverse_batches(ten, batch_size, workers):
    uniform = uniform_per_batch([300] * 10, batch_size)

    def diversity(interleave):
        tuning = StreamTuning.fast(interleave=interleave or 4)
        ds = ChunkedEpisodeDataset(ten, batch_size=batch_size, tuning=tuning)
        return distinct_per_batch(ds, workers)

    fast, sixteen = diversity(None), diversity(16)
    wide = diversity(min(6 * batch_size, 128))
    assert fast < sixteen < wide or fast < sixteen == wide
    assert fast < 0.7 * uniform  # StreamTuning.fast() is far below uniform sampling
    assert wide >= 0.9 * uniform, (batch_size, workers, wide, uniform)
    # the default (the shuffle order) is about as diverse as uniform sampling
    shuffled = distinct_per_batch(ChunkedEpisodeDataset(ten, batch_size=batch_size), workers)
    assert shuffled >= 0.95 * uniform, (batch_size, workers, shuffled, uniform)


@pytest.mark.parametrize("batch_size", [8, 16, 32])
@pytest.mark.parametrize("workers", [0, 2])
def test_rounds_spread_a_batch_over_its_chunks(ten, batch_size, workers):
    # interleave_order="rounds": every open chunk gives one frame per round, so interleave =
    # batch size already comes within 0.9x of uniform sampling, where "random" needs 2-4x
    # the open chunks (measured: 0.93-1.01 against 0.76-0.96 at interleave = batch size)
    uniform = uniform_per_batch([300] * 10, batch_size)

    def diversity(order):
        tuning = StreamTuning(interleave=batch_size, interleave_order=order)
        ds = ChunkedEpisodeDataset(ten, batch_size=batch_size, tuning=tuning)
        return distinct_per_batch(ds, workers)

    rounds, random = diversity("rounds"), diversity("random")
    assert rounds > random, (rounds, random)
    assert rounds >= 0.9 * uniform, (batch_size, workers, rounds, uniform)


@pytest.mark.parametrize("batch_size", [16, 32])
@pytest.mark.parametrize("workers", [0, 2])
def test_spread_reaches_uniform_sampling_at_interleave_batch_on_open50(open50, batch_size, workers):
    # open50's episodes differ in length, so chunks do (episode tails): with "rounds" the
    # last rounds of a group hold only its long chunks; "spread" spaces every chunk's frames
    # over the whole group (measured: 0.96-0.98x uniform against 0.84-0.89x for rounds)
    from conftest import OPEN50_WITH_VIDEO

    def diversity(order):
        tuning = StreamTuning(interleave=batch_size, interleave_order=order)
        ds = ChunkedEpisodeDataset(
            open50, batch_size=batch_size, episodes=list(OPEN50_WITH_VIDEO), tuning=tuning
        )
        return ds, distinct_per_batch(ds, workers)

    ds, spread = diversity("spread")
    lengths = np.bincount(ds.chunks.episode_index, weights=ds.chunks.stop - ds.chunks.start)
    uniform = uniform_per_batch(lengths[lengths > 0].astype(int).tolist(), batch_size)
    _, rounds = diversity("rounds")
    assert spread > rounds, (spread, rounds)
    assert spread >= 0.93 * uniform, (batch_size, workers, spread, uniform)


def test_rounds_give_each_open_chunk_one_frame_per_round(small):
    # the schedule's own order: in a group of k chunks, the first k positions come from k
    # different chunks, and every chunk's frames stay in frame order
    ds = ChunkedEpisodeDataset(
        small, batch_size=8, chunk_frames=16, tuning=StreamTuning(interleave=6,
        interleave_order="rounds"),
    )  # fmt: skip
    group = ds.schedule(0).group(0, 0, 0)
    k = len(group.segments)
    assert k == 6 and len(set(group.order[:k].tolist())) == k
    idx = group.global_indices()
    for j, seg in enumerate(group.segments):
        mine = idx[group.order == j]
        assert mine.tolist() == sorted(mine.tolist()) and len(mine) == seg.length


KW = dict(batch_size=8, seed=2, chunk_frames=16)  # several chunks per stream with 2 workers
WIDE = StreamTuning(interleave=32)


def _run(root, workers, tuning=WIDE, **kw):
    return consume(
        lambda **k: ChunkedEpisodeDataset(root, **KW, tuning=tuning, **k),
        epochs=2,
        num_workers=workers,
        **kw,
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_every_frame_exactly_once_with_a_large_interleave(small, workers):
    tuning = StreamTuning(interleave=32, tail="keep")
    ds = ChunkedEpisodeDataset(small, **KW, drop_last=False, tuning=tuning)
    total = ds.meta.total_frames
    for _ in range(2):
        got = [i for b in ds.dataloader(num_workers=workers) for i in b["index"].tolist()]
        assert sorted(got) == list(range(total))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_large_interleave_resumes_exactly(small, workers):
    full, _ = _run(small, workers)
    narrow, _ = _run(small, workers, tuning=None)
    assert full != narrow, "precondition: interleave 32 orders these frames differently"
    for crash in (1, 5, len(full) // 2 + 1):
        before, state = _run(small, workers, stop_after=crash)
        assert state["fingerprint"]["interleave"] == 32
        after, _ = _run(small, workers, resume_state=state, stop_after=len(full) - crash)
        assert before + after == full, crash


@pytest.mark.parametrize("order", ["rounds", "spread"])
@pytest.mark.parametrize("workers", [0, 2])
def test_rounds_resume_exactly_and_their_state_is_refused_by_random(small, workers, order):
    rounds = StreamTuning(interleave=32, interleave_order=order)
    full, _ = _run(small, workers, tuning=rounds)
    assert full != _run(small, workers)[0], "precondition: rounds order these frames otherwise"
    for crash in (1, len(full) // 2 + 1):
        before, state = _run(small, workers, tuning=rounds, stop_after=crash)
        assert state["fingerprint"]["interleave_order"] == order
        after, _ = _run(
            small, workers, tuning=rounds, resume_state=state, stop_after=len(full) - crash
        )
        assert before + after == full, crash
    from robo_resume.errors import ResumeStateError

    with pytest.raises(ResumeStateError) as info:
        ChunkedEpisodeDataset(small, **KW, tuning=WIDE, resume_state=state)
    text = str(info.value)
    assert "different 'interleave_order'" in text and f"interleave_order random vs {order}" in text
    assert "StreamTuning(interleave_order=...)" in text


def test_the_default_interleave_never_reads_ahead(cams):
    for batch_size in (1, 2, 3, 4, 8):
        ds = ChunkedEpisodeDataset(cams, batch_size=batch_size, chunk_frames=16)
        assert ds.reader.read_ahead(ds.config.interleave) == 1, batch_size
    ds = ChunkedEpisodeDataset(cams, batch_size=8, chunk_frames=16, tuning=WIDE)
    assert ds.reader.read_ahead(32) > 1
    assert ds.reader.read_ahead(8) > 1  # as many open chunks as a batch has frames
    assert ds.reader.read_ahead(7) == 1
    skip = ChunkedEpisodeDataset(cams, batch_size=8, chunk_frames=16, tuning=WIDE, on_error="skip")
    assert skip.reader.read_ahead(32) == 1


def test_large_frames_are_decoded_straight_into_the_batch(cams, monkeypatch):
    """Frames above READ_AHEAD_MAX_FRAME (bytes held, YUV 4:2:0) are never read ahead, however
    many chunks are open: each is decoded into its batch, nothing beyond the batches' frames
    (larger frames were not measured, docs/interleave-order.md)."""
    ds = ChunkedEpisodeDataset(cams, batch_size=8, chunk_frames=8, tuning=WIDE, image_dtype="uint8")
    assert len(ds.chunks) >= 32 and ds.reader.read_ahead(32) > 1  # small frames: read ahead
    frame = sum(int(np.prod(ds.items.camera_shape(c))) for c in ds.meta.camera_keys) // 2
    assert ds.reader.frame_bytes() == frame
    monkeypatch.setattr(read_ahead, "READ_AHEAD_MAX_FRAME", frame - 1)
    assert ds.reader.read_ahead(32) == 1
    calls = []
    raw = EpisodeRangeReader.raw

    def spy(self, frames, into=None):
        calls.append((len(frames), into is not None))
        return raw(self, frames, into)

    monkeypatch.setattr(EpisodeRangeReader, "raw", spy)
    got = sum(len(b["index"]) for b in ds.dataloader())
    assert got == ds.batches_per_epoch(0) * 8
    assert calls and all(direct for _, direct in calls)
    assert sum(n for n, _ in calls) == got


@pytest.mark.parametrize("ahead", ["block", 3])
@pytest.mark.parametrize("batch_size", [8, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_read_ahead_yields_the_same_batches(cams, monkeypatch, workers, batch_size, ahead):
    """Many open chunks decode a few frames per visit and keep the rest (stream/read_ahead.py):
    the batches (cameras, delta windows, every column) equal those read frame by frame, with
    read-ahead up to ``block_frames`` (every visit after the first served from what is kept)
    and with 3 frames (a visit takes kept frames and decodes more)."""
    delta = {"observation.images.cam0": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]}

    def dataset():
        return ChunkedEpisodeDataset(
            cams,
            batch_size=batch_size,
            chunk_frames=8,  # 2 workers: 16 or more open chunks per stream
            delta_timestamps=delta,
            image_dtype="uint8",
            tuning=WIDE,
        )

    def batches():
        loader = dataset().dataloader(
            num_workers=workers, multiprocessing_context="fork" if workers else None
        )  # forked workers see the patched READ_AHEAD_BYTES
        return [{k: v for k, v in b.items() if isinstance(v, torch.Tensor)} for b in loader]

    ds = dataset()
    assert len(ds.chunks) >= 32
    if ahead == "block":
        assert ds.reader.read_ahead(32) == ds.tuning.block_frames
    else:
        monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", ahead * 32 * ds.reader.frame_bytes())
        assert ds.reader.read_ahead(32) == ahead
    got = batches()
    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", 0)  # one frame per read
    assert ds.reader.read_ahead(32) == 1
    plain = batches()
    assert len(got) == len(plain) > 10
    for a, p in zip(got, plain, strict=True):
        assert a.keys() == p.keys()
        for k in a:
            assert torch.equal(a[k], p[k]), k


def test_a_wide_interleave_reuses_the_decoders_of_the_group_before(cams, monkeypatch):
    # a group's chunks end together: their decoders (interleave x cameras) all stay idle for
    # the next group's chunks, which take them instead of opening their files again
    # (measured on this dataset: 34 container opens over the epoch, 48 with 16 idle decoders)
    import av

    opens = []
    real = av.open
    monkeypatch.setattr(av, "open", lambda *a, **k: opens.append(a[0]) or real(*a, **k))
    tuning = StreamTuning(interleave=16, interleave_order="spread")
    ds = ChunkedEpisodeDataset(cams, batch_size=16, chunk_frames=8, tuning=tuning)
    files = len(list(cams.glob("videos/**/*.mp4")))
    assert len(ds.chunks) > 2 * 16, "precondition: three groups of chunks"
    for _ in ds.dataloader(num_workers=0):
        pass
    assert ds.items.idle_decoders == 16 * 2
    assert len(opens) <= 16 * 2 + files, (len(opens), files)
