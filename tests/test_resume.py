"""The shared resume harness: crash a real DataLoader run, resume, compare the exact order.

Every check compares the sequence of batches (index values, in order, batch boundaries
included) of an interrupted-and-resumed run with an uninterrupted one. Nothing is sorted.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import interrupted_run

from robo_resume import (
    CURSOR_KEY,
    ChunkedEpisodeDataset,
    CursorTracker,
    ResumeStateError,
    worker_context,
)
from robo_resume.audit import consume, epochs_started

LENGTHS = (23, 41, 17, 30, 9, 26)


@pytest.fixture(scope="module")
def tab_root(factory):
    """No cameras: resume logic is independent of video, and this keeps the matrix fast."""
    return factory(episode_lengths=LENGTHS, num_cameras=0).root


@pytest.fixture(scope="module")
def small_root(factory):
    """For batch size 1 (one DataLoader round trip per frame)."""
    return factory(episode_lengths=(9, 14, 6, 11), num_cameras=0).root


@pytest.fixture(scope="module")
def cam_root(factory):
    return factory(episode_lengths=(19, 27, 12), num_cameras=1, codec="h264", gop=250).root


def flat(batches):
    return [b for _, b in batches]


_FULL: dict[str, list] = {}


def run_resume(
    root,
    *,
    num_workers,
    batch_size,
    crash_at,
    epochs=2,
    infinite=False,
    total=None,
    loader_kwargs=None,
    **kw,
):
    """Yield (s, full, before, after_arithmetic, after_cursor) per crash point ``s`` in
    ``crash_at`` (an int or several, ascending), as lists of index batches.

    One interrupted run serves every crash point (tests/conftest.py ``interrupted_run``): it
    stops after the last one, with the tracker's state saved after each. Each resume, by
    arithmetic and by cursor, is a fresh dataset and loader.
    """
    points = [crash_at] if isinstance(crash_at, int) else list(crash_at)

    def make(**extra):
        return ChunkedEpisodeDataset(root, batch_size=batch_size, infinite=infinite, **kw, **extra)

    common = dict(num_workers=num_workers, loader_kwargs=loader_kwargs)
    # The uninterrupted run depends on the configuration only: run it once per configuration.
    key = repr((root, num_workers, batch_size, epochs, infinite, total, loader_kwargs, kw))
    if key not in _FULL:
        _FULL[key] = consume(
            make, **(dict(stop_after=total) if infinite else dict(epochs=epochs)), **common
        )[0]
    full = _FULL[key]
    before, states = interrupted_run(make, points, epochs=1 if infinite else epochs, **common)
    for s in points:
        state = states[s]
        if infinite:
            left = dict(stop_after=total - s)
        else:
            left = dict(epochs=epochs - epochs_started(make(), state, num_workers))
        arith, _ = consume(make, resume_step=s * batch_size, **common, **left)
        cursor, _ = consume(make, resume_state=state, **common, **left)
        yield s, flat(full), flat(before[:s]), flat(arith), flat(cursor)


def assert_exact(full, before, after, what):
    got = before + after
    assert len(got) == len(full), f"{what}: {len(got)} batches, expected {len(full)}"
    for k, (a, b) in enumerate(zip(got, full, strict=True)):
        assert a == b, f"{what}: batch {k} is {a}, uninterrupted run had {b}"


def crash_points(root, num_workers, batch_size, **kw):
    ds = ChunkedEpisodeDataset(root, batch_size=batch_size, **kw)
    per_epoch = ds.batches_per_epoch(num_workers)
    return sorted({1, max(1, per_epoch // 2 + 1), per_epoch, per_epoch + 1})


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_epoch_mode_all_crash_points(tab_root, small_root, num_workers, batch_size):
    if batch_size == 1:
        tab_root = small_root
    kw = dict(seed=11, chunk_frames=8)
    points = crash_points(tab_root, num_workers, batch_size, **kw)
    for s, full, before, arith, cursor in run_resume(
        tab_root, num_workers=num_workers, batch_size=batch_size, crash_at=points, **kw
    ):
        assert_exact(full, before, arith, f"arithmetic W={num_workers} B={batch_size} s={s}")
        assert_exact(full, before, cursor, f"cursor W={num_workers} B={batch_size} s={s}")


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drop_last_and_seeds(tab_root, drop_last, seed):
    kw = dict(seed=seed, chunk_frames=10, drop_last=drop_last)
    points = crash_points(tab_root, 2, 7, **kw)
    for s, full, before, arith, cursor in run_resume(
        tab_root, num_workers=2, batch_size=7, crash_at=points, **kw
    ):
        assert_exact(full, before, arith, f"arith drop_last={drop_last} s={s}")
        assert_exact(full, before, cursor, f"cursor drop_last={drop_last} s={s}")
        if drop_last:
            assert all(len(b) == 7 for b in full)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_infinite_mode(tab_root, num_workers):
    kw = dict(seed=5, chunk_frames=8)
    ds = ChunkedEpisodeDataset(tab_root, batch_size=7, infinite=True, **kw)
    per_epoch = ds.batches_per_epoch(num_workers)
    total = 3 * per_epoch + 2
    for s, full, before, arith, cursor in run_resume(
        tab_root,
        num_workers=num_workers,
        batch_size=7,
        crash_at=(1, per_epoch, per_epoch + 1, 2 * per_epoch + 1),
        infinite=True,
        total=total,
        **kw,
    ):
        assert all(len(b) == 7 for b in full)  # batches straddle epochs, never partial
        assert_exact(full, before, arith, f"infinite arith s={s}")
        assert_exact(full, before, cursor, f"infinite cursor s={s}")


@pytest.mark.parametrize("persistent", [False, True])
def test_persistent_workers_epochs_advance(tab_root, persistent):
    """Each iter() is the next epoch, with or without persistent workers (no set_epoch trap)."""
    kw = dict(seed=3, chunk_frames=8)
    loader_kwargs = dict(persistent_workers=persistent)
    for s, full, before, arith, cursor in run_resume(
        tab_root,
        num_workers=2,
        batch_size=7,
        crash_at=crash_points(tab_root, 2, 7, **kw),
        epochs=3,
        loader_kwargs=loader_kwargs,
        **kw,
    ):
        assert_exact(full, before, arith, f"persistent={persistent} s={s}")
        assert_exact(full, before, cursor, f"persistent={persistent} s={s}")
    ds = ChunkedEpisodeDataset(tab_root, batch_size=7, **kw)
    loader = ds.dataloader(num_workers=2, persistent_workers=persistent)
    epochs = [[i for b in loader for i in b["index"].tolist()] for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert len(set(epochs[0])) == len(epochs[0])


def test_with_video_and_delta(cam_root):
    kw = dict(seed=1, chunk_frames=6, delta_timestamps={"action": [0, 0.1, 0.2]})
    for s, full, before, arith, cursor in run_resume(
        cam_root, num_workers=2, batch_size=5, crash_at=(1, 3, 4), epochs=1, **kw
    ):
        assert_exact(full, before, arith, f"video s={s}")
        assert_exact(full, before, cursor, f"video s={s}")


def test_stateful_dataloader(tab_root):
    from torchdata.stateful_dataloader import StatefulDataLoader

    for num_workers in (0, 2, 3):
        for s in (1, 4, 5):
            ds = ChunkedEpisodeDataset(tab_root, batch_size=7, seed=2, chunk_frames=8)
            ctx = dict(multiprocessing_context=worker_context()) if num_workers else {}
            full = [
                b["index"].tolist()
                for b in StatefulDataLoader(ds, batch_size=7, num_workers=num_workers, **ctx)
            ]
            dl = StatefulDataLoader(
                ChunkedEpisodeDataset(tab_root, batch_size=7, seed=2, chunk_frames=8),
                batch_size=7,
                num_workers=num_workers,
                **ctx,
            )
            before = []
            for b in dl:
                before.append(b["index"].tolist())
                if len(before) == s:
                    sd = dl.state_dict()
                    break
            sd = json.loads(json.dumps(sd, default=lambda o: o.tolist()))
            dl2 = StatefulDataLoader(
                ChunkedEpisodeDataset(tab_root, batch_size=7, seed=2, chunk_frames=8),
                batch_size=7,
                num_workers=num_workers,
                **ctx,
            )
            dl2.load_state_dict(sd)
            after = [b["index"].tolist() for b in dl2]
            assert_exact(full, before, after, f"StatefulDataLoader W={num_workers} s={s}")


def test_cursor_in_every_batch_and_consume_strips_it(tab_root):
    ds = ChunkedEpisodeDataset(tab_root, batch_size=4, seed=0)
    tracker = CursorTracker(ds)
    batch = next(iter(ds.dataloader(num_workers=0)))
    assert batch[CURSOR_KEY].shape == (4, 5)
    assert batch[CURSOR_KEY][:, 4].tolist() == [1, 2, 3, 4]
    clean = tracker.consume(batch)
    assert CURSOR_KEY not in clean
    assert tracker.resume_step == 4


def test_tracker_rejects_wrong_batch_size(tab_root):
    ds = ChunkedEpisodeDataset(tab_root, batch_size=4, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=5)
    with pytest.raises(ValueError, match=r"batch size differs.*Fix: build the loader"):
        ds.tracker().consume(next(iter(loader)))


def test_state_is_json_and_fingerprinted(tab_root):
    ds = ChunkedEpisodeDataset(tab_root, batch_size=4, seed=0, chunk_frames=8)
    tracker = ds.tracker()
    for step, b in enumerate(ds.dataloader(num_workers=2)):
        tracker.consume(b)
        if step == 2:
            break
    state = json.loads(json.dumps(tracker.state_dict()))
    assert state["batches"] == 3 and state["num_workers"] == 2
    with pytest.raises(
        ResumeStateError,
        match=r"different 'seed'.*Expected seed=1 .this dataset.*Found seed=0 .the state",
    ):
        ChunkedEpisodeDataset(tab_root, batch_size=4, seed=1, chunk_frames=8, resume_state=state)
    with pytest.raises(ResumeStateError, match=r"different 'plan'"):
        ChunkedEpisodeDataset(tab_root, batch_size=4, seed=0, chunk_frames=9, resume_state=state)
    other = ChunkedEpisodeDataset(
        tab_root, batch_size=4, seed=0, chunk_frames=8, resume_state=state
    )
    # Another num_workers re-partitions what the epoch has left (elastic, see test_elastic.py).
    assert other.layout(0).remainder is not None and next(iter(other.dataloader(num_workers=0)))


def test_resume_step_must_be_batch_multiple(tab_root):
    with pytest.raises(ValueError, match=r"multiple of batch_size.*Fix: pass resume_step=step"):
        ChunkedEpisodeDataset(tab_root, batch_size=4, resume_step=6)


def test_resume_logs_one_line_per_stream(tab_root, caplog):
    caplog.set_level("INFO", logger="robo_resume")
    ds = ChunkedEpisodeDataset(tab_root, batch_size=4, seed=0, resume_step=12, chunk_frames=8)
    next(iter(ds.dataloader(num_workers=0)))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume:")]
    assert len(lines) == 1
    assert lines[0].startswith("resume: stream=0 epoch=0 chunk=")
    assert "frame=" in lines[0]


def test_determinism_across_processes(tab_root):
    code = (
        "import sys, json; from robo_resume import ChunkedEpisodeDataset as D;"
        f"ds = D({str(tab_root)!r}, batch_size=7, seed=9, chunk_frames=8);"
        "print(json.dumps([b['index'].tolist() for b in ds.dataloader(num_workers=2)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ds = ChunkedEpisodeDataset(tab_root, batch_size=7, seed=9, chunk_frames=8)
    here = [b["index"].tolist() for b in ds.dataloader(num_workers=2)]
    assert json.loads(out.stdout) == here


def test_streamed_items_equal_reader_items(cam_root):
    """The stream yields exactly the random-access reader's items (video, delta windows, task)."""
    from robo_resume import LeRobotReader

    delta = {"action": [0, 0.1, 0.2], "observation.images.cam0": [-0.1, 0.0]}
    reader = LeRobotReader(cam_root, delta_timestamps=delta)
    ds = ChunkedEpisodeDataset(
        cam_root, batch_size=4, seed=0, chunk_frames=5, delta_timestamps=delta
    )
    seen = 0
    for item in ds:
        i = int(item.pop(CURSOR_KEY)[4]) and int(item["index"])
        want = reader[i]
        assert list(item) == list(want)
        for k, v in want.items():
            assert (item[k] == v) if isinstance(v, str) else torch.equal(item[k], v), (i, k)
        seen += 1
    assert seen == ds.schedule(0).frames_per_stream


