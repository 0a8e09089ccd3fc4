"""features=: a feature left out is never opened or decoded (single dataset, reader and mix).

The proof is a dataset whose left-out camera's mp4 files are deleted: with the camera selected
the dataset refuses to stream (MissingFileError naming the file); without it, every item equals
the full dataset's item minus that key, with 0 and 2 workers.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from robo_resume import ChunkedEpisodeDataset, LeRobotReader, MixedDataset, MixSource
from robo_resume.errors import MissingFileError
from robo_resume.format.metadata import load_metadata

CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"


@pytest.fixture(scope="module")
def roots(factory):
    """A dataset with two cameras (a tuple, to unpack like the other fixtures)."""
    return (factory(episode_lengths=(9, 14, 6), num_cameras=2).root,)


@pytest.fixture(scope="module")
def no_cam1(roots, tmp_path_factory):
    (full,) = roots
    root = tmp_path_factory.mktemp("nocam1") / "ds"
    shutil.copytree(full, root)
    gone = sorted((root / "videos").rglob("*.mp4"))
    gone = [p for p in gone if CAM1 in p.as_posix()]
    assert gone, "the factory wrote no cam1 mp4 to delete"
    for p in gone:
        p.unlink()
    return root


def _batches(ds, num_workers):
    return [b for b in ds.dataloader(num_workers=num_workers)]


def _same(a, b, skip=()):
    assert set(a) - set(skip) == set(b), (sorted(a), sorted(b))
    for k in b:
        if isinstance(b[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dropped_camera_is_never_opened(roots, no_cam1, num_workers):
    (full,) = roots
    with pytest.raises(MissingFileError, match=r"cam1"):
        _batches(ChunkedEpisodeDataset(no_cam1, batch_size=4, seed=1), 0)
    want = _batches(ChunkedEpisodeDataset(full, batch_size=4, seed=1), num_workers)
    for features in ({CAM1: None}, [k for k in load_metadata(full).features if k != CAM1]):
        ds = ChunkedEpisodeDataset(no_cam1, batch_size=4, seed=1, features=features)
        got = _batches(ds, num_workers)
        assert len(got) == len(want)
        for a, b in zip(want, got, strict=True):
            _same(a, b, skip=(CAM1,))


def test_reader_and_mix_leave_the_dropped_camera_alone(roots, no_cam1):
    (full,) = roots
    reader = LeRobotReader(no_cam1, features={CAM1: None})
    ref = LeRobotReader(full)
    for i in (0, 10, len(ref) - 1):
        _same(ref[i], reader[i], skip=(CAM1,))
    mix = MixedDataset(
        [MixSource(no_cam1, 1, keys={CAM1: None}), MixSource(full, 1, keys={CAM1: None})],
        batch_size=4,
        exhausted="stop",
    )
    batches = list(mix.dataloader(num_workers=0))
    assert batches and all(CAM1 not in b and CAM0 in b for b in batches)


def test_same_frames_same_state_whatever_the_selection(roots):
    """The selection changes what an item holds, not which frames: a state resumes across it."""
    (full,) = roots
    a = ChunkedEpisodeDataset(full, batch_size=4, seed=2)
    b = ChunkedEpisodeDataset(full, batch_size=4, seed=2, features={CAM1: None})
    assert a.fingerprint == b.fingerprint
    ia = [x["index"].tolist() for x in a.dataloader(num_workers=0)]
    ib = [x["index"].tolist() for x in b.dataloader(num_workers=0)]
    assert ia == ib


@pytest.mark.parametrize(
    "features,pattern",
    [
        ({"nope": None}, r"names keys the dataset does not have.*Found \['nope'\]"),
        ({CAM1: CAM0}, r"renames a feature to the name of another feature.*Found \['"),
        (
            {"index": None, "action": None},
            r"drops columns every item needs.*Found \{key: None\} for \['index'\].*"
            r"take these keys out of the mapping",
        ),
        ("action", r"must name keys"),
    ],
)
def test_bad_selections_are_refused(roots, features, pattern):
    """(A list of keys to keep keeps the columns every item needs by itself.)"""
    (full,) = roots
    with pytest.raises(ValueError, match=pattern):
        ChunkedEpisodeDataset(full, batch_size=4, features=features)


def test_a_list_of_keys_keeps_the_columns_every_item_needs(roots):
    (full,) = roots
    ds = ChunkedEpisodeDataset(full, batch_size=4, seed=2, features=["action"])
    batch = next(iter(ds.dataloader(num_workers=0)))
    assert {"action", "index", "episode_index", "frame_index", "timestamp"} <= set(batch)
    assert CAM0 not in batch and CAM1 not in batch and "observation.state" not in batch
