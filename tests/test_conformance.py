"""Items of LeRobotReader against lerobot's own LeRobotDataset (the oracle), item by item.

Tolerance: images must be EXACTLY equal. Both sides decode the same stream with the same FFmpeg
(PyAV) and convert with the same swscale path, so any difference is a wrong frame, not noise.
Non-image values must be exactly equal as well. lerobot 0.6's trainer asks for uint8 frames
(``return_uint8=True``); robo_resume's ``image_dtype="uint8"`` must give the same tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CONFORMANCE_STATS as STATS
from conftest import OPEN50_WITH_VIDEO

from robo_resume import ChunkedEpisodeDataset, LeRobotReader
from robo_resume.items import unbind

IMAGE_TOLERANCE = 0.0  # documented above: exact


def lerobot_dataset(root, **kw):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/oracle", root=root, video_backend="pyav", **kw)


def assert_same_item(ours: dict, theirs: dict, where: str) -> float:
    """Same keys in the same order, same dtypes and shapes, equal values; returns image diff."""
    assert list(ours) == list(theirs), f"{where}: keys {list(ours)} != {list(theirs)}"
    worst = 0.0
    for k, b in theirs.items():
        a = ours[k]
        if isinstance(b, str):
            assert a == b, f"{where}: {k} {a!r} != {b!r}"
            continue
        assert isinstance(a, torch.Tensor), f"{where}: {k} is {type(a)}"
        assert a.dtype == b.dtype, f"{where}: {k} dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{where}: {k} shape {tuple(a.shape)} != {tuple(b.shape)}"
        if a.ndim >= 3:  # images (float32 in [0, 1], or uint8): count the worst difference
            d = (a.double() - b.double()).abs().max().item()
            worst = max(worst, d)
            assert d <= IMAGE_TOLERANCE, f"{where}: image {k} differs by {d}"
        else:
            assert torch.equal(a, b), f"{where}: {k} {a} != {b}"
    return worst


def spread(n: int, count: int, extra=()) -> list[int]:
    idx = set(np.linspace(0, n - 1, num=min(count, n)).astype(int).tolist()) | set(extra)
    return sorted(i for i in idx if 0 <= i < n)


def compare(root, indices_count=40, episodes=None, delta=None, tolerance_s=1e-4, uint8=False):
    ours = LeRobotReader(
        root,
        episodes=episodes,
        delta_timestamps=delta,
        tolerance_s=tolerance_s,
        image_dtype="uint8" if uint8 else "float32",
    )
    theirs = lerobot_dataset(
        root, episodes=episodes, delta_timestamps=delta, tolerance_s=tolerance_s, return_uint8=uint8
    )
    assert len(ours) == len(theirs)
    # every episode's first and last frame, plus an even spread
    edges = []
    for e in ours.episodes:
        start = ours._starts[ours.episodes.index(e)]
        edges += [start, start + ours.meta.episode(e).length - 1]
    idx = spread(len(ours), indices_count, edges)
    for i in idx:
        STATS["max_image_diff"] = max(
            STATS["max_image_diff"], assert_same_item(ours[i], theirs[i], f"{root.name}[{i}]")
        )
        STATS["items"] += 1
    return len(idx)


LEROBOT_DELTA = {
    "observation.state": [-2 / 15, -1 / 15, 0.0],
    "action": [0.0, 1 / 15, 2 / 15, 3 / 15, 4 / 15],
    "observation.images.top": [-1 / 15, 0.0],
}


@pytest.mark.parametrize("delta", [None, LEROBOT_DELTA], ids=["plain", "delta"])
def test_lerobot_written_dataset(lerobot_written, delta):
    assert compare(lerobot_written, 62, delta=delta) == 62


def test_lerobot_written_episode_selection(lerobot_written):
    compare(lerobot_written, 30, episodes=[1, 3], delta=LEROBOT_DELTA)


@pytest.mark.parametrize("delta", [None, LEROBOT_DELTA], ids=["plain", "delta"])
def test_lerobot_written_uint8(lerobot_written, delta):
    """lerobot 0.6's trainer reads with return_uint8=True: image_dtype="uint8" matches it."""
    assert compare(lerobot_written, 62, delta=delta, uint8=True) == 62
    compare(lerobot_written, 20, episodes=[0, 2], delta=delta, uint8=True)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
def test_streaming_batches(lerobot_written, image_dtype, num_workers):
    """Every row of every streamed batch equals lerobot's item of the same ``index``: the batch
    path (decoding into shared-memory rings in workers, float conversion in the main process)
    builds the same values as the reader."""
    uint8 = image_dtype == "uint8"
    theirs = lerobot_dataset(lerobot_written, delta_timestamps=LEROBOT_DELTA, return_uint8=uint8)
    ds = ChunkedEpisodeDataset(
        lerobot_written,
        batch_size=8,
        seed=3,
        chunk_frames=10,
        delta_timestamps=LEROBOT_DELTA,
        image_dtype=image_dtype,
    )
    tracker = ds.tracker()
    seen = []
    for batch in ds.dataloader(num_workers=num_workers):
        for row in unbind(tracker.consume(batch)):
            i = int(row["index"])
            where = f"{lerobot_written.name} batch row index={i} ({image_dtype})"
            diff = assert_same_item(row, theirs[i], where)
            STATS["max_image_diff"] = max(STATS["max_image_diff"], diff)
            STATS["items"] += 1
            seen.append(i)
    assert sorted(seen) == list(range(len(theirs)))  # one epoch: every frame once


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_cameras=2, codec="av1", gop=2),
        dict(num_cameras=1, codec="h264", gop=250),
        dict(num_cameras=1, codec="mpeg4", gop=12),
        dict(num_cameras=0),
    ],
    ids=["av1-2cam", "h264-gop250", "mpeg4-gop12", "no-camera"],
)
def test_factory_datasets(factory, kw):
    ds = factory(**kw)
    cams = list(ds.camera_keys)
    delta = {"observation.state": [-0.2, -0.1, 0], "action": [0, 0.1, 0.2, 0.3]}
    if cams:
        delta[cams[0]] = [-0.1, 0.0, 0.1]
    compare(ds.root, 40)
    compare(ds.root, 40, delta=delta)
    compare(ds.root, 20, delta=delta, uint8=True)


def test_open50(open50):
    """The real dataset: mpeg4 streams labelled h264, episodes with missing videos left out."""
    fps = 30
    delta = {
        "actions": [k / fps for k in range(0, 50)],
        "state": [-1 / fps, 0.0],
        "image": [-1 / fps, 0.0],
    }
    eps = [0, 3, 4, 24, 26, 49]
    assert [e for e in eps if e in OPEN50_WITH_VIDEO] == eps
    compare(open50, 30, episodes=eps)
    compare(open50, 20, episodes=eps, delta=delta)
