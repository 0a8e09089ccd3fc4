"""Batch memory: decoding straight into batch buffers, pooled float buffers, worker ring buffers.

The speed work of issue 4 reuses memory instead of faulting in fresh pages for every batch.
Reuse is only correct if a buffer is never written while anything still refers to it; these
tests hold on to tensors, views and arrays and check that their values stay put, and that the
frames delivered are the frames of the video (compared by dataset index with a reader), also
when frames of a broken file are skipped in the middle of a batch.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from test_bad_input_corpus import faststart_then_truncate

from robo_resume import ChunkedEpisodeDataset, LeRobotReader, StreamTuning
from robo_resume.format.video import VideoReader
from robo_resume.items import BufferPool, to_float
from robo_resume.stream.blocks import RING

CAM = "observation.images.cam0"


def test_to_float_is_x_over_255_for_every_value():
    x = torch.arange(256, dtype=torch.uint8).repeat(4500).view(4, 3, 100, -1)
    assert torch.equal(to_float(x), x.to(torch.float32) / 255)
    assert torch.equal(to_float(x, shared=True), x.to(torch.float32) / 255)
    assert to_float(x, shared=True).is_shared()


def test_pool_reuses_a_buffer_only_when_nothing_refers_to_it():
    pool = BufferPool(keep=2, min_bytes=0)
    a = pool.empty((4, 1000), torch.float32)
    ptr = a.data_ptr()
    a.fill_(7.0)
    view = a[1:]  # a torch view keeps the memory
    arr = a.numpy()  # so does an array made from it
    del a
    b = pool.empty((4, 1000), torch.float32)
    assert b.data_ptr() != ptr
    del view
    c = pool.empty((4, 1000), torch.float32)
    assert c.data_ptr() != ptr
    assert (arr == 7.0).all()
    del arr
    d = pool.empty((4, 1000), torch.float32)
    assert d.data_ptr() == ptr  # now it is free, and handed out again
    assert pool.reused == 1


def test_pool_keeps_at_most_keep_free_buffers_and_ignores_small_ones():
    pool = BufferPool(keep=2, min_bytes=4096)
    ts = [pool.empty((1024,), torch.float32) for _ in range(3)]
    del ts
    assert len(pool._free[((1024,), "<f4")]) == 2  # the third went back to malloc
    again = [pool.empty((1024,), torch.float32) for _ in range(3)]
    assert pool.reused == 2 and len(again) == 3
    small = pool.empty((10,), torch.float32)
    del small
    assert pool.reused == 2 and (((10,), "<f4") not in pool._free)


def test_frames_at_writes_into_the_given_rows(factory):
    ds = factory(episode_lengths=(12,), codec="h264", gop=4)
    path = next((ds.root / "videos").rglob("*.mp4"))
    times = [0.1, 0.2, 0.5, 0.6]
    with VideoReader(path) as r:
        want = r.frames_at(times, channels_first=True)
    out = np.zeros((7, *want.shape[1:]), dtype=np.uint8)
    with VideoReader(path) as r:
        got = r.frames_at(times, channels_first=True, out=out, rows=[6, 0, 3, 4])
    assert got is out
    for i, row in enumerate([6, 0, 3, 4]):
        assert np.array_equal(out[row], want[i])
    assert not out[[1, 2, 5]].any()  # untouched rows stay as they were
    with VideoReader(path) as r, pytest.raises(ValueError, match="4 timestamps but 2 rows"):
        r.frames_at(times, channels_first=True, out=out, rows=[0, 1])


def _reference(root, index):
    reader = LeRobotReader(root, image_dtype="uint8")
    return reader[index][CAM]


@pytest.fixture(scope="module")
def two_cams(factory):
    return factory(episode_lengths=(21, 34, 9, 27, 16), num_cameras=2, codec="av1", gop=2).root


@pytest.mark.timeout(120)
def test_worker_ring_buffers_keep_held_batches_intact(two_cams):
    """Held batches keep their ring slots (the worker writes elsewhere); dropped ones free them."""
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, image_dtype="uint8")
    reader = LeRobotReader(two_cams, image_dtype="uint8")
    held, copies, seen = [], [], 0
    loader = ds.dataloader(num_workers=2)
    for i, batch in enumerate(loader):
        assert "_robo_resume_release" not in batch
        for idx, img in zip(batch["index"].tolist(), batch[CAM], strict=True):
            assert torch.equal(img, reader[idx][CAM]), f"batch {i} index {idx}"
        if i < 3:
            held.append(batch)
            copies.append(batch[CAM].clone())
        seen += 1
    assert seen == ds.batches_per_epoch(2) and seen > 3 * RING
    for batch, copy in zip(held, copies, strict=True):  # written over? not while held
        assert torch.equal(batch[CAM], copy)
    flags = loader.dataset.ring_flags
    busy = int((flags != 0).sum())
    assert busy == len(held) + 1  # the held batches' slots, and the last one's: `img` views it
    del img
    assert int((flags != 0).sum()) == len(held)
    del batch, held
    assert int((flags != 0).sum()) == 0


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:.pin_memory. argument is set as true but no accelerator")
def test_pin_memory_loader_does_not_use_the_ring(two_cams):
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, image_dtype="uint8")
    loader = ds.dataloader(num_workers=2, pin_memory=False)
    batches = list(loader)
    assert len(batches) > 2 * RING
    flags = loader.dataset.ring_flags
    assert int((flags != 0).sum()) == 2 * RING  # all held: every slot in use
    reader = LeRobotReader(two_cams, image_dtype="uint8")
    for b in batches:  # none was written over by a later batch
        for idx, img in zip(b["index"].tolist(), b[CAM], strict=True):
            assert torch.equal(img, reader[idx][CAM]), f"index {idx}"
    del batches, b, img
    assert int((flags != 0).sum()) == 0
    ds2 = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, image_dtype="uint8")
    loader = ds2.dataloader(num_workers=2, pin_memory=True)
    kept = list(loader)  # pinning copies the batch: the worker's ring is not involved
    assert len(kept) == ds2.batches_per_epoch(2)
    assert loader.dataset.ring_flags is None  # pinning copies: the ring is not used


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
def test_skipped_frames_leave_the_right_images(factory, tmp_path, num_workers, image_dtype):
    """A file that breaks in the middle of a block: the frames read before the break, decoded
    into the batch buffer at their positions, move up over the skipped ones correctly."""
    src = factory(episode_lengths=(20, 60, 23, 14), codec="h264", gop=4, episodes_per_file=1).root
    root = tmp_path / "ds"
    shutil.copytree(src, root)
    faststart_then_truncate(root / f"videos/{CAM}/chunk-000/file-001.mp4")  # ep. 1, part way
    ds = ChunkedEpisodeDataset(
        root,
        batch_size=5,
        chunk_frames=9,
        seed=2,
        on_error="skip",
        image_dtype=image_dtype,
        tuning=StreamTuning(interleave=3, block_frames=4),
    )
    tracker = ds.tracker()
    clean = LeRobotReader(src, image_dtype="uint8")
    frames = 0
    for batch in ds.dataloader(num_workers=num_workers):
        batch = tracker.consume(batch)
        imgs = batch[CAM]
        for idx, img in zip(batch["index"].tolist(), imgs, strict=True):
            want = clean[idx][CAM]
            if image_dtype == "float32":
                want = want.to(torch.float32) / 255
            assert torch.equal(img, want), f"index {idx}"
            frames += 1
    assert tracker.skipped, "the truncated file was not skipped"
    assert any(r["frame"] > r["start"] for r in tracker.skipped), tracker.skipped
    assert 0 < frames < 20 + 60 + 23 + 14


@pytest.mark.timeout(180)
def test_ring_with_persistent_workers_and_two_live_iterators(two_cams):
    """Persistent workers keep one flag table across epochs; two loaders iterated side by side
    each have their own, so a batch held from one never shares a slot with the other."""
    reader = LeRobotReader(two_cams, image_dtype="uint8")

    def check(batches):
        for b in batches:
            for idx, img in zip(b["index"].tolist(), b[CAM], strict=True):
                assert torch.equal(img, reader[idx][CAM]), f"index {idx}"

    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, image_dtype="uint8")
    loader = ds.dataloader(num_workers=2, persistent_workers=True)
    first = list(loader)  # all held
    flags = loader.dataset.ring_flags
    second = list(loader)
    assert loader.dataset.ring_flags is flags
    check(first)
    check(second)

    a = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, image_dtype="uint8")
    la, lb = a.dataloader(num_workers=2), a.dataloader(num_workers=2)
    pairs = list(zip(la, lb, strict=True))
    assert la.dataset.ring_flags is not lb.dataset.ring_flags
    check([x for pair in pairs for x in pair])


@pytest.mark.timeout(20)
def test_pool_survives_a_buffer_returning_inside_empty():
    """The garbage collector may run a finalizer (a buffer coming back) at any allocation,
    also in the middle of empty() on the same thread; that must neither deadlock nor lose the
    buffer. (A lock held in empty() deadlocked here under a sampling profiler.)"""
    pool = BufferPool(keep=2, min_bytes=0)
    other = [pool.empty((8, 8), torch.float32)]

    class Dropping(dict):
        def setdefault(self, key, default=None):
            other.clear()  # the last reference goes: _put runs right here, inside empty()
            return super().setdefault(key, default)

        def get(self, key, default=None):
            other.clear()
            return super().get(key, default)

    pool._free = Dropping()
    t = pool.empty((8, 8), torch.float32)
    assert t.shape == (8, 8) and not other
    assert pool.reused == 1  # the buffer that came back meanwhile was handed out again
