"""Depth maps stored as video (lerobot 0.6's HEVC gray12le) read as lerobot 0.6.1 returns them.

The datasets are written by lerobot 0.6.1's own writer (``LeRobotDataset.create`` with a depth
feature declared as lerobot's ``hw_to_dataset_features`` declares one: ``(H, W, 1)`` with
``info: {"is_depth_map": True}``, then ``add_frame``, ``save_episode``, ``finalize``), with its
default depth encoder (log quantisation) and with a linear one of other bounds. Every item and
every streamed batch row is compared with ``LeRobotDataset(..., video_backend="pyav")`` of the
same ``index``.

Tolerance: exact (0.0). lerobot's depth encoder is lossless HEVC (``x265-params: lossless=1``), both
sides decode the same stream with the same FFmpeg (PyAV) into the same 12-bit codes, and a
code's millimetres come from lerobot's own float32 torch operations
(:func:`test_table_is_lerobots_dequantisation` checks all 4096 codes), so any difference is a
wrong frame or a wrong formula, not noise. Depth is float32 millimetres on both sides whatever
``return_uint8`` / ``image_dtype`` say, and lerobot leaves it out of ``image_transforms``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_conformance import assert_same_item

from robo_resume import (
    CURSOR_KEY,
    ChunkedEpisodeDataset,
    DatasetFormatError,
    LeRobotReader,
    MetadataMismatchError,
    StreamTuning,
)
from robo_resume.format.depth import DepthCodec
from robo_resume.items import unbind

H, W = 24, 32
FPS = 10
LENGTHS = (9, 15, 8)  # 32 frames: 2 streams x 4 batches of 4, no tail dropped
RGB, DEPTH = "observation.images.rgb", "observation.images.depth"
WINDOWS = {DEPTH: [-0.2, 0.0, 0.1], RGB: [-0.1, 0.0], "action": [0.0, 0.1]}


def write_depth_dataset(root: Path, depth_encoder=None) -> Path:
    """Two cameras (RGB, depth) and state/action, written by lerobot's writer."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        RGB: {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        DEPTH: {
            "dtype": "video",
            "shape": (H, W, 1),
            "names": ["height", "width", "channels"],
            "info": {"is_depth_map": True},
        },
    }
    ds = LeRobotDataset.create(
        "local/depth", fps=FPS, features=features, root=root, depth_encoder=depth_encoder
    )
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 1, H * W).reshape(H, W, 1)
    for ep, n in enumerate(LENGTHS):
        for f in range(n):
            base = rng.integers(0, 255, size=(3, 4, 3), dtype=np.uint8)
            # millimetres from 0 (below depth_min) to past 10 m (above depth_max): both clamps
            mm = 12_000 * ramp * rng.uniform(0.5, 1.0) + rng.integers(0, 50, (H, W, 1))
            ds.add_frame(
                {
                    "observation.state": np.array([ep, f], dtype=np.float32),
                    "action": rng.normal(size=2).astype(np.float32),
                    RGB: np.kron(base, np.ones((8, 8, 1), dtype=np.uint8)),
                    DEPTH: mm.astype(np.uint16),
                    "task": ("look", "reach")[ep % 2],
                }
            )
        ds.save_episode()
    ds.finalize()
    return root


@pytest.fixture(scope="module", params=["log", "linear"])
def depth_root(request, tmp_path_factory) -> Path:
    """lerobot's default depth encoder (log), and a linear one with other bounds."""
    encoder = None
    if request.param == "linear":
        from lerobot.configs.video import DepthEncoderConfig

        encoder = DepthEncoderConfig(depth_min=0.2, depth_max=6.0, use_log=False)
    return write_depth_dataset(tmp_path_factory.mktemp(f"depth_{request.param}") / "ds", encoder)


def lerobot(root: Path, **kw):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/depth", root=root, video_backend="pyav", **kw)


def test_the_dataset_is_a_real_lerobot_depth_dataset(depth_root):
    """What lerobot wrote and what it returns: HEVC gray12le, (1, H, W) float32 millimetres."""
    info = json.loads((depth_root / "meta" / "info.json").read_text())
    depth = info["features"][DEPTH]["info"]
    assert depth["is_depth_map"] is True
    assert (depth["video.codec"], depth["video.pix_fmt"]) == ("hevc", "gray12le")
    theirs = lerobot(depth_root, return_uint8=True)
    assert theirs.meta.depth_keys == [DEPTH]
    item = theirs[3]
    assert item[DEPTH].dtype == torch.float32 and item[DEPTH].shape == (1, H, W)
    assert item[RGB].dtype == torch.uint8
    mm = item[DEPTH]
    assert torch.equal(mm, mm.round()) and mm.min() < mm.max()


