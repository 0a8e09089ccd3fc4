"""Cluster scale, simulated: 1,024 ranks x 8 workers over a 10^6-episode plan (issue 15 item 2).

Pure arithmetic, no data files: the schedule is pure, so exactly-once can be counted. A run of
1,024 ranks x 8 workers stops at a seeded random step, resumes elastically on 768 ranks x 6
workers (the real :func:`robo_resume.index.elastic.replan`, as the dataset does), stops again at
a random step of the remainder epoch, and resumes on 2,048 ranks x 4 workers, which finishes the
epoch. Every frame each run consumed is counted (``np.bincount`` over global indices of the
consumed intervals): every frame the epoch's streams hold is consumed exactly once, the frames the
epoch drops (tail "drop") never; and in every run every rank yields the same number of batches
(DDP).

What a run consumed is taken from the definition of the stream order, not from the leftover code
under test: a stream at position ``p`` has emitted every segment of the groups before the group
holding ``p``, and in that group, per segment, the count of its label in ``group.order[:offset]``.
"""

from __future__ import annotations

import numpy as np
import pytest

from robo_resume.index.elastic import Level, replan
from robo_resume.index.plan import EpisodeSpans, make_chunks
from robo_resume.index.schedule import Schedule, ScheduleConfig, Topology
from robo_resume.index.start import resume_point, worker_batches_done

EPISODES = 10**6
BATCH = 4
HOPS = ((1024, 8), (768, 6), (2048, 4))


def _plan():
    rng = np.random.default_rng(15)
    lengths = rng.integers(1, 24, EPISODES)
    spans = EpisodeSpans(np.arange(EPISODES), np.cumsum(lengths) - lengths, lengths)
    return make_chunks(spans, 16), int(lengths.sum())


def _emitted(segs, starts, group, interleave, position):
    """(first, stop) global-index intervals a stream emitted before ``position``."""
    if position == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    g = int(np.searchsorted(starts, position, side="right")) - 1
    full = segs[: g * interleave]
    lo, hi = [full.dataset_from_index], [full.dataset_from_index + full.lengths]
    if position > starts[g]:
        grp = group(g)
        done = np.bincount(grp.order[: position - int(starts[g])], minlength=len(grp.segments))
        first = np.array([s.dataset_from_index for s in grp.segments], dtype=np.int64)
        lo.append(first)
        hi.append(first + done)
    return np.concatenate(lo), np.concatenate(hi)


def _group_starts(segs, interleave):
    lengths = segs.lengths
    sums = np.add.reduceat(lengths, np.arange(0, len(lengths), interleave)) if len(lengths) else []
    return np.concatenate(([0], np.cumsum(sums, dtype=np.int64)))


def _count(total, intervals):
    """How often each global index is inside one of the ``(lo, hi)`` intervals."""
    lo = np.concatenate([a for a, _ in intervals])
    hi = np.concatenate([b for _, b in intervals])
    keep = hi > lo
    d = np.bincount(lo[keep], minlength=total + 1) - np.bincount(hi[keep], minlength=total + 1)
    return np.cumsum(d)[:total]


def _equal_rank_batches(lengths, world_size, workers):
    per_stream = -(-np.asarray(lengths) // BATCH)
    per_rank = per_stream.reshape(world_size, workers).sum(axis=1)
    assert per_rank.min() == per_rank.max(), (per_rank.min(), per_rank.max())
    return int(per_rank[0])


@pytest.mark.slow(20)
def test_three_elastic_hops_at_cluster_scale_consume_every_frame_once():
    rnd = np.random.default_rng(2026)
    chunks, total = _plan()
    config = ScheduleConfig(seed=7, batch_size=BATCH, interleave=4)
    (w1, n1), (w2, n2), (w3, n3) = HOPS

    # Run 1: 1,024 x 8 from the epoch start, stopped after a random number of batches per rank.
    sched = Schedule(chunks, config, Topology(w1, n1))
    n_batches = _equal_rank_batches(sched.stream_frames, w1, n1)
    assert n_batches == sched.batches_per_rank
    step1 = int(rnd.integers(1, n_batches))
    cursors1, consumed = [], []
    for rank in range(w1):
        rp = resume_point(sched, step1, infinite=False, rank=rank)
        for role, start in enumerate(rp.starts):
            cursors1.append((rank, role, start.epoch, start.position))
    for g, (_, _, epoch, position) in enumerate(cursors1):
        assert epoch == 0
        segs = sched.segments(0, g)
        consumed.append(
            _emitted(
                segs,
                _group_starts(segs, config.interleave),
                lambda i, g=g: sched.group(0, g, i),
                config.interleave,
                position,
            )
        )
    level1 = Level(w1, n1, BATCH, tuple(cursors1))

    # Run 2: 768 x 6 plays the remainder epoch, stopped at a random step of it.
    rp2 = replan(chunks, config, [level1], Level(w2, n2, BATCH), infinite=False)
    rem2 = rp2.layout.remainder
    assert rem2 is not None and rp2.epoch == 0 and rp2.dropped == 0
    n2_batches = _equal_rank_batches(rem2.lengths, w2, n2)
    step2 = int(rnd.integers(1, n2_batches))
    cursors2 = []
    for g, length in enumerate(rem2.lengths):
        rank, role = divmod(g, n2)
        position = min(worker_batches_done(step2, n2, role) * BATCH, length)
        cursors2.append((rank, role, 0, position))
        segs = rem2.segments(g)
        consumed.append(
            _emitted(
                segs,
                _group_starts(segs, config.interleave),
                lambda i, g=g: rem2.group(g, i),
                config.interleave,
                position,
            )
        )
    level2 = Level(w2, n2, BATCH, tuple(cursors2), epoch=0)

    # Run 3: 2,048 x 4 finishes the epoch.
    rp3 = replan(chunks, config, [level1, level2], Level(w3, n3, BATCH), infinite=False)
    rem3 = rp3.layout.remainder
    assert rem3 is not None and rp3.epoch == 0 and rp3.dropped == 0
    _equal_rank_batches(rem3.lengths, w3, n3)
    for g in range(w3 * n3):
        segs = rem3.segments(g)
        consumed.append((segs.dataset_from_index, segs.dataset_from_index + segs.lengths))

    counts = _count(total, consumed)
    assert counts.max() == 1
    # The frames never consumed are exactly those the epoch drops: past S * Q in its order.
    perm, offsets = sched._epoch_layout(0)
    cut = w1 * n1 * sched.frames_per_stream
    k = int(np.searchsorted(offsets, cut, side="right")) - 1
    cid = perm[k:]  # the chunk holding position `cut` (from its offset in it on) and all after
    first = chunks.dataset_from_index[cid]
    skip = np.zeros(len(cid), dtype=np.int64)
    skip[:1] = cut - offsets[k]
    dropped = [(first + skip, first + chunks.stop[cid] - chunks.start[cid])]
    never = _count(total, dropped)
    assert np.array_equal(counts, 1 - never), (int(counts.sum()), total, int(never.sum()))
    assert int(counts.sum()) == cut
