"""``dtype: image`` features (frames stored in the data parquet) and ``dtype: string`` features,
item by item against lerobot 0.6.1's LeRobotDataset (the oracle).

The datasets are written by lerobot's own writer (create/add_frame/save_episode/finalize): two
RGB image features (PNG bytes in a ``{bytes, path}`` struct column), a video camera and a string
feature. lerobot 0.6.1 writes single-channel images only as uint16 or float32 (depth-like maps
it returns in native units, which robo_resume refuses); 8-bit grayscale and RGBA PNGs (written
by other tools) are checked by rewriting the PNGs of a lerobot-written dataset. Images must be
EXACTLY equal (max abs difference 0.0): both sides decode the same PNG bytes with Pillow and
divide by 255 in float32.

lerobot's ``return_uint8=True`` applies to video only and returns image features as float32;
robo_resume's ``image_dtype="uint8"`` applies to every camera, so in that mode our image
features are uint8 and ``x.float() / 255`` of them must equal lerobot's floats exactly.
"""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import CONFORMANCE_STATS as STATS
from test_conformance import assert_same_item, lerobot_dataset

from robo_resume import (
    ChunkedEpisodeDataset,
    CorruptFileError,
    DatasetFormatError,
    LeRobotReader,
    MetadataMismatchError,
    UnsupportedFeatureError,
)
from robo_resume.items import unbind
from robo_resume.mix import MixedDataset, MixSource

pytestmark = pytest.mark.lerobot

H, W, FPS = 24, 32, 10
FRONT, SIDE, TOP, NOTE = (
    "observation.images.front",
    "observation.images.side",
    "observation.images.top",
    "note",
)
DELTA = {
    FRONT: [-2 / FPS, -1 / FPS, 0.0, 1 / FPS],
    SIDE: [0.0],  # a one-frame window: lerobot keeps the window axis for image features
    TOP: [-1 / FPS, 0.0],
    "observation.state": [-1 / FPS, 0.0],
}


def _image(dtype: str, channels: int) -> dict:
    return {"dtype": dtype, "shape": (H, W, channels), "names": ["height", "width", "channels"]}


def write_with_lerobot(root, lengths, top="video", seed=0):
    """A lerobot-written v3.0 dataset: RGB image features FRONT and SIDE, TOP as a ``top``
    feature ("video" or "image"), the string feature NOTE, state and action."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        FRONT: _image("image", 3),
        TOP: _image(top, 3),
        NOTE: {"dtype": "string", "shape": (1,), "names": None},
        SIDE: _image("image", 3),
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }
    ds = LeRobotDataset.create("local/images", fps=FPS, features=features, root=root)
    rng = np.random.default_rng(seed)
    for ep, n in enumerate(lengths):
        for f in range(n):
            block = rng.integers(0, 255, size=(3, 4, 3), dtype=np.uint8)
            ds.add_frame(
                {
                    "observation.state": np.array([ep, f], dtype=np.float32),
                    FRONT: rng.integers(0, 255, size=(H, W, 3), dtype=np.uint8),
                    TOP: np.kron(block, np.ones((8, 8, 1), dtype=np.uint8)),
                    NOTE: f"episode {ep} frame {f}: grip ✓" if f % 3 else "",
                    SIDE: rng.integers(0, 255, size=(H, W, 3), dtype=np.uint8),
                    "action": rng.normal(size=2).astype(np.float32),
                    "task": ("stack", "sort")[ep % 2],
                }
            )
        ds.save_episode()
    ds.finalize()
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Three episodes, a video camera beside the image features."""
    return write_with_lerobot(tmp_path_factory.mktemp("images") / "ds", (7, 5, 9))


@pytest.fixture(scope="module")
def written_b(tmp_path_factory):
    """Another dataset with the same keys, TOP an image feature too (a mix's second source)."""
    return write_with_lerobot(tmp_path_factory.mktemp("images_b") / "ds", (6, 8), "image", 1)


IMAGE_KEYS = (FRONT, SIDE, TOP)


