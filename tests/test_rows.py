"""Items as rows of their batch (robo_resume.items.rows): a plain DataLoader's default_collate
gets the batch back without a copy, and the values are those of a copy.

The plain ``DataLoader(ds, batch_size=...)`` path must give the same batches as before; these
tests check the stacking rule itself, that items never leak their batch (pickling, deepcopy,
operations give plain tensors), and that held batches of a plain loader keep their values.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from robo_resume import ChunkedEpisodeDataset, LeRobotReader
from robo_resume.items.rows import BlockRow, rows_of

CAM = "observation.images.cam0"


def test_consecutive_rows_stack_into_the_column_itself():
    col = torch.arange(24, dtype=torch.float32).view(6, 4)
    rows = [rows_of(col, i) for i in range(6)]
    assert all(type(r) is BlockRow for r in rows)
    whole = torch.stack(rows)
    assert type(whole) is torch.Tensor and whole.data_ptr() == col.data_ptr()
    part = torch.stack(rows[2:5])
    assert torch.equal(part, col[2:5]) and part.data_ptr() == col[2].data_ptr()
    out = torch.empty(0)
    got = torch.stack(rows[1:3], 0, out=out)
    assert got is out and torch.equal(out, col[1:3])


@pytest.mark.parametrize(
    "pick", [[0, 2, 3], [3, 2], [0, 1], [1, 1]], ids=["gap", "reversed", "mixed", "repeat"]
)
def test_other_stacks_copy_as_torch_does(pick):
    col, other = torch.arange(12.0).view(4, 3), torch.arange(12.0, 24.0).view(4, 3)
    rows = [rows_of(col, i) for i in pick]
    if pick == [0, 1]:
        rows = [rows_of(col, 0), rows_of(other, 1)]
    want = torch.stack([r.as_subclass(torch.Tensor).clone() for r in rows])
    got = torch.stack(rows)
    assert type(got) is torch.Tensor and torch.equal(got, want)
    assert got.data_ptr() not in (col.data_ptr(), other.data_ptr())
    assert torch.equal(torch.stack(rows, 1), want.transpose(0, 1))


def test_a_row_behaves_as_a_plain_tensor_and_never_carries_its_column():
    col = torch.arange(4000, dtype=torch.float32).view(4, 1000)
    row = rows_of(col, 2)
    assert type(row * 2) is torch.Tensor and torch.equal(row * 2, col[2] * 2)
    assert type(row[:3]) is torch.Tensor
    back = pickle.loads(pickle.dumps(row))
    assert type(back) is torch.Tensor and torch.equal(back, col[2])
    assert back.untyped_storage().nbytes() == 1000 * 4  # the row, not the column
    dup = copy.deepcopy(row)
    assert type(dup) is torch.Tensor and dup.untyped_storage().nbytes() == 1000 * 4


@pytest.fixture(scope="module")
def two_cams(factory):
    return factory(episode_lengths=(21, 34, 9, 27, 16), num_cameras=2, codec="av1", gop=2).root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
def test_plain_loader_batches_hold_the_frames_while_held(two_cams, num_workers, image_dtype):
    """Held batches of a plain DataLoader keep their frames while later batches are built."""
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, image_dtype=image_dtype)
    reader = LeRobotReader(two_cams, image_dtype=image_dtype)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=num_workers)
    held = list(loader)
    assert len(held) == ds.batches_per_epoch(num_workers)
    for batch in held:
        assert type(batch[CAM]) is torch.Tensor
        for idx, img in zip(batch["index"].tolist(), batch[CAM], strict=True):
            assert torch.equal(img, reader[idx][CAM]), f"index {idx}"


@pytest.mark.timeout(120)
def test_plain_loader_with_workers_logs_the_fast_path_once(two_cams, caplog):
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4, chunk_frames=6, infinite=True)
    from robo_resume.stream.reading import PLAIN_LOADER_NOTE

    with caplog.at_level("INFO", logger="robo_resume"):
        it = iter(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=0))
        next(it)
    assert PLAIN_LOADER_NOTE not in caplog.text  # 0 workers: as fast as ds.dataloader()
    ds.epochs.reset()
    # a worker's log record: call __iter__ as worker 0 of 2 would, before any stream started
    from torch.utils.data._utils import worker

    worker._worker_info = worker.WorkerInfo(id=0, num_workers=2, seed=0, dataset=ds)
    try:
        with caplog.at_level("INFO", logger="robo_resume"):
            next(iter(ds))
            next(iter(ds))  # a later stream start: no second line
    finally:
        worker._worker_info = None
    assert caplog.text.count("ds.dataloader(num_workers=...) yields the same") == 1
