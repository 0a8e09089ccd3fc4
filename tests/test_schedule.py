"""Properties of the pure plan and schedule (hypothesis), and the resume arithmetic.

Nothing here reads files; every order is compared exactly, never sorted.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robo_resume.index.plan import Chunk, EpisodeSpan, make_chunks, plan_fingerprint
from robo_resume.index.schedule import (
    Schedule,
    ScheduleConfig,
    Topology,
)
from robo_resume.index.start import resume_point, worker_batches_done


def spans(lengths):
    out, start = [], 0
    for e, n in enumerate(lengths):
        out.append(EpisodeSpan(e, start, n))
        start += n
    return out


# -- plan ---------------------------------------------------------------------------------------
@given(st.lists(st.integers(1, 60), min_size=1, max_size=12), st.integers(1, 20))
def test_chunks_cover_every_frame_once(lengths, chunk_frames):
    chunks = make_chunks(spans(lengths), chunk_frames)
    got = [c.dataset_from_index + k for c in chunks for k in range(c.length)]
    assert got == list(range(sum(lengths)))
    assert all(1 <= c.length <= chunk_frames for c in chunks)


@given(st.lists(st.integers(1, 60), min_size=1, max_size=6), st.integers(2, 20), st.integers(1, 9))
def test_chunks_end_on_cut_points_when_possible(lengths, chunk_frames, gop):
    cuts = {e: list(range(0, n, gop)) for e, n in enumerate(lengths)}
    chunks = make_chunks(spans(lengths), chunk_frames, cut_points=cuts)
    got = [c.dataset_from_index + k for c in chunks for k in range(c.length)]
    assert got == list(range(sum(lengths)))
    for c in chunks:
        n = lengths[c.episode_index]
        if c.stop < n and gop <= chunk_frames:
            assert c.stop % gop == 0, c  # the next chunk starts on a keyframe


def test_zero_length_episode_is_rejected():
    with pytest.raises(ValueError, match=r"Episode 1 has 0 frames.*Fix: leave it out"):
        make_chunks([EpisodeSpan(0, 0, 5), EpisodeSpan(1, 5, 0)], 4)


def test_plan_fingerprint():
    a = make_chunks(spans([5, 7]), 4)
    assert plan_fingerprint(a) == plan_fingerprint(make_chunks(spans([5, 7]), 4))
    assert plan_fingerprint(a) != plan_fingerprint(make_chunks(spans([5, 7]), 3))


# -- schedule -----------------------------------------------------------------------------------
topologies = st.builds(Topology, world_size=st.integers(1, 3), num_workers=st.integers(0, 3))
configs = st.builds(
    ScheduleConfig,
    seed=st.integers(0, 2**32),
    batch_size=st.integers(1, 7),
    drop_last=st.booleans(),
    tail=st.sampled_from(["drop", "pad"]),
    interleave=st.integers(1, 4),
    shuffle=st.booleans(),
)


def all_streams(sched, epoch):
    return [sched.frame_indices(epoch, s).tolist() for s in range(sched.topology.num_streams)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 60), min_size=1, max_size=12),
    st.integers(1, 20),
    configs,
    topologies,
    st.integers(0, 3),
)
def test_every_frame_once_equal_streams(lengths, chunk_frames, config, topo, epoch):
    chunks = make_chunks(spans(lengths), chunk_frames)
    total = sum(lengths)
    unit = config.batch_size if config.drop_last else 1
    if total < topo.num_streams * unit and config.tail == "drop":
        with pytest.raises(ValueError, match=r"need at least"):
            Schedule(chunks, config, topo)
        return
    sched = Schedule(chunks, config, topo)
    streams = all_streams(sched, epoch)
    q = sched.frames_per_stream
    assert all(len(s) == q for s in streams)
    counts = Counter(i for s in streams for i in s)
    assert set(counts) <= set(range(total))
    if config.tail == "drop":
        assert max(counts.values()) == 1
        assert total - len(counts) == total - topo.num_streams * q < topo.num_streams * unit
    else:
        assert set(counts) == set(range(total))
        assert topo.num_streams * q >= total
    if config.drop_last:
        assert q % config.batch_size == 0
    # each segment is read in increasing frame order inside its group (sequential decoding)
    for s in range(topo.num_streams):
        for group, _ in sched.iter_groups(epoch, s):
            idx = group.global_indices()
            for j, seg in enumerate(group.segments):
                mine = idx[group.order == j]
                assert mine.tolist() == list(
                    range(seg.dataset_from_index, seg.dataset_from_index + seg.length)
                )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), configs, topologies, st.data())
def test_position_arithmetic_inverts_iteration(lengths, config, topo, data):
    chunks = make_chunks(spans(lengths), 7)
    try:
        sched = Schedule(chunks, config, topo)
    except ValueError:
        return
    stream = data.draw(st.integers(0, topo.num_streams - 1))
    full = sched.frame_indices(1, stream)
    for p in range(0, sched.frames_per_stream + 1):
        rest = [
            i
            for n, (g, off) in enumerate(sched.iter_groups(1, stream, p))
            for i in g.global_indices()[off:]
        ]
        assert rest == full[p:].tolist()
        assert sched.frame_indices(1, stream, p).tolist() == full[p:].tolist()
        if p < sched.frames_per_stream:
            cur = sched.locate(1, stream, p)
            g = sched.group(1, stream, cur.group)
            assert g.position + cur.offset == p
            assert sum(cur.done) == cur.offset


def test_deterministic_and_seed_dependent():
    chunks = make_chunks(spans([37, 52, 29, 61, 44]), 8)
    topo = Topology(1, 2)

    def order(seed, epoch):
        return all_streams(Schedule(chunks, ScheduleConfig(seed=seed, batch_size=4), topo), epoch)

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(1, 0)
    assert order(0, 0) != order(0, 1)
    s0, s1 = order(0, 0)
    assert s0[:20] != s1[:20]


def test_deterministic_across_processes():
    code = (
        "from robo_resume.index.plan import make_chunks, EpisodeSpan as E;"
        "from robo_resume.index.schedule import Schedule, ScheduleConfig as C, Topology as T;"
        "ch = make_chunks([E(0,0,37), E(1,37,52), E(2,89,29)], 8);"
        "s = Schedule(ch, C(seed=5, batch_size=3), T(2, 2));"
        "print([s.frame_indices(2, k).tolist() for k in range(4)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ch = make_chunks([EpisodeSpan(0, 0, 37), EpisodeSpan(1, 37, 52), EpisodeSpan(2, 89, 29)], 8)
    s = Schedule(ch, ScheduleConfig(seed=5, batch_size=3), Topology(2, 2))
    assert out.stdout.strip() == str([s.frame_indices(2, k).tolist() for k in range(4)])


def test_interleave_mixes_episodes_within_a_batch():
    chunks = make_chunks(spans([200] * 8), 32)
    sched = Schedule(chunks, ScheduleConfig(seed=0, batch_size=32, interleave=4), Topology(1, 1))
    first = sched.frame_indices(0, 0, 0, 32)
    assert len({int(i) // 200 for i in first}) >= 3
    plain = Schedule(chunks, ScheduleConfig(seed=0, batch_size=32, interleave=1), Topology(1, 1))
    assert len({int(i) // 200 for i in plain.frame_indices(0, 0, 0, 32)}) <= 2


# -- resume arithmetic --------------------------------------------------------------------------
def simulate(sched, epochs, infinite, total=None):
    """Batches a torch DataLoader would deliver: batch k of an epoch from worker k % W."""
    w = sched.topology.workers_per_rank
    b = sched.config.batch_size
    out = []
    if infinite:
        streams = [
            np.concatenate([sched.frame_indices(e, r) for e in range(epochs + 2)]).tolist()
            for r in range(w)
        ]
        k = 0
        while len(out) < total:
            role, n = k % w, k // w
            out.append(streams[role][n * b : (n + 1) * b])
            k += 1
        return out
    for e in range(epochs):
        streams = [sched.frame_indices(e, r).tolist() for r in range(w)]
        for k in range(sched.batches_per_rank):
            role, n = k % w, k // w
            out.append(streams[role][n * b : (n + 1) * b])
    return out


def resumed(sched, s, epochs, infinite, total=None, naive=False):
    """Batches after resuming at s, by the resume point (or the naive per-sample formula)."""
    w = sched.topology.workers_per_rank
    b = sched.config.batch_size
    if naive:
        per_epoch = sched.batches_per_rank * b
        e, within = divmod(s * b, per_epoch)
        starts = [(e, within // w)] * w
        rotation = 0
    else:
        rp = resume_point(sched, s, infinite=infinite)
        starts = [(x.epoch, x.position) for x in rp.starts]
        rotation = rp.rotation
    out = []
    if infinite:
        streams = []
        for role in range(w):
            e, p = starts[role]
            seq = np.concatenate([sched.frame_indices(k, role) for k in range(e, e + 4)])
            streams.append(seq[p:].tolist())
        k = 0
        while len(out) < total - s:
            role = (k % w + rotation) % w
            n = k // w
            out.append(streams[role][n * b : (n + 1) * b])
            k += 1
        return out
    first = starts[0][0]
    for e in range(first, epochs):
        streams = []
        for worker in range(w):
            role = (worker + rotation) % w if e == first else worker
            pos = starts[role][1] if e == first else 0
            seq = sched.frame_indices(e, role)[pos:].tolist()
            streams.append([seq[i : i + b] for i in range(0, len(seq), b)])
        k = 0
        while any(streams):
            worker = k % w
            if streams[worker]:
                out.append(streams[worker].pop(0))
            k += 1
            if k > 10**6:
                raise AssertionError("runaway")
    return out


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch", [1, 3, 7])
@pytest.mark.parametrize("infinite", [False, True])
def test_resume_point_reproduces_the_uninterrupted_order(workers, batch, infinite):
    chunks = make_chunks(spans([23, 41, 17, 30, 9]), 6)
    sched = Schedule(chunks, ScheduleConfig(seed=3, batch_size=batch), Topology(1, workers))
    per = sched.batches_per_rank
    total = 2 * per + 3
    full = simulate(sched, 2, infinite, total)
    for s in sorted({0, 1, per // 2 + 1, per - 1, per, per + 1, 2 * per - 1}):
        assert full[:s] + resumed(sched, s, 2, infinite, total) == full, s


def test_naive_formula_replays_and_loses_when_steps_do_not_divide():
    chunks = make_chunks(spans([23, 41, 17, 30, 9]), 6)
    sched = Schedule(chunks, ScheduleConfig(seed=3, batch_size=4), Topology(1, 2))
    full = simulate(sched, 1, False)
    for s in (1, 3, 5):  # s % W != 0
        got = [i for b in full[:s] + resumed(sched, s, 1, False, naive=True) for i in b]
        want = [i for b in full for i in b]
        c_got, c_want = Counter(got), Counter(want)
        assert sum((c_got - c_want).values()) > 0 and sum((c_want - c_got).values()) > 0
    got = full[:4] + resumed(sched, 4, 1, False, naive=True)
    assert got == full  # with s % W == 0 the naive formula happens to be right


def test_worker_batches_done():
    assert [worker_batches_done(5, 2, w) for w in range(2)] == [3, 2]
    assert [worker_batches_done(7, 3, w) for w in range(3)] == [3, 2, 2]
    assert worker_batches_done(7, 0, 0) == 7


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(batch_size=0), r"batch_size must be an int >= 1; found 0"),
        (dict(interleave=0), r"interleave must be an int >= 1"),
        (dict(tail="x"), r"tail must be one of \('drop', 'pad', 'keep'\); found 'x'"),
        (dict(seed=-1), r"seed must be an int >= 0"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScheduleConfig(**kwargs)


def test_too_few_frames_error():
    chunks = (Chunk(0, 0, 5, 0),)
    with pytest.raises(ValueError, match=r"5 frames but 4 streams x 2 frames.*Fix: use fewer"):
        Schedule(chunks, ScheduleConfig(batch_size=2, drop_last=True), Topology(2, 2))
    sched = Schedule(chunks, ScheduleConfig(batch_size=2, tail="pad"), Topology(2, 2))
    assert sched.frames_per_stream == 2


def test_resume_cost_does_not_grow_with_position():
    """Locating 10^9 touches one group: the work is bounded by the stream-epoch's segments."""
    chunks = make_chunks(spans([50] * 20_000), 16)
    sched = Schedule(chunks, ScheduleConfig(seed=1, batch_size=32), Topology(1, 2))
    rp = resume_point(sched, 10**9 // 32, infinite=True)
    assert len(rp.starts) == 2
    e, p = rp.starts[0].epoch, rp.starts[0].position
    cur = sched.locate(e, 0, p)
    assert cur.offset < 16 * 4


def test_group_order_rounds_and_random():
    # the interleave of a group's segments (pure): every segment emits all its frames;
    # "rounds": position by position, the segment's frame number never goes back (round r holds
    # frame r of each segment that has one), each round a seeded order; "random" is a seeded
    # permutation; without a generator (shuffle=False) both are fixed
    import numpy as np

    from robo_resume.index.schedule import group_order

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 12, size=int(rng.integers(1, 9))).tolist()
        for mode in ("random", "rounds"):
            order = group_order(lengths, mode, np.random.default_rng(1))
            assert np.bincount(order, minlength=len(lengths)).tolist() == lengths
        order = group_order(lengths, "rounds", np.random.default_rng(1))
        seen = np.zeros(len(lengths), dtype=int)
        frame = []
        for j in order.tolist():
            frame.append(seen[j])
            seen[j] += 1
        assert frame == sorted(frame)  # rounds follow each other
        for r in range(max(lengths)):  # round r: the segments longer than r, once each
            here = order[np.asarray(frame) == r]
            assert sorted(here.tolist()) == [j for j, n in enumerate(lengths) if n > r]
    lengths = [5, 5, 5, 5, 5, 5]
    a = group_order(lengths, "rounds", np.random.default_rng(1))
    b = group_order(lengths, "rounds", np.random.default_rng(2))
    assert a.tolist() != b.tolist()  # seeded: another seed, another order within the rounds
    assert group_order([2, 3], "rounds", None).tolist() == [0, 1, 0, 1, 1]
    assert group_order([2, 3], "random", None).tolist() == [0, 0, 1, 1, 1]


