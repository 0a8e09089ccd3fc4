"""A plain ``DataLoader(ds, batch_size=ds.batch_size)``: items collate back into the batch they
were cut from (robo_resume.items.rows.collate_items), and a worker's batches reuse a ring of
shared buffers that the main process frees when it drops a batch (RingBatch, _PlainRing).

The worker side is run in this process as worker 0 of 2 (torch's own worker info), its batches
pickled with torch's ForkingPickler and unpickled here, as the DataLoader's result queue does;
the end-to-end tests start real workers and compare with ``ds.dataloader()``.
"""

from __future__ import annotations

import gc
import io
import pickle
from collections import Counter
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils import worker

from robo_resume import ChunkedEpisodeDataset, LeRobotReader
from robo_resume.items.rows import BlockItem, BlockRow, RingBatch
from robo_resume.stream.blocks import RING

CAM = "observation.images.cam0"
CAMS = ("observation.images.cam0", "observation.images.cam1")


@pytest.fixture(scope="module")
def two_cams(factory):
    return factory(episode_lengths=(21, 34, 9, 27, 16), num_cameras=2, codec="av1", gop=2).root


def _plain(batch):
    """Every tensor of a batch as a plain clone (what a batch held must keep)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else list(v) for k, v in batch.items()}


def _same(a, b):
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


class _AsWorker:
    """Run ``ds`` as worker ``wid`` of ``n`` in this process (torch's worker info)."""

    def __init__(self, ds, wid=0, n=2):
        self.info = worker.WorkerInfo(id=wid, num_workers=n, seed=0, dataset=ds)

    def __enter__(self):
        worker._worker_info = self.info

    def __exit__(self, *exc):
        worker._worker_info = None


def _send(batch):
    """A worker's batch through torch's ForkingPickler, as the DataLoader result queue does."""
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(batch)
    return pickle.loads(buf.getvalue())


def _worker_batches(ds, count):
    """``count`` collated batches of worker 0 of 2, each as it arrives in the main process."""
    with _AsWorker(ds):
        it = iter(ds)
        for _ in range(count):
            items = [next(it) for _ in range(ds.batch_size)]
            batch = default_collate(items)
            del items
            yield batch


def test_consecutive_items_collate_into_their_batch_without_a_copy(two_cams):
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6)
    items = list(ds)
    assert all(type(i) is BlockItem for i in items)
    assert all(type(i[CAM]) is BlockRow for i in items)
    want = default_collate([{k: _copy(v) for k, v in i.items()} for i in items[4:8]])
    got = default_collate(items[4:8])
    assert type(got) is dict and type(got[CAM]) is torch.Tensor
    _same(got, want)
    assert got[CAM].data_ptr() == items[4][CAM].data_ptr()  # the batch column itself
    half = default_collate(items[5:7])  # rows [1, 3) of that batch: a view, same values
    _same(half, default_collate([{k: _copy(v) for k, v in i.items()} for i in items[5:7]]))
    assert half[CAM].data_ptr() == items[5][CAM].data_ptr()


def _copy(v):
    return v.as_subclass(torch.Tensor).clone() if isinstance(v, torch.Tensor) else v


@pytest.mark.parametrize("change", ["value", "key", "order", "mixed", "foreign"])
def test_changed_or_foreign_items_collate_as_torch_does(two_cams, change):
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6)
    items = list(ds)[:8]
    pick = items[:4]
    if change == "value":
        pick[1]["action"] = pick[1]["action"] * 0 + 7
    elif change == "key":
        pick[2]["extra"] = torch.tensor(1.0)
        for i in (0, 1, 3):
            pick[i]["extra"] = torch.tensor(2.0)
    elif change == "order":
        pick = [items[0], items[2], items[1], items[3]]
    elif change == "mixed":
        pick = [items[0], items[1], items[4], items[5]]  # rows of two batches
    else:
        pick = [items[0], dict(items[1]), items[2], items[3]]
    want = default_collate([{k: _copy(v) for k, v in i.items()} for i in pick])
    got = default_collate(pick)
    assert type(got) is dict and all(
        type(v) is torch.Tensor for v in got.values() if isinstance(v, torch.Tensor)
    )
    _same(got, want)
    if change == "value":
        assert got["action"][1].eq(7).all()