def as_lerobot(item: dict, image_keys=(FRONT, SIDE)) -> dict:
    """Our uint8 image features as lerobot returns them with return_uint8=True (float32 / 255)."""
    return {
        k: v.float() / 255 if k in image_keys and v.dtype == torch.uint8 else v
        for k, v in item.items()
    }


def check(ours: dict, theirs: dict, where: str, uint8: bool, image_keys=(FRONT, SIDE)) -> None:
    for k in image_keys:
        want = torch.uint8 if uint8 else torch.float32
        assert ours[k].dtype == want, f"{where}: {k} is {ours[k].dtype}, expected {want}"
    assert isinstance(ours[NOTE], str), f"{where}: {NOTE} is {type(ours[NOTE])}"
    diff = assert_same_item(as_lerobot(ours, image_keys), theirs, where)
    STATS["max_image_diff"] = max(STATS["max_image_diff"], diff)
    STATS["items"] += 1


@pytest.mark.parametrize("image_dtype", ["float32", "uint8"])
@pytest.mark.parametrize("delta", [None, DELTA], ids=["plain", "window"])
def test_reader_items_equal_lerobot(written, image_dtype, delta):
    uint8 = image_dtype == "uint8"
    ours = LeRobotReader(written, image_dtype=image_dtype, delta_timestamps=delta)
    theirs = lerobot_dataset(written, delta_timestamps=delta, return_uint8=uint8)
    assert len(ours) == len(theirs) == 21
    for i in range(len(ours)):
        check(ours[i], theirs[i], f"reader[{i}] {image_dtype}", uint8)
    item = ours[7]  # episode 1, frame 0
    assert item[FRONT].shape == ((4, 3, H, W) if delta else (3, H, W))
    assert item[SIDE].shape == ((1, 3, H, W) if delta else (3, H, W))
    assert item[NOTE] == ""
    assert ours[8][NOTE] == "episode 1 frame 1: grip ✓"
    if delta:
        assert item[f"{FRONT}_is_pad"].tolist() == [True, True, False, False]


def test_reader_episode_selection(written):
    ours = LeRobotReader(written, episodes=[2], delta_timestamps=DELTA)
    theirs = lerobot_dataset(written, episodes=[2], delta_timestamps=DELTA)
    assert len(ours) == len(theirs) == 9
    for i in range(len(ours)):
        check(ours[i], theirs[i], f"episodes=[2] reader[{i}]", False)


class Double:
    """A picklable image transform (workers start by forkserver)."""

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img * 2


def test_image_transforms_apply_to_image_features(written):
    """lerobot applies image_transforms to its camera_keys: video and image features."""
    ours = LeRobotReader(written, image_transforms=Double(), delta_timestamps=DELTA)
    theirs = lerobot_dataset(written, image_transforms=Double(), delta_timestamps=DELTA)
    for i in (0, 6, 13):
        check(ours[i], theirs[i], f"transformed reader[{i}]", False)
        assert ours[i][FRONT].max() > 1  # the transform ran


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("image_dtype", ["float32", "uint8"])
def test_streaming_batches_equal_lerobot(written, image_dtype, num_workers):
    """Every row of every batch equals lerobot's item of its ``index``; string features are
    lists of str in a batch (default_collate's layout)."""
    uint8 = image_dtype == "uint8"
    theirs = lerobot_dataset(written, delta_timestamps=DELTA, return_uint8=uint8)
    ds = ChunkedEpisodeDataset(
        written,
        batch_size=4,
        seed=5,
        chunk_frames=3,
        delta_timestamps=DELTA,
        image_dtype=image_dtype,
        drop_last=False,
    )
    tracker = ds.tracker()
    seen = []
    for batch in ds.dataloader(num_workers=num_workers):
        batch = tracker.consume(batch)
        assert isinstance(batch[NOTE], list) and all(isinstance(s, str) for s in batch[NOTE])
        assert batch[FRONT].shape[1:] == (4, 3, H, W)
        for row in unbind(batch):
            i = int(row["index"])
            where = f"batch row index={i} ({image_dtype}, {num_workers} workers)"
            check(row, theirs[i], where, uint8)
            seen.append(i)
    # one epoch: every frame at most once; streams get equal shares (a tail may be dropped)
    per_stream = ds.schedule(num_workers).frames_per_stream
    assert len(seen) == len(set(seen)) == per_stream * max(num_workers, 1) >= len(theirs) - 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mix_batches_equal_lerobot(written, written_b, num_workers):
    """A mix of a source whose TOP is a video and one whose TOP is an image feature: every row
    equals lerobot's item of its source; float32 images (workers send uint8, converted in the
    main process, for video and image features alike)."""
    theirs = [
        lerobot_dataset(written, delta_timestamps=DELTA),
        lerobot_dataset(written_b, delta_timestamps=DELTA),
    ]
    mix = MixedDataset(
        [MixSource(written, 1), MixSource(written_b, 1)],
        batch_size=3,
        chunk_frames=4,
        delta_timestamps=DELTA,
        seed=2,
        exhausted="stop",  # one mix epoch, ended by the first source to run out
    )
    tracker = mix.tracker()
    seen: dict[int, list[int]] = {0: [], 1: []}
    for batch in mix.dataloader(num_workers=num_workers):
        batch = tracker.consume(batch)
        source = tracker.last_source
        for row in unbind(batch):
            i = int(row["index"])
            check(row, theirs[source][i], f"mix source {source} index={i}", False, IMAGE_KEYS)
            seen[source].append(i)
    assert seen[0] and seen[1]
    for source, got in seen.items():
        assert len(got) == len(set(got)), f"source {source} repeated a frame"