def test_table_is_lerobots_dequantisation(depth_root):
    """Each of the 4096 codes gives lerobot's dequantize_depth value (its torch path, what
    its reader calls), for the parameters the dataset's info.json records."""
    from lerobot.datasets.depth_utils import dequantize_depth

    info = json.loads((depth_root / "meta" / "info.json").read_text())
    codec = DepthCodec.from_feature(DEPTH, info["features"][DEPTH], depth_root)
    codes = torch.from_numpy(np.arange(4096, dtype=np.uint16).reshape(1, 1, 64, 64))
    want = dequantize_depth(
        codes,
        depth_min=codec.depth_min,
        depth_max=codec.depth_max,
        shift=codec.shift,
        use_log=codec.use_log,
        output_unit="mm",
    )
    assert want.dtype == torch.float32
    assert torch.equal(torch.from_numpy(codec.table.copy()), want.flatten())
    assert not codec.table.flags.writeable


@pytest.mark.parametrize("uint8", [False, True], ids=["float32", "uint8"])
@pytest.mark.parametrize("delta", [None, WINDOWS], ids=["plain", "windows"])
def test_reader_items_equal_lerobot(depth_root, uint8, delta):
    """Every item of LeRobotReader equals lerobot's: keys in order, dtypes, shapes, values."""
    ours = LeRobotReader(
        depth_root, delta_timestamps=delta, image_dtype="uint8" if uint8 else "float32"
    )
    theirs = lerobot(depth_root, delta_timestamps=delta, return_uint8=uint8)
    assert len(ours) == len(theirs) == sum(LENGTHS)
    for i in range(len(ours)):
        assert assert_same_item(ours[i], theirs[i], f"item {i}") == 0.0
    item = ours[0]
    assert item[DEPTH].dtype == torch.float32
    assert item[DEPTH].shape == ((3, 1, H, W) if delta else (1, H, W))


def _rows_equal_lerobot(ds, theirs, num_workers, **loader_kw):
    """Every row of every batch equals lerobot's item of its index; every frame once. The
    batches are all kept before any is compared: a batch must own its memory (a buffer the
    stream reuses for the next batch would show there)."""
    tracker = ds.tracker()
    seen = []
    for batch in list(ds.dataloader(num_workers=num_workers, **loader_kw)):
        assert batch[DEPTH].dtype == torch.float32
        for row in unbind(tracker.consume(batch)):
            i = int(row["index"])
            assert assert_same_item(row, theirs[i], f"batch row index={i}") == 0.0
            seen.append(i)
    assert sorted(seen) == list(range(len(theirs)))


