"""The columnar plan and schedule give exactly what the object-based ones gave (issue 15).

``tests/fixtures/plan_golden.json`` holds digests computed by the object-based implementation
(main at ff53b37, before the plan became columns) over seeded random cases: plan fingerprints,
every stream's groups (segments, interleave order, positions), located cursors, and elastic
remainder epochs two hops deep. The current code must reproduce every digest. Regenerate only
for an intended change of order (which breaks saved resume states):
``python tests/test_plan_golden.py --write``.

Cases with cut points plan with :func:`old_cut_chunks`, the cut rule of that time (kf-chunks
changed make_chunks' rule: tests/test_keyframe_chunks.py), so that their schedules are still
checked against the golden digests.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import sys
from pathlib import Path

import pytest

from robo_resume.errors import ResumeStateError
from robo_resume.index.elastic import Level, build_layout, replan
from robo_resume.index.plan import Chunk, EpisodeSpan, Plan, make_chunks, plan_fingerprint
from robo_resume.index.schedule import Schedule, ScheduleConfig, Topology
from robo_resume.index.start import resume_point

GOLDEN = Path(__file__).parent / "fixtures" / "plan_golden.json"
CASES = 60


def _case(i: int):
    rnd = random.Random(1000 + i)
    n = rnd.choice([1, 2, 5, 13, 40, 150])
    lengths = [rnd.randint(1, rnd.choice([3, 30, 200])) for _ in range(n)]
    spans, at, e = [], rnd.randint(0, 50), rnd.randint(0, 3)
    for length in lengths:
        spans.append(EpisodeSpan(e, at, length))
        at += length + rnd.choice([0, 0, 7])  # selections leave gaps in the global index
        e += rnd.choice([1, 1, 2])
    chunk_frames = rnd.choice([1, 3, 8, 16, 64])
    cuts = None
    if rnd.random() < 0.4:
        cuts = {
            s.episode_index: sorted(rnd.sample(range(-2, s.length + 3), rnd.randint(0, 6)))
            for s in spans
            if rnd.random() < 0.8
        }
    seed, batch_size, drop_last = rnd.randint(0, 2**32), rnd.randint(1, 9), rnd.random() < 0.3
    tail = rnd.choice(["drop", "drop", "pad", "keep"])
    config = ScheduleConfig(
        seed=seed,
        batch_size=batch_size,
        drop_last=drop_last and tail != "keep",
        tail=tail,
        interleave=rnd.randint(1, 5),
        shuffle=rnd.random() < 0.85,
    )
    topo = Topology(rnd.randint(1, 3), rnd.randint(0, 3))
    return rnd, spans, chunk_frames, cuts, config, topo


def old_cut_chunks(episodes, chunk_frames, cut_points) -> Plan:
    """make_chunks' cut rule before kf-chunks: end at the last cut point in reach, else after
    ``chunk_frames`` frames."""
    chunks = []
    for ep in episodes:
        cuts = sorted(cut_points.get(ep.episode_index, ()))
        start = 0
        while start < ep.length:
            limit = min(start + chunk_frames, ep.length)
            stop = limit
            if cuts and limit < ep.length:
                j = bisect.bisect_right(cuts, limit) - 1
                if j >= 0 and cuts[j] > start:
                    stop = cuts[j]
            chunks.append(Chunk(ep.episode_index, start, stop, ep.dataset_from_index + start))
            start = stop
    return Plan.from_chunks(chunks)


def _segment(s) -> list:
    return [s.chunk_id, s.episode_index, s.start, s.stop, s.dataset_from_index, s.epoch]


def _layout_digest(h, layout, epoch: int, streams: int) -> None:
    for g in range(streams):
        h.update(f"stream {g} length {layout.length(epoch, g)};".encode())
        for grp, off in layout.iter_groups(epoch, g, 0):
            h.update(json.dumps([[_segment(s) for s in grp.segments], grp.position, off]).encode())
            h.update(grp.order.astype("<i8").tobytes())


def digest(i: int) -> dict:
    """Digests of case ``i`` (see the module docstring)."""
    rnd, spans, chunk_frames, cuts, config, topo = _case(i)
    if cuts:
        chunks = old_cut_chunks(spans, chunk_frames, cuts)
    else:
        chunks = make_chunks(spans, chunk_frames, cut_points=cuts)
    out = {"plan": plan_fingerprint(chunks), "chunks": len(chunks)}
    try:
        sched = Schedule(chunks, config, topo)
    except ValueError as exc:
        out["schedule"] = str(exc)
        return out
    h = hashlib.sha256()
    h.update(json.dumps([sched.stream_frames, sched.batches_per_rank]).encode())
    for epoch in (0, 2):
        for g in range(topo.num_streams):
            h.update(f"stream {g};".encode())
            for grp, _off in sched.iter_groups(epoch, g, 0):
                h.update(json.dumps([[_segment(s) for s in grp.segments], grp.position]).encode())
                h.update(grp.order.astype("<i8").tobytes())
            n = sched.length(g)
            for p in sorted({0, n // 3, n // 2, n - 1}):
                if 0 <= p < n:
                    c = sched.locate(epoch, g, p)
                    h.update(json.dumps([c.group, c.offset, list(c.done)]).encode())
            h.update(sched.frame_indices(epoch, g, n // 4, n // 2 + 1).astype("<i8").tobytes())
    for r in range(topo.world_size):
        for batches in (0, 1, 5, 37):
            rp = resume_point(sched, batches, infinite=False, rank=r)
            h.update(repr(rp).encode())
    out["schedule"] = h.hexdigest()
    if config.tail == "keep":
        return out
    # Elastic: random cursors, two hops, each remainder epoch digested whole.
    infinite = rnd.random() < 0.3
    q = sched.frames_per_stream
    wp = topo.workers_per_rank
    epoch = rnd.randint(0, 1)
    old = Level(
        topo.world_size,
        topo.num_workers,
        config.batch_size,
        tuple(
            (g // wp, g % wp, epoch + (infinite and rnd.random() < 0.3), rnd.randint(0, q))
            for g in range(topo.num_streams)
        ),
    )
    new = Level(rnd.randint(1, 3), rnd.randint(0, 3), rnd.randint(1, 9))
    try:
        rp = replan(chunks, config, [old], new, infinite=infinite)
    except (ResumeStateError, ValueError) as exc:
        out["elastic"] = f"{type(exc).__name__}: {exc}"
        return out
    h = hashlib.sha256()
    h.update(json.dumps([rp.epoch, rp.total, rp.dropped, rp.layout.epoch]).encode())
    streams = new.topology.num_streams
    if rp.layout.remainder is not None:
        x = rp.layout.epoch
        _layout_digest(h, rp.layout, x, streams)
        lengths = rp.layout.remainder.lengths
        wp1 = new.topology.workers_per_rank
        mid = Level(
            new.world_size,
            new.num_workers,
            new.batch_size,
            tuple((g // wp1, g % wp1, x, rnd.randint(0, n)) for g, n in enumerate(lengths)),
            x,
        )
        again = build_layout(chunks, config, [old, mid], infinite=infinite)
        _layout_digest(h, again, x, streams)
        third = Level(rnd.randint(1, 3), rnd.randint(0, 3), rnd.randint(1, 9))
        try:
            rp2 = replan(chunks, config, [old, mid], third, infinite=infinite)
            h.update(json.dumps([rp2.epoch, rp2.total, rp2.dropped, rp2.layout.epoch]).encode())
            if rp2.layout.remainder is not None:
                _layout_digest(h, rp2.layout, rp2.layout.epoch, third.topology.num_streams)
        except (ResumeStateError, ValueError) as exc:
            h.update(f"{type(exc).__name__}: {exc}".encode())
    out["elastic"] = h.hexdigest()
    return out


@pytest.mark.parametrize("i", range(CASES))
def test_same_as_object_based_implementation(i):
    golden = json.loads(GOLDEN.read_text())
    assert digest(i) == golden[str(i)]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps({str(i): digest(i) for i in range(CASES)}, indent=1) + "\n")