def test_grayscale_and_rgba_pngs_equal_lerobot(written, tmp_path):
    """8-bit grayscale (mode L) and RGBA PNGs, as other tools write them: ``(1, H, W)`` and
    ``(4, H, W)``, as lerobot returns them."""
    import io
    import json

    import PIL.Image

    root = tmp_path / "modes"
    shutil.copytree(written, root)
    path = root / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    info = json.loads((root / "meta" / "info.json").read_text())
    for key, mode, channels in ((FRONT, "L", 1), (SIDE, "RGBA", 4)):
        info["features"][key]["shape"] = [H, W, channels]
        cells = []
        for cell in table.column(key).to_pylist():
            buf = io.BytesIO()
            PIL.Image.open(io.BytesIO(cell["bytes"])).convert(mode).save(buf, format="PNG")
            cells.append({"bytes": buf.getvalue(), "path": None})
        i = table.schema.get_field_index(key)
        field = table.schema.field(i)
        table = table.set_column(i, field, pa.array(cells, field.type))
    pq.write_table(table, path)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    for image_dtype in ("float32", "uint8"):
        ours = LeRobotReader(root, delta_timestamps=DELTA, image_dtype=image_dtype)
        theirs = lerobot_dataset(root, delta_timestamps=DELTA, return_uint8=image_dtype == "uint8")
        for i in range(len(ours)):
            check(ours[i], theirs[i], f"modes[{i}] {image_dtype}", image_dtype == "uint8")
        assert ours[0][FRONT].shape == (4, 1, H, W) and ours[0][SIDE].shape == (1, 4, H, W)


# -- bad input --------------------------------------------------------------------------------


def rewrite_image(src, dst, row: int, value) -> None:
    """Copy dataset ``src`` to ``dst`` with FRONT's struct at data row ``row`` replaced."""
    shutil.copytree(src, dst)
    path = dst / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    col = table.column(FRONT).to_pylist()
    col[row] = value
    i = table.schema.get_field_index(FRONT)
    table = table.set_column(i, table.schema.field(i), pa.array(col, table.schema.field(i).type))
    pq.write_table(table, path)


