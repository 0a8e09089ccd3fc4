"""What lerobot 0.6 added to v3.0 datasets: read as lerobot reads it, or refused with a clear error.

- Encoder settings in a video feature's info (video.g, video.crf, ..., is_depth_map: false) and
  info.json keys robo_resume does not know: accepted (items equal to lerobot's, see also
  test_conformance.py, whose lerobot-written dataset carries the encoder settings).
- Depth maps stored as video (is_depth_map, HEVC gray12le): read as lerobot reads them
  (tests/test_depth.py compares them item for item).
- Depth maps stored as images, and dtype language under a name other than language_persistent
  and language_events: refused at load time with UnsupportedFeatureError; the fix the message
  gives (lerobot's remove_feature) yields a dataset robo_resume reads exactly as lerobot does.
  The two language columns are read (tests/test_language.py).

The datasets are written by lerobot 0.6.1's own writer.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from test_conformance import compare

from robo_resume import (
    ChunkedEpisodeDataset,
    DatasetFormatError,
    LeRobotReader,
    UnsupportedFeatureError,
    load_metadata,
)
from robo_resume.format.features import is_depth_map, unsupported_features

H, W = 48, 64


def write_with_lerobot(root, features, frame_of, lengths=(6, 5), use_videos=True):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset.create(
        "local/lerobot06", fps=10, features=features, root=root, use_videos=use_videos
    )
    rng = np.random.default_rng(0)
    for ep, n in enumerate(lengths):
        for f in range(n):
            ds.add_frame({**frame_of(rng, ep, f), "task": ("look", "reach")[ep % 2]})
        ds.save_episode()
    ds.finalize()
    return root


def remove_with_lerobot(root, out, names):
    """lerobot's remove_feature: what `lerobot-edit-dataset --operation.type remove_feature`
    (the fix the error message names) runs."""
    from lerobot.datasets.dataset_tools import remove_feature
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    remove_feature(LeRobotDataset("local/src", root=root), names, output_dir=out, repo_id="l/o")
    return out


@pytest.fixture(scope="module")
def depth_dataset(tmp_path_factory):
    """An RGB camera and a depth camera (HEVC gray12le, quantised millimetres)."""
    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        "observation.images.rgb": {
            "dtype": "video",
            "shape": (H, W, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.images.depth": {
            "dtype": "video",
            "shape": (H, W, 1),
            "names": ["height", "width", "channels"],
            "info": {"is_depth_map": True},
        },
    }

    def frame(rng, ep, f):
        base = rng.integers(0, 255, size=(6, 8, 3), dtype=np.uint8)
        return {
            "observation.state": np.array([ep, f], dtype=np.float32),
            "action": rng.normal(size=2).astype(np.float32),
            "observation.images.rgb": np.kron(base, np.ones((8, 8, 1), dtype=np.uint8)),
            "observation.images.depth": rng.integers(200, 3000, (H, W, 1), dtype=np.uint16),
        }

    return write_with_lerobot(tmp_path_factory.mktemp("depth") / "ds", features, frame)


@pytest.fixture(scope="module")
def language_dataset(tmp_path_factory):
    """The two language columns lerobot 0.6 declares (filled later by lerobot-annotate)."""
    from lerobot.datasets.language import language_feature_info

    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        **language_feature_info(),
    }

    def frame(rng, ep, f):
        return {
            "observation.state": np.array([ep, f], dtype=np.float32),
            "action": rng.normal(size=2).astype(np.float32),
            "language_persistent": None,
            "language_events": None,
        }

    return write_with_lerobot(tmp_path_factory.mktemp("language") / "ds", features, frame)


@pytest.fixture(scope="module")
def depth_image_dataset(tmp_path_factory):
    """A depth camera stored as images (16-bit frames in the data parquet), as lerobot's writer
    stores one without videos."""
    features = {
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        "observation.images.depth": {
            "dtype": "image",
            "shape": (8, 12, 1),
            "names": ["height", "width", "channels"],
            "info": {"is_depth_map": True},
        },
    }

    def frame(rng, ep, f):
        return {
            "action": rng.normal(size=2).astype(np.float32),
            "observation.images.depth": rng.integers(200, 3000, (8, 12, 1), dtype=np.uint16),
        }

    return write_with_lerobot(
        tmp_path_factory.mktemp("depth_image") / "ds", features, frame, use_videos=False
    )


def test_depth_video_is_read(depth_dataset):
    """A depth map stored as video opens and reads (conformance: tests/test_depth.py)."""
    item = LeRobotReader(depth_dataset)[0]
    assert item["observation.images.depth"].dtype == torch.float32
    assert item["observation.images.depth"].shape == (1, H, W)


def test_depth_images_are_refused_at_load_time(depth_image_dataset):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    theirs = LeRobotDataset("local/depth", root=depth_image_dataset)
    assert theirs.meta.depth_keys == ["observation.images.depth"]  # a real 0.6 depth dataset
    assert theirs[0]["observation.images.depth"].shape == (1, 8, 12)
    message = (
        r"The dataset has depth maps, which robo_resume does not read: "
        r"'observation\.images\.depth'\. Expected numeric columns, RGB video features and the "
        r"task.*Found 'observation\.images\.depth' \(dtype 'image', "
        r"is_depth_map in its info\)\. At file .*meta/info\.json\. Fix: read these features "
        r"with lerobot's LeRobotDataset \(depth maps come back as \(1, H, W\) float32 in "
        r"depth_output_unit\), or stream a copy without them with robo_resume: "
        r"lerobot-edit-dataset --repo_id local/copy --root .* --new_root NEW_ROOT "
        r"--operation\.type remove_feature "
        r"--operation\.feature_names \"\['observation\.images\.depth'\]\""
    )
    for load in (
        load_metadata,
        LeRobotReader,
        lambda root: ChunkedEpisodeDataset(root, batch_size=4),
    ):
        with pytest.raises(UnsupportedFeatureError, match=message):
            load(depth_image_dataset)
    assert issubclass(UnsupportedFeatureError, DatasetFormatError)


def test_language_dtype_under_another_name_is_refused(language_dataset, tmp_path):
    """lerobot 0.6 knows language columns by name: the two it declares are read (see
    test_language.py); dtype language on another column fails in lerobot and is refused."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    assert LeRobotDataset("local/lang", root=language_dataset).meta.has_language_columns
    assert unsupported_features(load_metadata(language_dataset).features) == {}
    copy = tmp_path / "ds"
    shutil.copytree(language_dataset, copy)
    info = json.loads((copy / "meta" / "info.json").read_text())
    info["features"]["notes"] = {"dtype": "language", "shape": [1], "names": None}
    (copy / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    with pytest.raises(
        UnsupportedFeatureError,
        match=r"The dataset has language columns, which robo_resume does not read: 'notes'\. "
        r".*Found 'notes' \(dtype 'language' under a name other than language_persistent and "
        r"language_events\)\..*Fix: rename a language column to language_persistent or "
        r"language_events \(the only names lerobot 0\.6 reads as language; it fails on "
        r"others too\), or stream a copy without them "
        r".*--operation\.feature_names \"\['notes'\]\"",
    ):
        LeRobotReader(copy)


def test_the_fix_in_the_message_works(depth_dataset, language_dataset, tmp_path):
    """lerobot's remove_feature makes copies robo_resume reads exactly as lerobot does."""
    no_depth = remove_with_lerobot(
        depth_dataset, tmp_path / "no_depth", ["observation.images.depth"]
    )
    assert compare(no_depth, 11) == 11
    assert compare(no_depth, 11, uint8=True) == 11
    no_lang = remove_with_lerobot(
        language_dataset, tmp_path / "no_lang", ["language_persistent", "language_events"]
    )
    assert compare(no_lang, 11) == 11


def test_depth_flags_lerobot_reads():
    """The three places lerobot 0.6's depth_keys looks (0.4 wrote video.is_depth_map)."""
    rgb = {"dtype": "video", "shape": [H, W, 3]}
    assert not is_depth_map(rgb)
    assert not is_depth_map({**rgb, "info": {"video.is_depth_map": False, "is_depth_map": False}})
    assert is_depth_map({**rgb, "info": {"is_depth_map": True}})
    assert is_depth_map({**rgb, "info": {"video.is_depth_map": True}})
    assert is_depth_map({**rgb, "video_info": {"video.is_depth_map": True}})
    depth_image = {"dtype": "image", "shape": [H, W, 1], "info": {"is_depth_map": True}}
    depth_video = {**rgb, "info": {"is_depth_map": True}}  # read (tests/test_depth.py)
    assert unsupported_features({"a": rgb, "d": depth_image, "v": depth_video}) == {
        "d": "depth map"
    }


def test_encoder_settings_and_unknown_keys_are_accepted(lerobot_written, tmp_path):
    """lerobot 0.6 records encoder settings per video feature; keys robo_resume does not know
    (top level, per feature, in a feature's info) change nothing in the items."""
    info = json.loads((lerobot_written / "meta" / "info.json").read_text())
    cam = info["features"]["observation.images.top"]["info"]
    assert {"video.g", "video.crf", "video.preset", "video.extra_options"} <= set(cam)
    assert cam["is_depth_map"] is False

    copy = tmp_path / "ds"
    shutil.copytree(lerobot_written, copy)
    info["tools"] = [{"type": "function", "function": {"name": "say"}}]
    info["a_future_key"] = {"nested": [1, 2]}
    for ft in info["features"].values():
        ft["a_future_field"] = "x"
        ft.setdefault("info", {})["video.a_future_setting"] = 7
    (copy / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    ours, original = LeRobotReader(copy), LeRobotReader(lerobot_written)
    assert len(ours) == len(original)
    for i in (0, 11, 12, 40, len(ours) - 1):
        a, b = ours[i], original[i]
        assert list(a) == list(b)
        for k, v in b.items():
            assert a[k] == v if isinstance(v, str) else torch.equal(a[k], v), (i, k)
