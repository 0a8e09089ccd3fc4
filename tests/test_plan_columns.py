"""The columnar plan equals the object-based one it replaced, chunk for chunk and hash for hash.

The oracle below is the object-based ``make_chunks`` / ``plan_fingerprint`` of main before
issue 15 (one ``Chunk`` per chunk, one f-string per chunk), kept here only as a test oracle; its
cut rule is today's (kf-chunks: with no cut point in reach, a chunk of an episode with cut points
runs to the next one, or to the episode's end).
"""

from __future__ import annotations

import bisect
import hashlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from robo_resume.index.elastic import split_segments
from robo_resume.index.plan import (
    Chunk,
    EpisodeSpan,
    EpisodeSpans,
    Plan,
    make_chunks,
    plan_fingerprint,
)
from robo_resume.index.schedule import Schedule, ScheduleConfig, Topology
from robo_resume.index.segments import Segment, Segments


def oracle_chunks(episodes, chunk_frames, cut_points=None):
    chunks = []
    for ep in episodes:
        has = bool(cut_points) and ep.episode_index in cut_points
        cuts = sorted(cut_points.get(ep.episode_index, ())) if has else []
        start = 0
        while start < ep.length:
            limit = min(start + chunk_frames, ep.length)
            stop = limit
            if has and limit < ep.length:
                j = bisect.bisect_right(cuts, limit) - 1
                if j >= 0 and cuts[j] > start:
                    stop = cuts[j]
                else:  # none in reach: the next one inside the episode, else its end
                    k = bisect.bisect_right(cuts, start)
                    stop = cuts[k] if k < len(cuts) and cuts[k] < ep.length else ep.length
            chunks.append(Chunk(ep.episode_index, start, stop, ep.dataset_from_index + start))
            start = stop
    return tuple(chunks)


def oracle_fingerprint(chunks):
    h = hashlib.sha256()
    for c in chunks:
        h.update(f"{c.episode_index},{c.start},{c.stop},{c.dataset_from_index};".encode())
    return h.hexdigest()


@st.composite
def plans(draw):
    n = draw(st.integers(1, 25))
    scale = draw(st.sampled_from([1, 10**4, 10**9, 10**15]))
    at, e, spans = draw(st.integers(0, scale)), draw(st.integers(0, scale)), []
    for _ in range(n):
        length = draw(st.integers(1, draw(st.sampled_from([3, 70, 700]))))
        spans.append(EpisodeSpan(e, at, length))
        at += length + draw(st.integers(0, 2))
        e += draw(st.integers(1, 3))
    cuts = None
    if draw(st.booleans()):
        cuts = {
            s.episode_index: draw(st.lists(st.integers(-3, s.length + 3), max_size=12))
            for s in spans
            if draw(st.booleans())
        }
    return spans, draw(st.integers(1, 80)), cuts


@settings(max_examples=150, deadline=None)
@given(plans())
def test_same_chunks_and_fingerprint_as_the_object_plan(case):
    spans, chunk_frames, cuts = case
    want = oracle_chunks(spans, chunk_frames, cuts)
    plan = make_chunks(spans, chunk_frames, cut_points=cuts)
    assert isinstance(plan, Plan)
    assert tuple(plan) == want
    assert [plan[i] for i in range(len(plan))] == list(want)
    assert plan_fingerprint(plan) == oracle_fingerprint(want)
    assert plan_fingerprint(want) == oracle_fingerprint(want)  # a tuple of Chunks still works
    cols = EpisodeSpans(
        np.array([s.episode_index for s in spans]),
        np.array([s.dataset_from_index for s in spans]),
        np.array([s.length for s in spans]),
    )
    assert make_chunks(cols, chunk_frames, cut_points=cuts) == plan


