"""Evaluation mode: ``StreamTuning.evaluation()`` (tail="keep", no shuffle) yields every selected
frame exactly once per pass, with any number of workers and ranks, in order per worker."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from robo_resume import CURSOR_KEY, ChunkedEpisodeDataset, StreamTuning
from robo_resume.audit import consume
from robo_resume.index.plan import EpisodeSpan, make_chunks
from robo_resume.index.schedule import (
    Schedule,
    ScheduleConfig,
    Topology,
)
from robo_resume.index.start import resume_point, worker_batches_done
from robo_resume.mix import MixedDataset, MixSource

LENGTHS = (23, 41, 17, 30, 9, 12, 33)  # 165 frames
EVAL = StreamTuning.evaluation()


@pytest.fixture(scope="module")
def root(factory):
    return factory(episode_lengths=LENGTHS, num_cameras=0).root


@pytest.fixture(scope="module")
def cam_root(factory):
    return factory(episode_lengths=(19, 27, 12), num_cameras=1).root


def index_of(ds):
    """Dataset ``index`` values of the selected episodes, in dataset order."""
    return [
        ds.meta.episode(e).dataset_from_index + k
        for e in ds.episodes
        for k in range(ds.meta.episode(e).length)
    ]


def one_pass(ds, num_workers, **kw):
    """[(worker role, index list)] of one pass over ds.dataloader()."""
    loader = ds.dataloader(num_workers=num_workers, **kw)
    n = len(loader)
    out = [(int(b[CURSOR_KEY][0, 1]), b["index"].tolist()) for b in loader]
    assert len(out) == n  # len(loader) is exact
    return out


def check_once_in_order(batches, want, batch_size):
    flat = [i for _, b in batches for i in b]
    assert Counter(flat) == Counter(want), f"{len(flat)} frames, expected {len(want)} once each"
    roles = sorted({r for r, _ in batches})
    pieces = [[i for r, b in batches if r == role for i in b] for role in roles]
    assert [i for p in pieces for i in p] == want  # each worker: a consecutive piece, in order
    assert all(len(b) == batch_size for _, b in batches[: -len(roles)])  # short ones at the end


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch_size", [1, 8, 10])
def test_every_frame_once_in_order(root, num_workers, batch_size):
    ds = ChunkedEpisodeDataset(root, batch_size=batch_size, chunk_frames=16, tuning=EVAL)
    batches = one_pass(ds, num_workers)
    check_once_in_order(batches, index_of(ds), batch_size)
    if num_workers <= 1:
        assert [i for _, b in batches for i in b] == index_of(ds)  # one stream: dataset order


def test_episode_selection_and_windows(cam_root):
    ds = ChunkedEpisodeDataset(
        cam_root,
        batch_size=4,
        episodes=[2, 0],
        delta_timestamps={"action": [-0.1, 0.0, 0.1]},
        tuning=EVAL,
    )
    batches = ds.dataloader(num_workers=2)
    seen = []
    for b in batches:
        assert b["action"].shape[1:] == (3, 3) and b["observation.images.cam0"].shape[0] == len(
            b["index"]
        )
        seen.append((int(b[CURSOR_KEY][0, 1]), b["index"].tolist()))
    want = index_of(ds)  # episodes 0 then 2: selection order is dataset order
    assert ds.episodes == (0, 2) and len(want) == 31
    check_once_in_order(seen, want, 4)


def test_the_issue_sizes_exactly():
    """Issue 13: 3,741 frames gave 3,740 per epoch; a 1,085-frame pass with 2 workers 1,084."""
    for lengths, topo, b in [
        ((374,) * 9 + (375,), Topology(1, 2), 32),
        ((98, 120, 101, 97, 111, 130, 104, 110, 107, 107), Topology(1, 2), 8),
        ((374,) * 9 + (375,), Topology(4, 3), 16),
    ]:
        spans, start = [], 0
        for e, n in enumerate(lengths):
            spans.append(EpisodeSpan(e, start, n))
            start += n
        chunks = make_chunks(spans, 64)
        drop = Schedule(chunks, ScheduleConfig(batch_size=b), topo)
        keep = Schedule(chunks, ScheduleConfig(batch_size=b, tail="keep", shuffle=False), topo)
        n = topo.num_streams
        dropped = [i for s in range(n) for i in drop.frame_indices(0, s)]
        kept = [i for s in range(n) for i in keep.frame_indices(0, s)]
        assert len(dropped) < start  # the default drops the remainder (training)
        assert kept == list(range(start))  # keep: all, streams in order, each in order
        counts = {keep.rank_batches(r) for r in range(topo.world_size)}
        assert len(counts) == 1  # equal batch counts per rank (DDP-safe) at these sizes


settings_keep = settings(max_examples=150, deadline=None)


@settings_keep
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=10),
    st.integers(1, 9),
    st.integers(1, 4),
    st.integers(0, 3),
    st.booleans(),
    st.data(),
)
def test_keep_schedule_properties(lengths, b, ranks, workers, shuffle, data):
    """Every frame once per epoch; per rank the round-robin shape; resume arithmetic exact."""
    spans, start = [], 0
    for e, n in enumerate(lengths):
        spans.append(EpisodeSpan(e, start, n))
        start += n
    topo = Topology(ranks, workers)
    cfg = ScheduleConfig(seed=3, batch_size=b, tail="keep", shuffle=shuffle)
    sched = Schedule(make_chunks(spans, 7), cfg, topo)
    streams = [sched.frame_indices(1, s).tolist() for s in range(topo.num_streams)]
    flat = [i for s in streams for i in s]
    assert Counter(flat) == Counter(range(start))
    if not shuffle:
        assert flat == list(range(start))
    wp = topo.workers_per_rank
    per_rank = []
    for r in range(ranks):
        counts = [-(-len(streams[r * wp + w]) // b) for w in range(wp)]
        assert counts == sorted(counts, reverse=True) and counts[0] - counts[-1] <= 1
        assert all(  # every batch full except a stream's last one
            len(streams[r * wp + w]) > (c - 1) * b for w, c in enumerate(counts) if c
        )
        per_rank.append(sum(counts))
        assert sched.rank_batches(r) == sum(counts)
        # the resume arithmetic: after k batches of this rank, each role is where it should be
        k = data.draw(st.integers(0, sum(counts)), label="batches")
        rp = resume_point(sched, k, infinite=False, rank=r)
        if k and k == sum(counts):
            assert all(s.epoch == 1 and s.position == 0 for s in rp.starts)
        else:
            for w, s in enumerate(rp.starts):
                done = worker_batches_done(k, workers, w)
                assert s.epoch == 0
                assert s.position == min(done * b, len(streams[r * wp + w]))
    assert max(per_rank) - min(per_rank) <= 1
    if ranks == 1 or (workers >= 2 and b >= 2 and start >= ranks):
        assert len(set(per_rank)) == 1  # equal per rank: DDP collectives are safe


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_ranks_split_the_frames_once(root, num_workers):
    """Rank r reads the r-th consecutive part; equal batch counts here (2+ workers or 1 rank)."""
    frames, lengths = [], []
    for rank in range(2):
        ds = ChunkedEpisodeDataset(
            root, batch_size=8, chunk_frames=16, tuning=EVAL, rank=rank, world_size=2
        )
        batches = one_pass(ds, num_workers)
        lengths.append(len(batches))
        frames.append([i for _, b in batches for i in sorted(b)])
    assert sorted(frames[0]) + sorted(frames[1]) == list(range(sum(LENGTHS)))
    if num_workers >= 2:
        assert lengths[0] == lengths[1]


def test_ranks_that_cannot_be_equal_differ_by_one_batch(root):
    """3 ranks x 1 stream, batch 8, 165 frames: no equal split, ranks get 7, 7 and 7 batches or
    one fewer; every frame still once (gather per rank after the pass, no per-batch collective)."""
    sched = Schedule(
        ChunkedEpisodeDataset(root, batch_size=64, tuning=EVAL).chunks,
        ScheduleConfig(batch_size=64, tail="keep", shuffle=False),
        Topology(3, 0),
    )
    counts = [sched.rank_batches(r) for r in range(3)]
    assert counts == [1, 1, 1] or max(counts) - min(counts) == 1
    got = [i for s in range(3) for i in sched.frame_indices(0, s).tolist()]
    assert got == list(range(sum(LENGTHS)))


def test_other_tails_are_not_every_frame_once(root):
    """What the preset fixes (issue 13): 165 frames, 2 workers: 'drop' yields 164, 'pad' 166."""
    want = Counter(range(sum(LENGTHS)))
    for tail, n in (("drop", 164), ("pad", 166), ("keep", 165)):
        tuning = StreamTuning(shuffle=False, tail=tail)
        ds = ChunkedEpisodeDataset(root, batch_size=8, chunk_frames=16, tuning=tuning)
        got = Counter(i for _, b in one_pass(ds, 2) for i in b)
        assert sum(got.values()) == n, tail
        assert (got == want) == (tail == "keep"), tail


def test_resume_inside_an_evaluation_pass(root):
    """The tracker works in evaluation mode: a pass interrupted after 7 batches continues."""

    def make(**kw):
        return ChunkedEpisodeDataset(root, batch_size=8, chunk_frames=16, tuning=EVAL, **kw)

    full, _ = consume(make, num_workers=2)
    before, state = consume(make, num_workers=2, stop_after=7)
    after, _ = consume(make, num_workers=2, resume_state=state)
    assert before + after == full
    elastic, _ = consume(make, num_workers=3, resume_state=state)
    got = [i for _, b in before + elastic for i in b]
    assert Counter(got) == Counter(range(sum(LENGTHS)))


def test_refusals_say_why(root):
    with pytest.raises(ValueError, match=r"every frame exactly once per pass.*drop_last=False"):
        ChunkedEpisodeDataset(root, batch_size=8, drop_last=True, tuning=EVAL)
    with pytest.raises(ValueError, match=r"infinite=True.*evaluate with drop_last=False"):
        ChunkedEpisodeDataset(root, batch_size=8, infinite=True, tuning=EVAL)
    with pytest.raises(
        ValueError, match=r"Unknown tail\. Expected 'drop' or 'pad' or 'keep'\. Found all"
    ):
        StreamTuning(tail="all")
    with pytest.raises(ValueError, match=r"A mix cannot use StreamTuning\(tail='keep'\)"):
        MixedDataset([MixSource(root)], batch_size=8, exhausted="stop", tuning=EVAL)
    assert StreamTuning.evaluation(block_frames=32) == StreamTuning(
        order="interleave", shuffle=False, tail="keep", block_frames=32
    )


def test_cameras_in_evaluation_order(cam_root):
    """With video, 0 workers: dataset order, batch of 5 (not a divisor of 58 frames)."""
    ds = ChunkedEpisodeDataset(cam_root, batch_size=5, tuning=EVAL, image_dtype="uint8")
    batches = list(ds.dataloader(num_workers=0))
    idx = np.concatenate([b["index"].numpy() for b in batches])
    assert idx.tolist() == index_of(ds)
    assert all(b["observation.images.cam0"].dtype == torch.uint8 for b in batches)
