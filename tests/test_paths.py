"""Every file a dataset opens resolves inside its root (symlinks followed), except a Hugging Face
cache snapshot's links into its own ../../blobs folder (robo_resume.format.validate.inside_root).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_hub import populate_cache, repo_files

from robo_resume import ChunkedEpisodeDataset, DatasetFormatError, LeRobotReader, load_metadata

pytestmark = pytest.mark.timeout(60)

LENGTHS = (6, 9, 5)
CAM = "observation.images.cam0"
DATA0 = "data/chunk-000/file-000.parquet"
VIDEO1 = f"videos/{CAM}/chunk-000/file-001.mp4"


@pytest.fixture(scope="module")
def source(factory) -> Path:
    return factory(episode_lengths=LENGTHS, codec="h264", gop=4).root


@pytest.fixture(scope="module")
def other(factory) -> Path:
    """Another dataset with the same layout and sizes: its files would be read silently."""
    return factory(episode_lengths=LENGTHS, codec="h264", gop=4, fps=10, state_dim=4).root


@pytest.fixture
def copy(source, tmp_path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(source, root)
    return root


def link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


def _read_all(root: Path) -> list[dict]:
    reader = LeRobotReader(root)
    return [reader[i] for i in range(len(reader))]


def _stream(root: Path) -> None:
    for _ in ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=4).dataloader():
        pass


OUTSIDE = (
    r"resolves to a place outside the dataset root.*Found {path} -> {target}\. "
    r"At file {path}, episode {episode}\. Fix: copy"
)


def test_data_file_linked_to_etc_passwd_is_refused(copy):
    link(copy / DATA0, Path("/etc/passwd"))
    load_metadata(copy)  # only meta/ is checked at load; the data file when it is opened
    match = OUTSIDE.format(path=re.escape(str(copy / DATA0)), target="/etc/passwd", episode=0)
    with pytest.raises(DatasetFormatError, match=match):
        LeRobotReader(copy)[0]
    # the stream meets the file at whichever of its two episodes the shuffle reads first
    match = OUTSIDE.format(path=re.escape(str(copy / DATA0)), target="/etc/passwd", episode="[01]")
    with pytest.raises(DatasetFormatError, match=match):
        _stream(copy)


def test_video_linked_to_another_datasets_file_is_refused(copy, other):
    target = (other / VIDEO1).resolve()
    link(copy / VIDEO1, target)
    match = OUTSIDE.format(
        path=re.escape(str(copy / VIDEO1)), target=re.escape(str(target)), episode=2
    )
    with pytest.raises(DatasetFormatError, match=match):
        LeRobotReader(copy, episodes=[2])[0]
    with pytest.raises(DatasetFormatError, match=match):
        _stream(copy)


def test_relative_link_climbing_out_is_refused(copy, other):
    rel = os.path.relpath(other / DATA0, (copy / DATA0).parent)
    assert rel.startswith("..")
    link(copy / DATA0, Path(rel))
    with pytest.raises(DatasetFormatError, match=r"outside the dataset root.*episode 0"):
        LeRobotReader(copy)[0]


def test_metadata_folder_linked_elsewhere_is_refused_at_load(copy, other):
    shutil.rmtree(copy / "meta" / "episodes")
    (copy / "meta" / "episodes").symlink_to(other / "meta" / "episodes")
    for make in (load_metadata, LeRobotReader, lambda r: ChunkedEpisodeDataset(r, batch_size=4)):
        with pytest.raises(DatasetFormatError, match=r"outside the dataset root.*meta/episodes"):
            make(copy)


def test_links_inside_the_root_are_followed(copy):
    """A link to another place inside the dataset is not an escape."""
    (copy / "store").mkdir()
    (copy / DATA0).rename(copy / "store" / "d0.parquet")
    (copy / DATA0).symlink_to(Path("../../store/d0.parquet"))
    assert len(_read_all(copy)) == sum(LENGTHS)


def test_hub_cache_snapshot_links_into_its_blobs_are_allowed(source, tmp_path):
    snapshot = populate_cache(source, tmp_path / "cache", repo_files(source))
    assert (snapshot / DATA0).is_symlink()
    assert (snapshot / DATA0).resolve().parent.name == "blobs"
    got, want = _read_all(snapshot), _read_all(source)
    assert len(got) == len(want) == sum(LENGTHS)
    for a, b in zip(got, want, strict=True):
        for k, v in b.items():
            assert np.array_equal(np.asarray(a[k]), np.asarray(v)), k
    _stream(snapshot)


def test_hub_cache_snapshot_link_into_another_repos_blobs_is_refused(source, other, tmp_path):
    snapshot = populate_cache(source, tmp_path / "cache", repo_files(source))
    foreign = populate_cache(
        other, tmp_path / "cache", repo_files(other), repo_id="someone/else", commit="f" * 40
    )
    target = (foreign / VIDEO1).resolve()
    assert target.parent.name == "blobs" and "someone--else" in str(target)
    link(snapshot / VIDEO1, Path(os.path.relpath(target, (snapshot / VIDEO1).parent)))
    with pytest.raises(DatasetFormatError, match=r"outside the dataset root.*someone--else"):
        LeRobotReader(snapshot, episodes=[2])[0]