def test_items_pickle_and_copy_as_plain_dicts_of_their_rows_only(two_cams):
    import copy

    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6)
    item = next(iter(ds))
    for dup in (pickle.loads(pickle.dumps(item)), copy.deepcopy(item)):
        assert type(dup) is dict and type(dup[CAM]) is torch.Tensor
        assert torch.equal(dup[CAM], item[CAM])
        row_bytes = item[CAM].numel() * item[CAM].element_size()
        assert dup[CAM].untyped_storage().nbytes() == row_bytes  # the row only
    shallow = copy.copy(item)
    assert type(shallow) is dict and shallow[CAM] is item[CAM]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
def test_worker_batches_reuse_the_ring_once_the_main_process_drops_them(two_cams, image_dtype):
    ds = ChunkedEpisodeDataset(
        two_cams, batch_size=4, chunk_frames=6, image_dtype=image_dtype, infinite=True
    )
    seen = Counter()
    for batch in _worker_batches(ds, 12):
        assert type(batch) is RingBatch
        got = _send(batch)
        del batch
        assert type(got) is dict and all(type(got[c]) is torch.Tensor for c in CAMS)
        assert got[CAM].dtype == getattr(torch, image_dtype)
        seen[got[CAM].untyped_storage().data_ptr()] += 1
        del got  # the training loop drops the batch before asking for the next
        gc.collect()
    (ring,) = ds.reader._plain_rings.values()
    assert len(ring.slots) <= 2  # one being built, one just freed: never fresh memory
    assert sum(seen.values()) == 12


@pytest.mark.timeout(120)
def test_held_batches_keep_their_frames_and_their_buffers(two_cams):
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, infinite=True)
    held, copies = [], []
    for batch in _worker_batches(ds, 2 * RING + 2):
        got = _send(batch)
        del batch
        held.append(got)
        copies.append(_plain(got))
        gc.collect()
    (ring,) = ds.reader._plain_rings.values()
    assert len(ring.slots) == RING  # all in use by held batches: the rest in fresh memory
    for got, want in zip(held, copies, strict=True):
        _same(got, want)
    ptrs = {g[CAM].untyped_storage().data_ptr() for g in held}
    assert len(ptrs) == len(held)  # no two held batches share memory
    flags = [int(flag[0]) for flag, _, _ in ring.slots]
    assert all(flags)  # the main process still holds every ring batch
    del held, got
    gc.collect()
    assert [int(flag[0]) for flag, _, _ in ring.slots] == [0] * RING


@pytest.mark.timeout(120)
def test_items_held_in_the_worker_keep_their_buffer(two_cams):
    """A wrapper that keeps items in the worker (a shuffle buffer) keeps their buffer in use."""
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, infinite=True)
    with _AsWorker(ds):
        it = iter(ds)
        kept = [next(it) for _ in range(4)]  # one whole batch, never collated
        want = [{k: _copy(v) for k, v in i.items()} for i in kept]
        for _ in range(3 * RING):
            items = [next(it) for _ in range(4)]
            got = _send(default_collate(items))
            del items, got
            gc.collect()
    for item, w in zip(kept, want, strict=True):
        _same(dict(item), w)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
