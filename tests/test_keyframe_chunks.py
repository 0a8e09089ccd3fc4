"""Chunks that start on keyframes: the cut rule of make_chunks (pure, no video)."""

from __future__ import annotations

import numpy as np
import pytest

from robo_resume.index.plan import EpisodeSpan, make_chunks


def spans(*lengths: int) -> list[EpisodeSpan]:
    out, at = [], 0
    for e, n in enumerate(lengths):
        out.append(EpisodeSpan(e, at, n))
        at += n
    return out


def bounds(plan, e: int = 0) -> list[tuple[int, int]]:
    return [(c.start, c.stop) for c in plan if c.episode_index == e]


def reference(n: int, chunk_frames: int, cuts) -> list[tuple[int, int]]:
    """The rule of make_chunks' docstring, one chunk at a time."""
    keys = sorted({c for c in cuts if 0 < c < n})
    out, start = [], 0
    while start < n:
        reach = [c for c in keys if start < c <= start + chunk_frames]
        later = [c for c in keys if c > start]
        if start + chunk_frames >= n:
            stop = n
        elif reach:
            stop = reach[-1]
        else:
            stop = later[0] if later else n
        out.append((start, stop))
        start = stop
    return out


def test_gop_longer_than_chunk_extends_to_the_next_keyframe():
    # 300 frames, keyframes every 250 (dataset (c) of the benchmarks), chunk_frames 64.
    plan = make_chunks(spans(300), 64, cut_points={0: [0, 250]})
    assert bounds(plan) == [(0, 250), (250, 300)]


def test_gop_shorter_than_chunk_cuts_at_the_last_keyframe_in_reach():
    plan = make_chunks(spans(130), 64, cut_points={0: list(range(0, 130, 12))})
    assert bounds(plan) == [(0, 60), (60, 120), (120, 130)]


def test_episode_starting_mid_gop():
    # An episode of a concatenated file whose keyframes fall at 6, 18, 30, ... of it.
    plan = make_chunks(spans(41), 16, cut_points={0: [6, 18, 30]})
    assert bounds(plan) == [(0, 6), (6, 18), (18, 30), (30, 41)]
    # gop 100 > chunk 16, first keyframe of the episode at 70: the first chunk runs up to it.
    plan = make_chunks(spans(120), 16, cut_points={0: [70]})
    assert bounds(plan) == [(0, 70), (70, 120)]


def test_irregular_keyframes():
    cuts = [0, 5, 90, 100, 101, 230]
    plan = make_chunks(spans(260), 64, cut_points={0: cuts})
    assert bounds(plan) == [(0, 5), (5, 90), (90, 101), (101, 230), (230, 260)]
    assert bounds(plan) == reference(260, 64, cuts)


def test_episode_shorter_than_a_gop_is_one_chunk():
    plan = make_chunks(spans(200, 30), 64, cut_points={0: [0], 1: []})
    assert bounds(plan, 0) == [(0, 200)]
    assert bounds(plan, 1) == [(0, 30)]


def test_episodes_without_cut_points_are_cut_evenly():
    plan = make_chunks(spans(300, 150), 64, cut_points={0: [250]})
    assert bounds(plan, 0) == [(0, 250), (250, 300)]
    assert bounds(plan, 1) == [(0, 64), (64, 128), (128, 150)]
    assert [c.dataset_from_index for c in plan] == [0, 250, 300, 364, 428]


def test_every_chunk_after_the_first_starts_on_a_cut_point_random():
    rng = np.random.default_rng(7)
    for _ in range(40):
        lengths = rng.integers(1, 400, size=int(rng.integers(1, 12))).tolist()
        cf = int(rng.integers(1, 80))
        gop = int(rng.integers(1, 300))
        cuts, at = {}, 0
        for e, n in enumerate(lengths):
            phase = int(rng.integers(0, gop))
            cuts[e] = [c for c in range(-phase, n, gop) if c >= 0]
            if rng.random() < 0.3:  # irregular: drop some keyframes
                cuts[e] = [c for c in cuts[e] if rng.random() < 0.6]
            at += n
        plan = make_chunks(spans(*lengths), cf, cut_points=cuts)
        for e, n in enumerate(lengths):
            got = bounds(plan, e)
            assert got == reference(n, cf, cuts[e]), (lengths, cf, gop, e)
            keys = set(cuts[e])
            assert all(a in keys for a, _ in got[1:])
        assert sum(c.length for c in plan) == sum(lengths)


def test_cut_plan_stays_vectorised_at_many_episodes():
    n = 100_000
    lengths = np.full(n, 300, dtype=np.int64)
    from robo_resume.index.plan import EpisodeSpans

    sp = EpisodeSpans(np.arange(n), np.cumsum(lengths) - lengths, lengths)
    plan = make_chunks(sp, 64, cut_points={e: [0, 250] for e in range(n)})
    assert len(plan) == 2 * n
    assert plan.start[1] == 250 and plan.stop[0] == 250


@pytest.mark.parametrize("cf", [1, 7, 64])
def test_without_cut_points_unchanged(cf):
    plan = make_chunks(spans(100, 3), cf)
    assert all(c.length == cf for c in plan if c.stop not in (100, 3))


def test_remote_keyframe_reads_run_ahead_in_order_and_raise_at_their_file():
    """A remote dataset's files are read a few at once (format.keyframes._in_order): results
    come in file order, an error is raised where its file's result is taken, and a consumer
    that stops early leaves at most ``ahead`` reads started."""
    import threading
    import time

    from robo_resume.format.keyframes import _in_order

    started, lock = [], threading.Lock()

    def fn(i):
        with lock:
            started.append(i)
        time.sleep(0.01 * (5 - i % 5))  # later items finish first
        if i == 6:
            raise OSError(f"file {i} is gone")
        return i * 10

    calls = _in_order(fn, list(range(10)), 3)
    got = [next(calls)() for _ in range(6)]
    assert got == [0, 10, 20, 30, 40, 50]
    with pytest.raises(OSError, match="file 6 is gone"):
        next(calls)()
    calls.close()  # the consumer stops: the reads not started are not started
    assert len(started) <= 9
    assert [c() for c in _in_order(fn, [1, 2], 0)] == [10, 20]  # ahead 0: inline