def test_group_order_spread_spaces_each_segment_over_the_group():
    # "spread": frame i of a segment of L frames sits near (i + u) / L of the group (u a
    # seeded phase in [0, 1)), within the k segments' share of a round; equal segments give
    # one frame of each per k positions (as rounds), and a short segment is spread over the
    # whole group instead of its first rounds
    import numpy as np

    from robo_resume.index.schedule import group_order

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 40, size=int(rng.integers(1, 12))).tolist()
        order = group_order(lengths, "spread", np.random.default_rng(3))
        assert np.bincount(order, minlength=len(lengths)).tolist() == lengths
        n, k = len(order), len(lengths)
        for j, size in enumerate(lengths):
            where = np.flatnonzero(order == j)
            ideal = np.arange(size) / size * n  # phase 0; the phase moves it by < n / size
            assert np.all(where >= ideal - k) and np.all(where <= ideal + n / size + k), j
    equal = group_order([7] * 5, "spread", np.random.default_rng(1))
    for r in range(7):
        assert sorted(equal[5 * r : 5 * r + 5].tolist()) == [0, 1, 2, 3, 4]
    short = group_order([64, 64, 64, 8], "spread", np.random.default_rng(1))
    last = np.flatnonzero(short == 3)
    assert last[0] < 200 // 8 and last[-1] > 200 * 7 // 8  # rounds: all in the first 32
    rounds = group_order([64, 64, 64, 8], "rounds", np.random.default_rng(1))
    assert np.flatnonzero(rounds == 3)[-1] < 32
    a = group_order([5] * 6, "spread", np.random.default_rng(1))
    b = group_order([5] * 6, "spread", np.random.default_rng(2))
    assert a.tolist() != b.tolist()  # seeded
    assert group_order([2, 3], "spread", None).tolist() == [1, 0, 1, 0, 1]