def test_plain_loader_batches_equal_dataloader_batches(two_cams, num_workers, image_dtype):
    """Same batches, in the same order, as ds.dataloader(); plain dicts of plain tensors."""
    kw = dict(batch_size=4, chunk_frames=6, image_dtype=image_dtype, seed=3)
    delta = {CAM: [-1 / 10, 0.0], "action": [0.0, 1 / 10, 2 / 10]}
    ds = ChunkedEpisodeDataset(two_cams, delta_timestamps=delta, **kw)
    want = [
        _plain(b)
        for b in ChunkedEpisodeDataset(two_cams, delta_timestamps=delta, **kw).dataloader(
            num_workers=num_workers
        )
    ]
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=num_workers)
    got = []
    for batch in loader:
        assert type(batch) is dict
        assert all(type(v) is torch.Tensor for v in batch.values() if isinstance(v, torch.Tensor))
        got.append(_plain(batch))
    assert len(got) == len(want) == ds.batches_per_epoch(num_workers)
    for g, w in zip(got, want, strict=True):
        _same({k: v for k, v in g.items() if k in w}, w)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_plain_loader_every_frame_once_and_resume(two_cams, num_workers):
    """Exactly once over an epoch, and a resume from the tracker continues the same order."""
    kw = dict(batch_size=4, chunk_frames=6, seed=5, image_dtype="uint8")
    ds = ChunkedEpisodeDataset(two_cams, **kw)
    reader = LeRobotReader(two_cams, image_dtype="uint8")
    full = [
        b["index"].tolist()
        for b in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=num_workers)
    ]
    flat = [i for b in full for i in b]
    assert len(flat) == len(set(flat))  # no frame twice
    assert len(full) == ds.batches_per_epoch(num_workers)
    assert flat == [
        i
        for b in ChunkedEpisodeDataset(two_cams, **kw).dataloader(num_workers=num_workers)
        for i in b["index"].tolist()
    ]  # the frames of ds.dataloader(), in its order
    ds2 = ChunkedEpisodeDataset(two_cams, **kw)
    tracker = ds2.tracker()
    cut = len(full) // 2 + 1
    for k, batch in enumerate(
        torch.utils.data.DataLoader(ds2, batch_size=4, num_workers=num_workers)
    ):
        if k == cut:
            break
        tracker.consume(batch)
        idx = batch["index"].tolist()
        for i, img in zip(idx, batch[CAM], strict=True):
            assert torch.equal(img, reader[i][CAM])
    ds3 = ChunkedEpisodeDataset(two_cams, resume_state=tracker.state(), **kw)
    rest = [
        b["index"].tolist()
        for b in torch.utils.data.DataLoader(ds3, batch_size=4, num_workers=num_workers)
    ]
    assert full[:cut] + rest == full


def test_another_batch_size_is_stacked_and_said_once(two_cams, caplog):
    import robo_resume.items.rows as rows

    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6)
    rows._noted.clear()
    with caplog.at_level("INFO", logger="robo_resume"):
        batches = list(torch.utils.data.DataLoader(ds, batch_size=3))
    assert caplog.text.count("not one whole batch of the dataset (its batch_size is 4)") == 1
    want = [
        _plain(b)
        for b in ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6).dataloader()
    ]
    flat = {k: torch.cat([b[k] for b in want]) for k in ("index", CAM)}
    got = {k: torch.cat([b[k] for b in batches]) for k in ("index", CAM)}
    assert torch.equal(got["index"], flat["index"]) and torch.equal(got[CAM], flat[CAM])


def _rewrap(items):
    """A custom collate_fn: torch's batch handed on as another dict (module level: picklable)."""
    return dict(default_collate(items))


@pytest.mark.timeout(180)
def test_a_batch_rewrapped_by_a_custom_collate_keeps_its_buffer(two_cams):
    """The main process holds ring views that did not arrive as a RingBatch: held batches of
    2 real workers keep their frames (the worker never reuses those buffers)."""
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, image_dtype="uint8")
    reader = LeRobotReader(two_cams, image_dtype="uint8")
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_rewrap)
    held = list(loader)
    assert len(held) == ds.batches_per_epoch(2) > 2 * (RING + 2)
    for batch in held:
        for idx, img in zip(batch["index"].tolist(), batch[CAM], strict=True):
            assert torch.equal(img, reader[idx][CAM]), f"index {idx}"
