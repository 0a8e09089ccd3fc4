"""Elastic resume: another num_workers, world size or batch size after a crash.

Every DataLoader check counts the ``index`` values consumed over the interrupted epoch (they must
be the epoch's frames exactly once: Counter equality) and compares the next epoch with the new
topology's own epoch in order (nothing sorted). Ranks are simulated in one process (one dataset
and DataLoader per rank, states merged as the tracker's gather does). The pure leftover
arithmetic gets a hypothesis property test.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robo_resume import CURSOR_KEY, ChunkedEpisodeDataset, ResumeStateError
from robo_resume.index.elastic import Level, build_layout, leftover, replan, stream_lengths
from robo_resume.index.plan import EpisodeSpan, make_chunks
from robo_resume.index.schedule import ScheduleConfig, Topology
from robo_resume.state import ResumeState, StreamCursor

LENGTHS = (23, 41, 17, 30, 9, 26)
KW = dict(seed=3, chunk_frames=8)


@pytest.fixture(scope="module")
def root(factory):
    return factory(episode_lengths=LENGTHS, num_cameras=0).root


def make(root, **kw):
    return ChunkedEpisodeDataset(root, **{**KW, **kw})


def run(ds, *, num_workers, epochs=1, stop_after=None):
    """Consume ``epochs`` iterations; return ``[(iteration, cursor epochs, indices)]``, state."""
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=num_workers)
    out = []
    for it in range(epochs):
        for batch in loader:
            epochs_of = batch[CURSOR_KEY][:, 3].tolist()
            out.append((it, epochs_of, tracker.consume(batch)["index"].tolist()))
            if stop_after is not None and len(out) == stop_after:
                return out, tracker.state_dict()
    return out, (tracker.state_dict() if out else None)


def run_ranks(root, world_size, *, num_workers, state=None, **kw):
    """One dataset and DataLoader per rank (lockstep as under DDP); the merged state."""
    runs, how = [], _run_kw(kw)
    for rank in range(world_size):
        ds = make(root, rank=rank, world_size=world_size, resume_state=state, **kw)
        runs.append(run(ds, num_workers=num_workers, **how))
    merged = None
    for _, s in runs:
        if s is not None:
            part = ResumeState.from_dict(s)
            merged = part if merged is None else merged.merged(part)
    return [r for r, _ in runs], (merged.to_dict() if merged else None)


def _run_kw(kw):
    return {k: kw.pop(k) for k in ("epochs", "stop_after") if k in kw}


def frames(batches, iteration=None):
    return [i for it, _, b in batches if iteration in (None, it) for i in b]


def epoch_frames(root, *, batch_size, world_size, num_workers, epoch, **kw):
    """Counter of the frames of one epoch of a topology (all ranks), from the pure schedule."""
    sched = make(root, batch_size=batch_size, **kw).schedule(num_workers)
    sched = type(sched)(sched.chunks, sched.config, Topology(world_size, num_workers))
    out = Counter()
    for g in range(sched.topology.num_streams):
        out.update(sched.frame_indices(epoch, g).tolist())
    return out


def epoch_batches(ds, num_workers, epoch):
    """The batches (in DataLoader order) of a normal epoch of this rank, from the schedule."""
    sched, b = ds.schedule(num_workers), ds.batch_size
    topo = sched.topology
    per = []
    for w in range(topo.workers_per_rank):
        idx = sched.frame_indices(epoch, topo.stream_id(ds.rank, w)).tolist()
        per.append([idx[k : k + b] for k in range(0, len(idx), b)])
    return [p[k] for k in range(len(per[0])) for p in per]


def test_workers_4_to_3_to_1_two_crashes(root, caplog):
    caplog.set_level(logging.INFO, logger="robo_resume")
    want = epoch_frames(root, batch_size=7, world_size=1, num_workers=4, epoch=0)
    before, s1 = run(make(root, batch_size=7), num_workers=4, stop_after=5)
    assert "elastic" not in caplog.text
    # Crash during the remainder epoch of 3 workers, then resume it with 1 stream.
    ds3 = make(root, batch_size=7, resume_state=s1)
    mid, s2 = run(ds3, num_workers=3, stop_after=4)
    assert s2["elastic"]["epoch"] == 0 and s2["elastic"]["origin"][0]["num_workers"] == 4
    assert "elastic re-partition from world_size=1 num_workers=4" in caplog.text
    ds1 = make(root, batch_size=7, resume_state=s2)
    after, s3 = run(ds1, num_workers=0, epochs=2)
    got = frames(before) + frames(mid) + frames(after, 0)
    assert Counter(got) == want  # the interrupted epoch: every frame exactly once
    assert len(got) == sum(want.values()) == 144
    # The next epoch is a normal epoch of the new topology, in order.
    assert [b for it, _, b in after if it == 1] == epoch_batches(ds1, 0, 1)
    assert s3["elastic"] is None  # the chain is dropped once the remainder epoch is over
    # A crash inside the remainder epoch resumed with the same topology continues in order.
    whole, _ = run(make(root, batch_size=7, resume_state=s1), num_workers=3)
    rest, _ = run(make(root, batch_size=7, resume_state=s2), num_workers=3)
    assert [b for *_, b in mid + rest] == [b for *_, b in whole]


@pytest.mark.parametrize("extra", [0, 1])
def test_crash_at_epoch_boundary_and_one_batch_after(root, extra):
    """At the boundary nothing is left (a normal epoch follows); one batch after, epoch 1 is."""
    ds2 = make(root, batch_size=7)
    per_epoch = ds2.batches_per_epoch(2)
    before, state = run(ds2, num_workers=2, epochs=2, stop_after=per_epoch + extra)
    ds0 = make(root, batch_size=5, resume_state=state)
    after, _ = run(ds0, num_workers=0, epochs=2)
    if extra == 0:
        assert ds0.layout(0).remainder is None
        assert [b for it, _, b in after if it == 0] == epoch_batches(ds0, 0, 1)
        assert [b for it, _, b in after if it == 1] == epoch_batches(ds0, 0, 2)
        return
    want = epoch_frames(root, batch_size=7, world_size=1, num_workers=2, epoch=1)
    epoch1 = [i for _, e, b in before for i, x in zip(b, e, strict=True) if x == 1]
    assert Counter(epoch1 + frames(after, 0)) == want
    assert [b for it, _, b in after if it == 1] == epoch_batches(ds0, 0, 2)
    sizes = [len(b) for it, _, b in after if it == 0]
    assert all(n == 5 for n in sizes[:-1]) and 1 <= sizes[-1] <= 5


def test_batch_size_32_to_48(root):
    want = epoch_frames(root, batch_size=32, world_size=1, num_workers=0, epoch=0)
    before, state = run(make(root, batch_size=32), num_workers=0, stop_after=2)
    ds = make(root, batch_size=48, resume_state=state)
    after, _ = run(ds, num_workers=2, epochs=2)
    first = [b for it, _, b in after if it == 0]
    assert Counter(frames(before) + frames(after, 0)) == want
    left = sum(want.values()) - 64
    assert sum(len(b) for b in first) == left
    # Two streams, the same number of batches; a short batch only at a stream's end.
    assert [len(b) for b in first[:-2]] == [48] * (len(first) - 2)
    assert [b for it, _, b in after if it == 1] == epoch_batches(ds, 2, 1)


def test_ranks_2_to_3(root):
    """2 ranks x 1 stream crash, resume on 3 ranks x 2 workers: equal batch counts per rank."""
    want = epoch_frames(root, batch_size=6, world_size=2, num_workers=0, epoch=0)
    before, state = run_ranks(root, 2, num_workers=0, batch_size=6, stop_after=3)
    assert sorted((c[0], c[1]) for c in state["cursors"]) == [(0, 0), (1, 0)]
    after, _ = run_ranks(root, 3, num_workers=2, batch_size=6, state=state, epochs=2)
    counts = [sum(1 for it, _, _ in r if it == 0) for r in after]
    assert len(set(counts)) == 1, f"ranks yield different batch counts {counts}"
    got = [i for r in before for i in frames(r)] + [i for r in after for i in frames(r, 0)]
    assert Counter(got) == want
    for rank, r in enumerate(after):
        ds = make(root, batch_size=6, rank=rank, world_size=3)
        assert [b for it, _, b in r if it == 1] == epoch_batches(ds, 2, 1)


def test_infinite_streams_in_different_epochs(root):
    """Infinite mode: old streams stand in epochs 1 and 2; both epochs are completed once."""
    kw = dict(batch_size=7, infinite=True)
    ds = make(root, **kw)
    q = ds.schedule(3).frames_per_stream  # 48 frames per stream and epoch
    # 20 batches: roles 0 and 1 made 7 (49 frames: in epoch 1), role 2 made 6 (42: epoch 0).
    before, state = run(ds, num_workers=3, stop_after=20)
    assert q == 48 and sorted(c[2] for c in state["cursors"]) == [0, 1, 1], state["cursors"]
    consumed = frames(before)
    ds2 = make(root, resume_state=state, **kw)
    lay = ds2.layout(2)
    assert lay.epoch == 1
    rem = sum(lay.remainder.lengths)
    q2 = ds2.schedule(2).frames_per_stream
    n = -(-(max(lay.remainder.lengths) + q2) // 7) * 2 + 2
    after, _ = run(ds2, num_workers=2, stop_after=n)
    # The remainder (label 1) completes epochs 0 and 1 of the old topology exactly once.
    tagged = [(i, e) for _, es, b in after for i, e in zip(b, es, strict=True)]
    remainder = [i for i, e in tagged if e == 1]
    assert len(remainder) == rem
    want = epoch_frames(root, world_size=1, num_workers=3, epoch=0, **kw)
    want += epoch_frames(root, world_size=1, num_workers=3, epoch=1, **kw)
    assert Counter(consumed + remainder) == want
    # Epoch 2 is a normal epoch of the new topology (per stream, in order).
    sched = ds2.schedule(2)
    per_role = {0: [], 1: []}
    for k, (_, es, b) in enumerate(after):
        per_role[k % 2].extend(i for i, e in zip(b, es, strict=True) if e == 2)
    for role, got in per_role.items():
        assert got == sched.frame_indices(2, role).tolist()[: len(got)]
        assert len(got) > q2 // 2


def test_drop_last_drops_fewer_than_a_batch_per_rank_and_warns(root, caplog):
    caplog.set_level(logging.WARNING, logger="robo_resume")
    kw = dict(drop_last=True)
    want = epoch_frames(root, batch_size=7, world_size=1, num_workers=0, epoch=0, **kw)
    before, state = run(make(root, batch_size=7, **kw), num_workers=0, stop_after=3)
    after, _ = run(make(root, batch_size=10, resume_state=state, **kw), num_workers=0)
    got = Counter(frames(before) + frames(after))
    assert all(len(b) == 10 for *_, b in after)
    assert not got - want and max(got.values()) == 1  # nothing twice, nothing foreign
    dropped = sum((want - got).values())
    assert 0 < dropped < 10
    assert f"drop_last=True drops {dropped} of the" in caplog.text


# ----------------------------------------------------------------------------------- refusals
def test_refusals(root):
    _, state = run(make(root, batch_size=6, rank=0, world_size=2), num_workers=0, stop_after=2)
    # One rank's state alone cannot be re-partitioned: the other rank's leftover is unknown.
    ds = make(root, batch_size=6, rank=0, world_size=3, resume_state=state)
    with pytest.raises(
        ResumeStateError,
        match=r"lacks cursors of some ranks.*Found none for ranks \[1\].*Fix: save the state "
        r"with CursorTracker.state_dict\(\) on every rank",
    ):
        ds.start_point(0)
    # The same topology still needs this rank's own cursors only.
    assert make(root, batch_size=6, rank=0, world_size=2, resume_state=state).start_point(0)
    # Other options than the batch size are still checked.
    with pytest.raises(ResumeStateError, match=r"different 'seed'"):
        make(root, batch_size=6, seed=4, rank=0, world_size=2, resume_state=state)


def test_refuses_a_split_without_equal_batch_counts(root):
    """Fewer frames left than ranks: no exact split with equal batch counts; say how to go on."""
    ds = make(root, batch_size=7)
    q = ds.schedule(0).frames_per_stream
    state = ResumeState(ds.fingerprint, 1, 0, 20, (StreamCursor(0, 0, 0, q - 2),)).to_dict()
    bad = make(root, batch_size=7, rank=0, world_size=3, resume_state=state)
    with pytest.raises(
        ResumeStateError,
        match=r"Cannot re-partition the 2 frames left in epoch 0 exactly over 3 ranks.*Fix: "
        r"resume with the recorded topology \(world_size=1, num_workers=0, batch_size=7\)",
    ):
        bad.start_point(2)


def test_state_round_trip_and_v2_migration(root, caplog):
    _, state = run(make(root, batch_size=7), num_workers=0, stop_after=2)
    _, s2 = run(make(root, batch_size=5, resume_state=state), num_workers=0, stop_after=1)
    assert ResumeState.from_dict(s2).to_dict() == s2 and s2["version"] == 4
    v2 = {k: v for k, v in state.items() if k not in ("elastic", "kind")} | {"version": 2}
    caplog.set_level(logging.INFO, logger="robo_resume")
    assert ResumeState.from_dict(v2).to_dict() == state
    assert "from format version 2 to 4" in caplog.text
    with pytest.raises(ResumeStateError, match=r"Invalid resume state field 'elastic'"):
        ResumeState.from_dict({**s2, "elastic": {"epoch": 0, "origin": []}})


# ----------------------------------------------------------------------- pure arithmetic
@st.composite
def scenarios(draw):
    lengths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=8))
    spans, at = [], 0
    for e, n in enumerate(lengths):
        spans.append(EpisodeSpan(e, at, n))
        at += n
    chunks = make_chunks(spans, draw(st.integers(1, 12)))
    cfg = ScheduleConfig(
        seed=draw(st.integers(0, 5)),
        batch_size=1,
        drop_last=False,
        interleave=draw(st.integers(1, 4)),
        shuffle=draw(st.booleans()),
    )
    w0, n0, b0 = draw(st.integers(1, 3)), draw(st.integers(0, 3)), draw(st.integers(1, 9))
    topo = Topology(w0, n0)
    if sum(lengths) < topo.num_streams:
        w0, n0, topo = 1, 0, Topology(1, 0)
    infinite = draw(st.booleans())
    epoch = draw(st.integers(0, 2))
    return chunks, cfg, (w0, n0, b0), infinite, epoch, draw(st.randoms(use_true_random=False))


def _frames_of(layout, epoch, g, start, stop):
    out = []
    for grp, off in layout.iter_groups(epoch, g, start):
        idx = grp.global_indices()[off:].tolist()
        out.extend(idx[: max(0, stop - grp.position - off)] if stop is not None else idx)
        if stop is not None and grp.position + len(grp.order) >= stop:
            break
    return out


@settings(max_examples=30, deadline=None)
@given(scenarios(), st.integers(1, 3), st.integers(0, 3), st.integers(1, 9))
def test_leftover_plus_consumed_is_the_epoch(scenario, w1, n1, b1):
    chunks, cfg, (w0, n0, b0), infinite, epoch, rnd = scenario
    old = Level(w0, n0, b0)
    lay0 = build_layout(chunks, cfg, [old], infinite=infinite)
    s0 = old.topology.num_streams
    q = lay0.schedule.frames_per_stream
    # Random cursors: in epoch `epoch`, or (infinite) some streams already in epoch + 1.
    cursors = []
    for g in range(s0):
        e = epoch + (infinite and rnd.random() < 0.3)
        cursors.append(
            (
                g // old.topology.workers_per_rank,
                g % old.topology.workers_per_rank,
                e,
                rnd.randint(0, q),
            )
        )
    old = Level(w0, n0, b0, tuple(cursors))
    x = max(c[2] for c in cursors)
    consumed, want = Counter(), Counter()
    for g, (_, _, e, p) in enumerate(cursors):
        for ep in range(epoch, x + 1):
            want.update(lay0.schedule.frame_indices(ep, g).tolist())
        for ep in range(epoch, e):
            consumed.update(lay0.schedule.frame_indices(ep, g).tolist())
        consumed.update(lay0.schedule.frame_indices(e, g, 0, p).tolist())
    have = {g: (c[2], c[3]) for g, c in enumerate(cursors)}
    left = Counter()
    for seg in leftover(lay0, have, x):
        left.update(range(seg.dataset_from_index, seg.dataset_from_index + seg.length))
    assert consumed + left == want
    assert not set(left) & set(consumed) or any(v > 1 for v in want.values())
    new = Level(w1, n1, b1)
    if new.topology.num_streams > sum(c.length for c in chunks):
        return  # no schedule at all for that many streams (refused like a fresh start)
    total = sum(left.values())
    lengths = stream_lengths(total, new.topology, b1, infinite=infinite, drop_last=False)
    if lengths is None:
        assert not infinite and new.world_size > 1
        return
    assert sum(lengths) == total
    if not infinite:  # equal batch counts per rank, a short batch only at a stream's end
        wp = new.topology.workers_per_rank
        per_rank = {sum(-(-n // b1) for n in lengths[r * wp : (r + 1) * wp]) for r in range(w1)}
        assert len(per_rank) == 1
    rp = replan(chunks, cfg, [old], new, infinite=infinite)
    if rp.layout.remainder is None:
        # No remainder epoch: nothing is left, or nothing of epoch x was consumed yet (every
        # stream at its start; the new topology plays epoch x whole). Hypothesis found the
        # second case (one stream at (1, 0) in infinite mode), which the former check
        # `total in (0, sum(want))` wrongly counted as a loss.
        at_start = [(e, p) == (x, 0) or (e == x - 1 and p >= q) for _, _, e, p in cursors]
        assert total == 0 or all(at_start), (total, cursors)
        return
    # The remainder epoch emits exactly the leftover; then a second hop 1 level deeper.
    rem = rp.layout.remainder
    got = Counter()
    for g in range(new.topology.num_streams):
        got.update(_frames_of(rp.layout, x, g, 0, None))
    assert got == left
    pos = [rnd.randint(0, n) for n in rem.lengths]
    wp1 = new.topology.workers_per_rank
    mid = Level(w1, n1, b1, tuple((g // wp1, g % wp1, x, p) for g, p in enumerate(pos)), x)
    done = Counter()
    for g, p in enumerate(pos):
        done.update(_frames_of(rp.layout, x, g, 0, p))
    lay1 = build_layout(chunks, cfg, [old, mid], infinite=infinite)
    left2 = Counter()
    for seg in leftover(lay1, {g: (x, p) for g, p in enumerate(pos)}, x):
        left2.update(range(seg.dataset_from_index, seg.dataset_from_index + seg.length))
    assert done + left2 == left
    assert np.all(np.array(rem.lengths) >= 0)