def test_fingerprint_of_a_large_plan_matches_in_blocks():
    """More rows than one hashed block, digits of every width (the block and digit joins)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 400, 3_000)
    spans = EpisodeSpans(
        np.arange(3_000) * 37, np.cumsum(lengths) - lengths + 10**11 - 5_000_000, lengths
    )
    plan = make_chunks(spans, 8)
    assert len(plan) > 2**16
    assert plan.fingerprint() == oracle_fingerprint(tuple(plan))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=10), st.data())
def test_split_segments_cuts_like_the_object_version(lengths, data):
    segs = [
        Segment(i, i, 5, 5 + n, 1000 * i + 5, None if i % 2 else i // 2)
        for i, n in enumerate(lengths)
    ]
    total = sum(lengths)
    cuts = sorted(data.draw(st.lists(st.integers(0, total), max_size=6)))
    pieces = [b - a for a, b in zip([0, *cuts], cuts, strict=False)]
    got = split_segments(segs, pieces)
    frames = [(s.episode_index, s.start + k) for s in segs for k in range(s.length)]
    at = 0
    for piece, n in zip(got, pieces, strict=True):
        assert [(s.episode_index, s.start + k) for s in piece for k in range(s.length)] == frames[
            at : at + n
        ]
        for s in piece:
            assert s.dataset_from_index == 1000 * s.chunk_id + s.start
            assert s.epoch == (None if s.chunk_id % 2 else s.chunk_id // 2)
        at += n
    assert Segments.of(segs)[2:4].objects(0, 2) == tuple(segs[2:4])


def test_schedule_memory_is_flat_across_epochs():
    """The schedule keeps one epoch's layout and a few streams' segments, whatever the epoch."""
    lengths = [40] * 300
    spans = EpisodeSpans(np.arange(300), np.arange(300) * 40, np.array(lengths))
    sched = Schedule(make_chunks(spans, 8), ScheduleConfig(batch_size=4), Topology(2, 3))
    for epoch in range(20):
        for g in range(sched.topology.num_streams):
            sched.locate(epoch, g, 17)
        assert sched._layout is not None and sched._layout[0] == epoch
        assert sched.segments.currsize <= 4 and sched._rows.currsize <= 4


def test_plan_columns_are_int32_when_they_fit_with_the_same_values_and_fingerprint():
    """int32 storage (half the memory) changes no value, chunk or fingerprint; a plan with a
    value past 2^31 stays int64."""
    from robo_resume.index.plan import Plan, fingerprint_columns

    lengths = np.array([40, 17, 64, 5, 33] * 30)
    spans = EpisodeSpans(np.arange(150), np.cumsum(lengths) - lengths, lengths)
    plan = make_chunks(spans, 8)
    assert all(getattr(plan, k).dtype == np.int32 for k in ("start", "stop", "episode_index"))
    cols = (plan.episode_index, plan.start, plan.stop, plan.dataset_from_index)
    text = "".join(
        f"{e},{a},{b},{d};" for e, a, b, d in zip(*(c.tolist() for c in cols), strict=True)
    )
    assert plan.fingerprint() == hashlib.sha256(text.encode()).hexdigest()
    assert fingerprint_columns([c.astype(np.int64) for c in cols]) == plan.fingerprint()
    assert plan.lengths.dtype == np.int64
    big = Plan([0, 1], [0, 0], [5, 5], [0, 2**31 + 7])
    assert big.dataset_from_index.dtype == np.int64 and big[1].dataset_from_index == 2**31 + 7
    sched = Schedule(plan, ScheduleConfig(seed=1, batch_size=4), Topology(2, 2))
    seg = sched.segments(0, 1)
    assert all(getattr(seg, k).dtype == np.int64 for k in ("episode_index", "start", "stop"))


def test_epoch_layout_is_int32_below_2_31_frames_and_int64_past_it():
    """The epoch's prefix sums take int32 while the plan's frames fit (half their memory) and
    int64 past 2^31 frames, where a position past 2^31 is still located exactly."""
    lengths = np.array([40, 17, 64, 5, 33] * 30)
    spans = EpisodeSpans(np.arange(150), np.cumsum(lengths) - lengths, lengths)
    small = Schedule(make_chunks(spans, 8), ScheduleConfig(seed=3, batch_size=4), Topology(1, 2))
    perm, offsets = small._epoch_layout(0)
    assert perm.dtype == np.int32 and offsets.dtype == np.int32
    assert offsets[-1] == lengths.sum() and np.array_equal(
        np.diff(offsets), small.chunks.lengths[perm]
    )

    n, episode = 5, 2**29  # 5 episodes of 2^29 frames: 2.7x10^9 frames in 40 chunks of 2^26
    spans = EpisodeSpans(np.arange(n), np.arange(n) * episode, np.full(n, episode))
    config = ScheduleConfig(batch_size=1, interleave=1, shuffle=False)
    big = Schedule(make_chunks(spans, 2**26), config, Topology(1, 0))
    assert big._epoch_layout(0)[1].dtype == np.int64
    position = 2**31 + 12345  # in chunk 32 (episode 4, its first chunk), frame 12345
    where = big.locate(0, 0, position)
    seg = big.group(0, 0, where.group).segments[0]
    assert (seg.chunk_id, seg.episode_index, seg.start + where.done[0]) == (32, 4, 12345)
    assert seg.dataset_from_index == 4 * episode