def test_undecodable_image_bytes_name_file_episode_frame(written, tmp_path):
    root = tmp_path / "bad"
    rewrite_image(written, root, 9, {"bytes": b"\x89PNG\r\n\x1a\nnot really", "path": None})
    message = (
        r"Image 'observation\.images\.front' in a data file cannot be decoded\. Expected PNG or "
        r"JPEG bytes.*Found 18 bytes starting b'\\x89PNG\\r\\n\\x1a\\n' \(.*Error.*\)\. At file "
        r".*data/chunk-000/file-000\.parquet, episode 1, frame 2\. Fix: the data file is damaged"
    )
    reader = LeRobotReader(root)
    assert reader[8][NOTE] == "episode 1 frame 1: grip ✓"  # neighbours still read
    with pytest.raises(CorruptFileError, match=message):
        reader[9]
    with pytest.raises(CorruptFileError, match=message):  # a window reaching the bad frame
        LeRobotReader(root, delta_timestamps=DELTA)[10]
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=3)
    with pytest.raises(CorruptFileError, match=message):
        for _ in ds.dataloader(num_workers=0):
            pass
    skipping = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=3, on_error="skip")
    got = [i for b in skipping.dataloader(num_workers=0) for i in b["index"].tolist()]
    assert 9 not in got and set(range(7)) <= set(got)  # the bad frame's chunk, not episode 0
    assert len(got) == len(set(got)) >= len(reader) - 3  # chunks hold at most 3 frames


def test_image_only_named_by_path_is_refused(written, tmp_path):
    """lerobot would open the named file; robo_resume reads only what the dataset embeds."""
    root = tmp_path / "path_only"
    rewrite_image(written, root, 3, {"bytes": None, "path": "/etc/passwd"})
    with pytest.raises(
        CorruptFileError,
        match=r"image column 'observation\.images\.front' holds a row without image bytes.*"
        r"Found 1 rows without bytes, the first at row 3.*file-000\.parquet, episode 0.*"
        r"reads no image files named by a path",
    ):
        LeRobotReader(root)[3]


def test_image_of_another_size_is_refused(written, tmp_path):
    import io

    import PIL.Image

    buf = io.BytesIO()
    PIL.Image.new("RGB", (W, H + 1)).save(buf, format="PNG")
    root = tmp_path / "size"
    rewrite_image(written, root, 0, {"bytes": buf.getvalue(), "path": None})
    with pytest.raises(
        MetadataMismatchError,
        match=r"Image 'observation\.images\.front' in a data file has another size than "
        rf"meta/info\.json declares\. Expected height {H}, width {W}.*Found height {H + 1}, "
        rf"width {W} \(PNG RGB\)\. At file .*, episode 0, frame 0\.",
    ):
        LeRobotReader(root)[0]


def test_16_bit_single_channel_images_are_refused(tmp_path):
    """lerobot 0.6.1 writes single-channel images as uint16 (or float32) and returns them in
    native units; robo_resume decodes 8-bit images only and says so, naming the frame."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {"raw": _image("image", 1), "action": {"dtype": "float32", "shape": (1,)}}
    root = tmp_path / "u16"
    ds = LeRobotDataset.create("local/u16", fps=FPS, features=features, root=root)
    for f in range(2):
        raw = np.full((H, W, 1), 1000 + f, dtype=np.uint16)
        ds.add_frame({"raw": raw, "action": np.zeros(1, np.float32), "task": "t"})
    ds.save_episode()
    ds.finalize()
    assert lerobot_dataset(root)[1]["raw"].dtype == torch.float32  # 1001.0: native units
    with pytest.raises(
        UnsupportedFeatureError,
        match=r"Image 'raw' in a data file has a pixel mode robo_resume does not decode\. "
        r"Expected one of the 8-bit modes \['L', 'LA', 'RGB', 'RGBA'\]\. Found PNG image of "
        r"mode 'I;16'\. At file .*file-000\.parquet, episode 0, frame 1\.",
    ):
        LeRobotReader(root)[1]


def test_string_feature_in_a_window_is_refused(written):
    """lerobot fails on it with a TypeError from torch.stack; ours says what to do."""
    with pytest.raises(
        ValueError,
        match=r"delta_timestamps names the string feature 'note'.*Fix: leave 'note' out of "
        r"delta_timestamps",
    ):
        LeRobotReader(written, delta_timestamps={NOTE: [0.0]})


def test_image_feature_with_a_flat_shape_is_malformed(written, tmp_path):
    import json

    root = tmp_path / "flat"
    shutil.copytree(written, root)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"][FRONT]["shape"] = [H * W * 3]
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(
        DatasetFormatError,
        match=r"feature 'observation\.images\.front' is malformed.*image shape \[2304\] \(an "
        r"image has 3 dimensions\)",
    ):
        LeRobotReader(root)
