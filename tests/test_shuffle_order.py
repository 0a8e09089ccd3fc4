"""The shuffle order (the default): windows of short chunks, their frames uniformly shuffled.

What is checked here, against ground truth and the pure schedule (never against the loader's own
bookkeeping): the schedule's windows and their permutation, the leftover of a partly emitted
window, the loader's batches (order and values) in 0 and 2 workers, resume inside a window, the
held frames' bound, failures and skips, and the knobs' errors. The generic resume harness
(tests/test_resume.py) and the lerobot conformance tests run with the default order too.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter

import numpy as np
import pytest
import torch

from robo_resume import ChunkedEpisodeDataset, LeRobotReader, ResumeStateError, StreamTuning
from robo_resume.audit import consume
from robo_resume.format import frame_store as window_store
from robo_resume.index.groups import group_bounds, group_frames, make_group
from robo_resume.index.schedule import Schedule, ScheduleConfig, Segment, Topology
from robo_resume.stream import window_read
from robo_resume.testing import expected_action, expected_state

LENGTHS = (23, 41, 17, 30, 9, 35)


def _indices(batches) -> list[list[int]]:
    return [b for _, b in batches]


# -- the schedule ------------------------------------------------------------------------------


def test_windows_cut_by_frames_and_cover_every_segment_once():
    lengths = np.array([2, 2, 1, 2, 12, 2, 2, 2, 2, 1, 2], dtype=np.int64)
    bounds = group_bounds(lengths, interleave=4, window=5)
    assert bounds[0] == 0 and bounds[-1] == len(lengths) and np.all(np.diff(bounds) > 0)
    before = np.cumsum(lengths) - lengths
    for a, b in itertools.pairwise(bounds.tolist()):
        ids = before[a:b] // 5
        assert len(set(ids.tolist())) == 1  # one window number per group
        assert lengths[a:b].sum() <= 5 + lengths[b - 1] - 1
    # by count when window is 0, as the interleave order always was
    assert group_bounds(lengths, interleave=4, window=0).tolist() == [0, 4, 8, 11]


def test_shuffle_emits_every_frame_of_a_window_once_in_a_seeded_order():
    lengths = [2, 5, 1, 3]
    a = group_frames(lengths, "shuffle", np.random.default_rng(7))
    b = group_frames(lengths, "shuffle", np.random.default_rng(7))
    c = group_frames(lengths, "shuffle", np.random.default_rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[1], c[1]) or not np.array_equal(a[0], c[0])
    pairs = sorted(zip(a[0].tolist(), a[1].tolist(), strict=True))
    assert pairs == [(j, f) for j, n in enumerate(lengths) for f in range(n)]
    # frames of one segment come in any order (not only in frame order)
    orders = {
        tuple(group_frames([6], "shuffle", np.random.default_rng(s))[1].tolist()) for s in range(5)
    }
    assert len(orders) > 1
    # unshuffled: segment after segment, frame after frame
    labels, offsets = group_frames(lengths, "shuffle", None)
    assert labels.tolist() == [0, 0, 1, 1, 1, 1, 1, 2, 3, 3, 3]
    assert offsets.tolist() == [0, 1, 0, 1, 2, 3, 4, 0, 0, 1, 2]


@pytest.mark.parametrize("mode", ["shuffle", "random", "spread"])
def test_leftover_is_every_frame_not_yet_emitted_as_contiguous_runs(mode):
    segs = tuple(
        Segment(
            chunk_id=i, episode_index=i, start=10 * i, stop=10 * i + n, dataset_from_index=100 * i
        )
        for i, n in enumerate([4, 1, 6, 3])
    )
    group = make_group(segs, mode, np.random.default_rng(3), position=0)
    index = group.global_indices()
    assert sorted(index.tolist()) == sorted(
        s.dataset_from_index + f for s in segs for f in range(s.length)
    )
    for offset in range(len(index) + 1):
        rest = group.leftover(offset)
        starts, sizes = rest.dataset_from_index.tolist(), rest.lengths.tolist()
        left = [d + f for d, n in zip(starts, sizes, strict=True) for f in range(n)]
        assert Counter(left) == Counter(index[offset:].tolist()), offset
        assert (rest.lengths > 0).all()
        for r in range(len(rest)):  # a run lies inside its segment
            seg = segs[int(rest.chunk_id[r])]
            assert seg.start <= int(rest.start[r]) < int(rest.stop[r]) <= seg.stop
            assert (
                int(rest.dataset_from_index[r]) - seg.dataset_from_index
                == int(rest.start[r]) - seg.start
            )


def test_schedule_epoch_is_exactly_once_and_windows_hold_at_most_their_frames(factory):
    ds = ChunkedEpisodeDataset(factory(episode_lengths=LENGTHS).root, batch_size=4, seed=2)
    assert ds.tuning.resolved_order == "shuffle" and ds.chunk_frames == 2
    assert ds.config.interleave_order == "shuffle" and ds.config.window == 1024
    config = ScheduleConfig(seed=2, batch_size=4, interleave_order="shuffle", window=16)
    sched = Schedule(ds.chunks, config, Topology(1, 3))
    seen: list[int] = []
    for stream in range(3):
        idx = sched.frame_indices(0, stream)
        seen += idx.tolist()
        for g in range(sched.num_groups(0, stream)):
            assert len(sched.group(0, stream, g).order) <= 16 + 2 - 1
    assert len(seen) == len(set(seen)) == sched.frames_per_stream * 3
    # another epoch, another order; the same seed, the same order
    assert not np.array_equal(sched.frame_indices(0, 0), sched.frame_indices(1, 0))
    again = Schedule(ds.chunks, config, Topology(1, 3))
    assert np.array_equal(sched.frame_indices(1, 2), again.frame_indices(1, 2))


# -- the loader --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_follow_the_schedule_and_equal_the_reference_items(factory, workers):
    fds = factory(episode_lengths=LENGTHS, num_cameras=2, fps=10)
    delta = {
        "action": [0.0, 0.1, 0.2],
        "observation.images.cam0": [-0.1, 0.0],
        "observation.images.cam1": [0.0],
    }
    ds = ChunkedEpisodeDataset(
        fds.root,
        batch_size=5,
        seed=3,
        image_dtype="uint8",
        delta_timestamps=delta,
        tuning=StreamTuning(shuffle_frames=24),
    )
    reader = LeRobotReader(fds.root, delta_timestamps=delta)
    sched = ds.schedule(workers)
    w = max(workers, 1)
    want = [sched.frame_indices(0, s).tolist() for s in range(w)]
    got: list[list[int]] = [[] for _ in range(w)]
    for k, batch in enumerate(ds.dataloader(num_workers=workers)):
        idx = batch["index"].tolist()
        got[k % w] += idx
        for r, i in enumerate(idx):
            item = reader[i]
            ep, f = int(item["episode_index"]), int(item["frame_index"])
            assert torch.equal(batch["observation.state"][r], item["observation.state"])
            assert np.array_equal(batch["observation.state"][r].numpy(), expected_state(ep, f, 4))
            assert torch.equal(batch["action"][r], item["action"])
            assert torch.equal(batch["action_is_pad"][r], item["action_is_pad"])
            assert np.array_equal(batch["action"][r][0].numpy(), expected_action(ep, f, 3))
            for cam in ("observation.images.cam0", "observation.images.cam1"):
                ref = (item[cam] * 255).round().to(torch.uint8)
                assert batch[cam][r].shape == ref.shape, cam
                assert torch.equal(batch[cam][r], ref), (cam, i)
            assert torch.equal(
                batch["observation.images.cam0_is_pad"][r], item["observation.images.cam0_is_pad"]
            )
    assert got == want
    flat = [i for part in got for i in part]
    assert len(flat) == len(set(flat))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("crash", [1, 3, 7])
def test_resume_inside_a_window_continues_the_uninterrupted_order(factory, workers, crash):
    root = factory(episode_lengths=LENGTHS, num_cameras=1).root

    def make(**kw):
        return ChunkedEpisodeDataset(
            root, batch_size=4, seed=5, tuning=StreamTuning(shuffle_frames=40), **kw
        )

    full, _ = consume(make, num_workers=workers, epochs=2)
    before, state = consume(make, num_workers=workers, epochs=2, stop_after=crash)
    after, _ = consume(
        make, num_workers=workers, epochs=2, stop_after=len(full) - crash, resume_state=state
    )
    assert _indices(before) + _indices(after) == _indices(full)
    # resume_step arithmetic lands on the same place
    step, _ = consume(
        make,
        num_workers=workers,
        epochs=2,
        stop_after=len(full) - crash,
        resume_step=crash * 4,
    )
    assert _indices(step) == _indices(after)


def test_elastic_resume_of_a_partly_emitted_window_is_exactly_once(factory):
    root = factory(episode_lengths=LENGTHS, num_cameras=1).root

    def make(**kw):
        return ChunkedEpisodeDataset(
            root, seed=1, tuning=StreamTuning(shuffle_frames=32, tail="keep"), **kw
        )

    full, _ = consume(make, num_workers=2, batch_size=4)
    everything = Counter(i for _, b in full for i in b)
    before, state = consume(make, num_workers=2, batch_size=4, stop_after=5)
    after, _ = consume(make, num_workers=3, batch_size=3, resume_state=state)
    got = Counter(i for _, b in before + after for i in b)
    assert got == everything


def test_held_frames_never_exceed_one_window(factory, monkeypatch):
    fds = factory(episode_lengths=LENGTHS, num_cameras=2)
    most: list[int] = []
    block = window_read.WindowRead._block

    def spy(self, i, n):
        out = block(self, i, n)
        most.append(sum(store.held for store in self.stores.values()))
        return out

    monkeypatch.setattr(window_read.WindowRead, "_block", spy)
    ds = ChunkedEpisodeDataset(
        fds.root, batch_size=4, seed=0, tuning=StreamTuning(shuffle_frames=20)
    )
    n = sum(len(b["index"]) for b in ds.dataloader(num_workers=0))
    assert n == ds.total_frames - ds.total_frames % 4 or n == ds.total_frames
    # 2 cameras, at most a window (20 frames + a chunk's tail) held per camera
    assert most and max(most) <= 2 * (20 + 1)
    assert most[-1] == 0  # the last window emitted whole: nothing held
    # the stores reuse their slots: memory for the peak, not for every frame read
    stores = ds.items._stores
    assert set(stores) == set(ds.meta.camera_keys)
    for store in stores.values():
        assert store.held == 0 and 0 < store.bytes <= 2 * max(most) * store._slot_bytes + (
            window_store.BLOCK_SLOTS * store._slot_bytes
        )


def test_a_missing_video_raises_with_the_window_named_or_is_skipped(factory, tmp_path):
    import shutil

    fds = factory(episode_lengths=LENGTHS, num_cameras=1, episodes_per_file=1, version="v2.1")
    root = tmp_path / "ds"
    shutil.copytree(fds.root, root)
    gone = next(root.glob("videos/*/observation.images.cam0/episode_000002.mp4"))
    gone.unlink()
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=0)
    with pytest.raises(
        Exception,
        match=r"episode_000002\.mp4.*of episode 2 \(chunk \d+, epoch 0, stream position \d+\)"
        r".*on_error='skip'",
    ):
        for _ in ds.dataloader(num_workers=0):
            pass
    skipped = ChunkedEpisodeDataset(root, batch_size=4, seed=0, on_error="skip")
    tracker = skipped.tracker()
    seen = []
    for batch in skipped.dataloader(num_workers=0):
        seen += tracker.consume(batch)["index"].tolist()
    ep2 = set(range(sum(LENGTHS[:2]), sum(LENGTHS[:3])))
    assert not ep2 & set(seen) and len(seen) == len(set(seen))
    assert set(seen) | ep2 >= set(range(skipped.total_frames - skipped.total_frames % 4))
    records = tracker.skipped
    assert records and all(r["episode"] == 2 and r["frame"] == r["start"] for r in records)
    assert sum(r["stop"] - r["frame"] for r in records) == LENGTHS[2]
    assert "episodes [2]" in tracker.skip_report()


# -- knobs, and states of the interleave order -------------------------------------------------


def test_knob_errors_say_what_belongs_to_which_order():
    with pytest.raises(ValueError, match=r"interleave and interleave_order belong to order="):
        StreamTuning(order="shuffle", interleave=32)
    with pytest.raises(ValueError, match=r"shuffle_frames belongs to order='shuffle'"):
        StreamTuning(order="interleave", shuffle_frames=64)
    with pytest.raises(ValueError, match=r"Unknown order.*'shuffle' or 'interleave'"):
        StreamTuning(order="uniform")
    with pytest.raises(ValueError, match=r"shuffle_frames must be a positive int"):
        StreamTuning(shuffle_frames=0)
    # the interleave knobs alone choose the interleave order; fast() is robo_resume 0.1's
    assert StreamTuning(interleave=32, interleave_order="spread").resolved_order == "interleave"
    assert StreamTuning().resolved_order == "shuffle"
    fast = StreamTuning.fast()
    assert fast.resolved_order == "interleave" and fast.chunk_frames(None) == 64
    assert StreamTuning().chunk_frames(None) == 2 and StreamTuning().chunk_frames(8) == 8
    assert StreamTuning.evaluation().resolved_order == "interleave"


def test_a_state_of_the_interleave_order_resumes_in_it_or_is_refused(factory, caplog):
    root = factory(episode_lengths=LENGTHS).root

    def fast(**kw):
        return ChunkedEpisodeDataset(root, batch_size=4, seed=1, tuning=StreamTuning.fast(), **kw)

    full, _ = consume(fast, num_workers=2, epochs=2)
    before, state = consume(fast, num_workers=2, epochs=2, stop_after=3)
    # the default dataset adopts the state's order and chunk length (as after an upgrade)
    with caplog.at_level(logging.INFO, logger="robo_resume"):
        resumed = ChunkedEpisodeDataset(root, batch_size=4, seed=1, resume_state=state)
    assert resumed.tuning.resolved_order == "interleave" and resumed.chunk_frames == 64
    assert "saved with the interleave order" in caplog.text
    after, _ = consume(
        lambda **kw: ChunkedEpisodeDataset(root, batch_size=4, seed=1, **kw),
        num_workers=2,
        epochs=2,
        stop_after=len(full) - 3,
        resume_state=state,
    )
    assert _indices(before) + _indices(after) == _indices(full)
    # an explicit order is honoured, so refused
    with pytest.raises(ResumeStateError, match=r"'order'.*StreamTuning\(order=\.\.\.\)"):
        ChunkedEpisodeDataset(
            root,
            batch_size=4,
            seed=1,
            tuning=StreamTuning(order="shuffle"),
            resume_state=state,
        )
    # and a state of the shuffle order is refused by an interleave dataset
    _, shuffled = consume(
        lambda **kw: ChunkedEpisodeDataset(root, batch_size=4, seed=1, **kw),
        num_workers=0,
        stop_after=2,
    )
    with pytest.raises(ResumeStateError, match=r"different '(order|plan)'"):
        fast(resume_state=shuffled)


# -- streams without video: single frames ------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_without_video_reads_single_frames_drawn_from_the_whole_epoch(factory, workers):
    fds = factory(episode_lengths=LENGTHS, num_cameras=1, fps=10)
    with_video = ChunkedEpisodeDataset(fds.root, batch_size=5, seed=3)
    assert with_video.chunk_frames == 2  # one GOP of lerobot's g=2 video
    delta = {"action": [0.0, 0.1, 0.2]}
    ds = ChunkedEpisodeDataset(
        fds.root,
        batch_size=5,
        seed=3,
        features={"observation.images.cam0": None},
        delta_timestamps=delta,
        tuning=StreamTuning(shuffle_frames=24),
    )
    assert ds.chunk_frames == 1
    assert (
        ChunkedEpisodeDataset(
            fds.root, batch_size=5, chunk_frames=2, features=["observation.state", "action"]
        ).chunk_frames
        == 2
    )  # an explicit value is kept
    sched = ds.schedule(workers)
    w = max(workers, 1)
    want = [sched.frame_indices(0, s).tolist() for s in range(w)]
    # single frames: consecutive frames of an episode are no longer emitted next to each other
    # as pairs; every window is a uniform sample of the epoch's frames
    pairs = sum(
        abs(a - b) == 1 for part in want for a, b in zip(part[::2], part[1::2], strict=False)
    )
    assert pairs < len(want[0]) // 4
    reader = LeRobotReader(fds.root, delta_timestamps=delta)
    got: list[list[int]] = [[] for _ in range(w)]
    for k, batch in enumerate(ds.dataloader(num_workers=workers)):
        idx = batch["index"].tolist()
        got[k % w] += idx
        assert "observation.images.cam0" not in batch
        for r, i in enumerate(idx):
            item = reader[i]
            ep, f = int(item["episode_index"]), int(item["frame_index"])
            assert np.array_equal(batch["observation.state"][r].numpy(), expected_state(ep, f, 4))
            assert torch.equal(batch["action"][r], item["action"])
            assert torch.equal(batch["action_is_pad"][r], item["action_is_pad"])
    assert got == [part[: len(g)] for part, g in zip(want, got, strict=True)]
    assert sum(map(len, got)) >= sum(LENGTHS) - w * 5  # the whole epoch, but for a short tail


def test_a_two_frame_state_of_a_stream_without_video_resumes_in_its_plan(factory, caplog):
    root = factory(episode_lengths=LENGTHS, num_cameras=1).root
    tabular = {"observation.images.cam0": None}

    def two(**kw):  # what the default was for such a stream before single frames
        return ChunkedEpisodeDataset(
            root, batch_size=4, seed=1, features=tabular, chunk_frames=2, **kw
        )

    def default(**kw):
        return ChunkedEpisodeDataset(root, batch_size=4, seed=1, features=tabular, **kw)

    full, _ = consume(two, num_workers=2, epochs=2)
    before, state = consume(two, num_workers=2, epochs=2, stop_after=3)
    with caplog.at_level(logging.INFO, logger="robo_resume"):
        resumed = default(resume_state=state)
    assert resumed.chunk_frames == 2
    assert "saved with chunks of 2 frames" in caplog.text
    after, _ = consume(
        default, num_workers=2, epochs=2, stop_after=len(full) - 3, resume_state=state
    )
    assert _indices(before) + _indices(after) == _indices(full)
    # the StatefulDataLoader hook adopts it too (main process)
    ds = default()
    ds.load_state_dict(two().state_dict())
    assert ds.chunk_frames == 2
    # a state of another chunk length is refused, naming the plan
    _, three = consume(
        lambda **kw: ChunkedEpisodeDataset(
            root, batch_size=4, seed=1, features=tabular, chunk_frames=3, **kw
        ),
        num_workers=0,
        stop_after=2,
    )
    with pytest.raises(ResumeStateError, match=r"'plan'"):
        default(resume_state=three)
    # and a new run without video reads single frames
    assert default().chunk_frames == 1


def test_a_bad_row_skips_only_its_own_frame_though_its_episode_is_checked_once(tmp_path):
    """Rows are checked once per episode; where that fails, each range is checked on its own, so
    on_error="skip" skips only the chunk holding the bad row (and "raise" names its frame)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from robo_resume.errors import MetadataMismatchError
    from robo_resume.testing import make_dataset

    fds = make_dataset(tmp_path / "ds", episode_lengths=LENGTHS, num_cameras=1)
    meta = ChunkedEpisodeDataset(fds.root, batch_size=4).meta
    ep = meta.episode(1)
    path = fds.root / ep.data_path
    t = pq.read_table(path)
    frames = t.column("frame_index").to_numpy().copy()
    bad_row = ep.data_row_start + 7  # episode 1, frame 7
    frames[bad_row] += 100
    t = t.set_column(t.schema.get_field_index("frame_index"), "frame_index", pa.array(frames))
    pq.write_table(t, path)
    bad_index = ep.dataset_from_index + 7

    def make(**kw):
        return ChunkedEpisodeDataset(
            fds.root, batch_size=4, seed=2, features={"observation.images.cam0": None}, **kw
        )

    with pytest.raises(MetadataMismatchError, match=r"'frame_index'.*episode 1, frame 7"):
        for _ in make().dataloader(num_workers=0):
            pass
    ds = make(on_error="skip", tuning=StreamTuning(tail="keep"))
    got = [i for b in ds.dataloader(num_workers=0) for i in b["index"].tolist()]
    assert bad_index not in got
    assert sorted(got) == sorted(set(range(sum(LENGTHS))) - {bad_index})