def test_one_seek_per_chunk_and_camera(cam_root, monkeypatch):
    from robo_resume.format.video import VideoReader

    seeks = []
    original = VideoReader._seek

    def counting(self, t):
        seeks.append((self.path.name, t))
        return original(self, t)

    monkeypatch.setattr(VideoReader, "_seek", counting)
    ds = ChunkedEpisodeDataset(cam_root, batch_size=4, seed=0, chunk_frames=5)
    n = sum(1 for _ in ds)
    segments = ds.schedule(0).segments(0, 0)
    assert n == sum(s.length for s in segments)
    # At most one seek per segment and camera (an idle decoder of the same file that already
    # stands before the next segment continues without seeking).
    assert 1 <= len(seeks) <= len(segments) * len(ds.meta.camera_keys)


def test_chunks_cut_at_keyframes(factory):
    from robo_resume import StreamTuning

    ds0 = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec="mpeg4", gop=12)
    ds = ChunkedEpisodeDataset(
        ds0.root, batch_size=4, chunk_frames=16, tuning=StreamTuning(cut_at_keyframes=True)
    )
    # File 0 holds episodes 0 (30 frames) and 1 (41): keyframes every 12 frames of the file,
    # so at frames 0/12/24 of episode 0 and 6/18/30 of episode 1. File 1 holds episode 2.
    stops = {e: [c.stop for c in ds.chunks if c.episode_index == e] for e in range(3)}
    assert stops == {0: [12, 24, 30], 1: [6, 18, 30, 41], 2: [12, 25]}
    [(_, full, before, arith, cursor)] = run_resume(
        ds0.root,
        num_workers=2,
        batch_size=4,
        crash_at=3,
        epochs=1,
        chunk_frames=16,
        tuning=StreamTuning(cut_at_keyframes=True),
    )
    assert_exact(full, before, arith, "keyframe chunks")
    assert_exact(full, before, cursor, "keyframe chunks")


def test_tail_pad(tab_root):
    from robo_resume import StreamTuning

    kw = dict(seed=4, chunk_frames=8, tuning=StreamTuning(tail="pad"))
    ds = ChunkedEpisodeDataset(tab_root, batch_size=7, **kw)
    epoch = [i for b in ds.dataloader(num_workers=3) for i in b["index"].tolist()]
    assert set(epoch) == set(range(sum(LENGTHS)))  # nothing dropped; a few frames repeated
    assert len(epoch) == 3 * ds.schedule(3).frames_per_stream >= sum(LENGTHS)
    for s, full, before, arith, cursor in run_resume(
        tab_root, num_workers=3, batch_size=7, crash_at=(1, 5), epochs=1, **kw
    ):
        assert_exact(full, before, arith, f"pad s={s}")
        assert_exact(full, before, cursor, f"pad s={s}")
