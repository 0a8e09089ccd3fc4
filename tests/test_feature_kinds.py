"""Every numeric feature kind lerobot 0.6.1's writer accepts reads as lerobot reads it.

The kinds of the support table in docs/formats.md: float64, float32 and float16 (lerobot returns
float32), signed and unsigned integers (int64), bool; scalars (shape ``(1,)``, 0-d items),
vectors, and the 2-D to 5-D arrays that lerobot stores as ``datasets``' ``Array2D``..``Array5D``
(an extension type over lists of lists in the parquet). One dataset written by lerobot's own
writer holds them all; items from ``LeRobotReader`` and from ``ChunkedEpisodeDataset`` batches
(0 and 2 workers, with ``delta_timestamps`` windows over the arrays too) equal lerobot's items.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from test_video_meta_disagree import assert_same, lerobot_dataset

from robo_resume import ChunkedEpisodeDataset, CorruptFileError, LeRobotReader
from robo_resume.format.tabular import column_to_numpy
from robo_resume.items import unbind

pytestmark = pytest.mark.lerobot

FPS = 10
KINDS = {  # feature: (dtype, shape)
    "observation.state": ("float32", (2,)),
    "f64_scalar": ("float64", (1,)),
    "f64_vector": ("float64", (3,)),
    "f16_vector": ("float16", (2,)),
    "i32_vector": ("int32", (2,)),
    "i16_scalar": ("int16", (1,)),
    "u8_vector": ("uint8", (3,)),
    "bool_scalar": ("bool", (1,)),
    "bool_vector": ("bool", (2,)),
    "array2d": ("float32", (2, 3)),
    "array3d": ("int64", (2, 2, 2)),
    "action": ("float32", (2,)),
}
DELTA = {"array2d": [-1 / FPS, 0.0], "array3d": [0.0, 1 / FPS], "f64_vector": [-1 / FPS, 0.0]}


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> Path:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path_factory.mktemp("kinds") / "ds"
    features = {k: {"dtype": d, "shape": s, "names": None} for k, (d, s) in KINDS.items()}
    ds = LeRobotDataset.create("local/kinds", fps=FPS, features=features, root=root)
    rng = np.random.default_rng(0)
    for ep, n in enumerate((5, 8, 3)):
        for f in range(n):
            frame: dict = {"task": ("reach", "push")[ep % 2]}
            for k, (dtype, shape) in KINDS.items():
                if dtype == "bool":
                    frame[k] = rng.random(shape) > 0.5
                else:
                    frame[k] = (rng.normal(size=shape) * 50).astype(dtype)
            frame["observation.state"] = np.array([ep, f], dtype=np.float32)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


@pytest.mark.parametrize("delta", [None, DELTA], ids=["plain", "window"])
def test_reader_items_equal_lerobot(every_kind, delta):
    theirs = lerobot_dataset(every_kind, delta_timestamps=delta)
    ours = LeRobotReader(every_kind, delta_timestamps=delta)
    assert len(ours) == len(theirs) == 16
    for i in range(len(ours)):
        assert_same(ours[i], theirs[i], f"reader[{i}]")
    item = ours[0]
    assert item["array2d"].shape == ((2, 2, 3) if delta else (2, 3))
    assert (
        item["f64_scalar"].shape == ()
        and item["bool_vector"].dtype == theirs[0]["bool_vector"].dtype
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streamed_items_equal_lerobot(every_kind, num_workers):
    theirs = lerobot_dataset(every_kind, delta_timestamps=DELTA)
    ds = ChunkedEpisodeDataset(every_kind, batch_size=4, delta_timestamps=DELTA)
    tracker = ds.tracker()
    seen = []
    for batch in ds.dataloader(num_workers=num_workers):
        assert batch["array3d"].shape[1:] == (2, 2, 2, 2)
        for row in unbind(tracker.consume(batch)):
            i = int(row["index"])
            assert_same(row, theirs[i], f"streamed index={i} ({num_workers} workers)")
            seen.append(i)
    sched = ds.schedule(num_workers)
    want = [int(i) for s in range(max(num_workers, 1)) for i in sched.frame_indices(0, s)]
    assert Counter(seen) == Counter(want) and len(set(seen)) == len(seen)


def test_ragged_lists_of_lists_name_the_file_row(tmp_path):
    """Row 2 of a 2-D column holds an inner list of another length: the error names that row."""
    column = pa.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]], [[9.0], [1.0, 2.0]]])
    assert column_to_numpy(column.slice(0, 2), name="a", file=tmp_path).shape == (2, 2, 2)
    with pytest.raises(CorruptFileError, match=r"(?s)'a' holds lists of different lengths.*row 12"):
        column_to_numpy(column, name="a", file=tmp_path, first_row=10)