ORDERS = {
    "shuffle": StreamTuning(),  # the default: chunks decoded whole, frames held in a FrameStore
    "interleave": StreamTuning(interleave=4),  # decoded into the batch buffers
    "read-ahead": StreamTuning(interleave=16),  # frames decoded ahead, kept for later batches
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("image_dtype", ["float32", "uint8"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_streamed_batches_equal_lerobot(depth_root, order, image_dtype, num_workers):
    """ChunkedEpisodeDataset's batches (0 workers, and 2 workers: shared-memory batches,
    uint8 images converted in the main process for float32) in the three ways a stream reads,
    with delta windows on both cameras."""
    ds = ChunkedEpisodeDataset(
        depth_root,
        batch_size=4,
        seed=1,
        chunk_frames=2,  # 16 chunks: read-ahead's 16 open segments exist
        delta_timestamps=WINDOWS,
        image_dtype=image_dtype,
        tuning=ORDERS[order],
    )
    theirs = lerobot(depth_root, delta_timestamps=WINDOWS, return_uint8=image_dtype == "uint8")
    _rows_equal_lerobot(ds, theirs, num_workers)


@pytest.mark.parametrize("order", ["shuffle", "read-ahead"])
def test_streamed_batches_without_windows(depth_root, order):
    """Without windows the shuffle order keeps the depth frames' 12-bit planes in a FrameStore
    (not the decoded frames) and read-ahead holds plain frames: both still equal lerobot."""
    ds = ChunkedEpisodeDataset(
        depth_root, batch_size=4, seed=2, chunk_frames=2, tuning=ORDERS[order]
    )
    _rows_equal_lerobot(ds, lerobot(depth_root), 0)
    if order == "shuffle":
        store = ds.items.frame_store(DEPTH)
        assert store.depth and store.bytes > 0  # slots of gray12le planes were used
        assert store.held == 0  # and given back


def test_plain_dataloader_with_workers(depth_root):
    """``DataLoader(ds, batch_size=...)`` over the dataset's items (a worker's ring of
    shared-memory buffers, float32 for depth): rows equal lerobot's items."""
    ds = ChunkedEpisodeDataset(depth_root, batch_size=4, seed=0, image_dtype="uint8")
    theirs = lerobot(depth_root, return_uint8=True)
    seen = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2):
        assert batch[DEPTH].dtype == torch.float32
        del batch[CURSOR_KEY]  # (the tracker's; lerobot's items have none)
        for row in unbind(batch):
            i = int(row["index"])
            assert assert_same_item(row, theirs[i], f"plain row index={i}") == 0.0
            seen.append(i)
    assert sorted(seen) == list(range(len(theirs)))


def test_transforms_leave_depth_alone(depth_root):
    """lerobot applies image_transforms to RGB cameras only; so does robo_resume."""
    calls = []

    def transform(img):
        calls.append(img.shape)
        return 1 - img

    ours = LeRobotReader(depth_root, image_transforms=transform)
    theirs = lerobot(depth_root, image_transforms=transform)
    for i in (0, 10, len(ours) - 1):
        assert assert_same_item(ours[i], theirs[i], f"item {i}") == 0.0
    assert {tuple(s) for s in calls} == {(3, H, W)}


def _with_info(root: Path, tmp_path: Path, **values) -> Path:
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    path = copy / "meta" / "info.json"
    info = json.loads(path.read_text())
    info["features"][DEPTH]["info"].update(values)
    path.write_text(json.dumps(info, indent=4))
    return copy


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"video.depth_max": "ten"},
            r"The depth feature 'observation\.images\.depth' has an invalid video\.depth_max\. "
            r"Expected a finite number\. Found 'ten'\. At file .*meta/info\.json\. Fix: set "
            r"features\['observation\.images\.depth'\]\.info\['video\.depth_max'\]",
        ),
        (
            {"video.use_log": "yes"},
            r"invalid video\.use_log\. Expected true or false\. Found 'yes'",
        ),
        (
            {"video.depth_min": 0.0, "video.shift": 0.0, "video.use_log": True},
            r"has a log quantisation without a logarithm\. Expected video\.depth_min \+ "
            r"video\.shift > 0 .*Found depth_min=0\.0 \+ shift=0\.0\. At file .*info\.json",
        ),
    ],
    ids=["not-a-number", "use-log-not-bool", "no-logarithm"],
)
def test_bad_depth_parameters_are_refused_naming_the_file(depth_root, tmp_path, values, message):
    root = _with_info(depth_root, tmp_path, **values)
    with pytest.raises(DatasetFormatError, match=message):
        LeRobotReader(root)


def test_missing_parameters_take_lerobots_defaults(depth_root, tmp_path):
    """info.json without the video.depth_* keys: lerobot's DepthEncoderConfig defaults, on
    both sides (for the linear dataset, values other than its own, equally on both sides)."""
    root = _with_info(depth_root, tmp_path)
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    for name in ("depth_min", "depth_max", "shift", "use_log"):
        del info["features"][DEPTH]["info"][f"video.{name}"]
    path.write_text(json.dumps(info, indent=4))
    ours, theirs = LeRobotReader(root), lerobot(root)
    for i in (0, 12, len(ours) - 1):
        assert assert_same_item(ours[i], theirs[i], f"item {i}") == 0.0


def test_spawn_workers(depth_root):
    """Spawned workers receive the dataset by pickle (robo_resume/stream/shared_arrays.py's
    path, the depth codecs with it) and decode depth themselves: batches equal lerobot's."""
    ds = ChunkedEpisodeDataset(depth_root, batch_size=4, seed=4)
    _rows_equal_lerobot(ds, lerobot(depth_root), 2, multiprocessing_context="spawn")


DOC = Path(__file__).resolve().parents[1] / "docs" / "depth.md"


def test_docs_example_runs():
    """docs/depth.md's example runs as written (it writes its own dataset with lerobot)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/depth.md[python block 0]", "exec"), {})


def test_frame_size_mismatch_suggests_the_depth_shape(depth_root, tmp_path):
    """A depth video whose size differs from info.json: the fix keeps the feature's 1 channel."""
    from robo_resume.format.metadata import load_metadata
    from robo_resume.format.video import VideoReader

    copy = tmp_path / "ds"
    shutil.copytree(depth_root, copy)
    path = copy / "meta" / "info.json"
    info = json.loads(path.read_text())
    info["features"][DEPTH]["shape"] = [H + 2, W, 1]
    path.write_text(json.dumps(info, indent=4))
    meta = load_metadata(copy)
    ref = meta.episode(0).videos[DEPTH]
    with VideoReader(copy / ref.path) as v, pytest.raises(MetadataMismatchError) as err:
        meta.check_video_stream(DEPTH, v.info(), file=v.path, episode=0)
    assert f"Expected {H + 2}x{W} (height x width" in str(err.value)
    assert f"Found {H}x{W} in the video container" in str(err.value)
    assert f"set the shape of '{DEPTH}' in meta/info.json to [{H}, {W}, 1] if" in str(err.value)
