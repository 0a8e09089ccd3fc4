"""Bad input gets a specific exception whose message names the file, the episode and the fix."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from robo_resume import (
    ChunkedEpisodeDataset,
    CorruptFileError,
    DatasetFormatError,
    LeRobotReader,
    MetadataMismatchError,
    MissingFileError,
    RoboResumeError,
    UnsupportedVersionError,
    load_metadata,
)


@pytest.fixture
def copy(factory, tmp_path):
    """A fresh writable copy of a small factory dataset (v3.0, 1 camera)."""

    def make(**kw):
        src = factory(**kw).root
        dst = tmp_path / "bad"
        shutil.copytree(src, dst)
        return dst

    return make


def edit_info(root, **changes):
    info = json.loads((root / "meta" / "info.json").read_text())
    for k, v in changes.items():
        if v is None:
            info.pop(k, None)
        else:
            info[k] = v
    (root / "meta" / "info.json").write_text(json.dumps(info))


def test_open50_missing_video_names_file_and_episode(open50):
    reader = LeRobotReader(open50, episodes=[1])
    with pytest.raises(MissingFileError, match=r"file-001\.mp4.*episode 1.*Fix: .*episodes="):
        reader[0]


def test_open50_other_episodes_work(open50):
    reader = LeRobotReader(open50, episodes=[0, 3])
    assert reader[0]["image"].shape == (3, 480, 640)
    assert int(reader[len(reader) - 1]["episode_index"]) == 3


def test_missing_fps(copy):
    root = copy()
    edit_info(root, fps=None)
    with pytest.raises(DatasetFormatError, match=r"no 'fps'.*info\.json"):
        load_metadata(root)


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
@pytest.mark.parametrize(
    ("fps", "shown"),
    [(float("nan"), "nan"), (float("inf"), "inf"), (0, "0"), (-30, "-30"), (-0.5, "-0.5")],
)
def test_fps_that_is_no_frame_rate_is_refused_at_load(copy, version, fps, shown):
    """NaN and inf fps (json writes and reads them) were accepted at load, and windows then
    raised a bare ValueError from delta_indices; refused at load like 0 and negative rates."""
    root = copy(version=version)
    edit_info(root, fps=fps)
    with pytest.raises(
        DatasetFormatError,
        match=rf"invalid fps\. Expected a positive finite number.*Found {shown}\..*"
        r"info\.json.*Fix: set fps in meta/info\.json",
    ):
        load_metadata(root)
    with pytest.raises(DatasetFormatError, match="invalid fps"):
        ChunkedEpisodeDataset(root, batch_size=2, delta_timestamps={"action": [0.0, 0.1]})


V21_JSON_FILES = ["info.json", "stats.json", "episodes.jsonl", "tasks.jsonl"]


@pytest.mark.parametrize("name", [*V21_JSON_FILES, "episodes.jsonl:key"])
def test_bytes_that_are_not_utf8_in_a_json_file_name_the_file_and_the_byte(copy, name):
    """Non-UTF-8 bytes in episodes.jsonl raised UnicodeDecodeError from pyarrow's reader (in
    a task string or a key: pyarrow takes any bytes), in tasks.jsonl from read_text."""
    name, _, where = name.partition(":")
    root = copy(version="v2.1")
    path = root / "meta" / name
    data = path.read_bytes()
    if where == "key":  # inside the first key of the second line
        at = data.index(b"\n") + 2
    else:  # inside the last string of the file
        at = data.rindex(b'"')
    line = data.count(b"\n", 0, at) + 1
    path.write_bytes(data[:at] + b"\xff\xfe" + data[at:])
    with pytest.raises(
        CorruptFileError,
        match=rf"not valid UTF-8.*byte 0xff at byte offset {at} \(line {line},.*"
        rf"At file .*meta/{name}\. Fix: restore the file",
    ):
        LeRobotReader(root)


def test_missing_features(copy):
    root = copy()
    edit_info(root, features=None)
    with pytest.raises(DatasetFormatError, match=r"no 'features'.*info\.json"):
        load_metadata(root)


@pytest.mark.parametrize(
    ("version", "hint"),
    [
        ("v2.0", "convert_dataset_v20_to_v21"),
        ("v1.6", "convert_dataset_v1_to_v2"),
        ("v9.9", "convert_dataset_v21_to_v30"),
    ],
)
def test_unsupported_version(copy, version, hint):
    root = copy()
    edit_info(root, codebase_version=version)
    with pytest.raises(
        UnsupportedVersionError, match=rf"Expected v2\.1 or v3\.0.*{version}.*{hint}"
    ):
        load_metadata(root)


def test_bad_json(copy):
    root = copy()
    (root / "meta" / "info.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match=r"not valid JSON.*info\.json"):
        load_metadata(root)


def test_missing_root(tmp_path):
    with pytest.raises(MissingFileError, match="dataset root does not exist"):
        load_metadata(tmp_path / "nope")


def test_corrupt_parquet(copy):
    root = copy()
    meta = load_metadata(root)
    ep = meta.episodes[0]
    (root / ep.data_path).write_bytes(b"PAR1 this is not parquet")
    reader = LeRobotReader(root)
    with pytest.raises(
        CorruptFileError, match=rf"not a readable parquet.*{ep.data_path}.*episode 0"
    ):
        reader[0]


def test_row_count_disagrees(copy):
    root = copy()
    meta = load_metadata(root)
    ep = meta.episodes[0]
    path = root / ep.data_path
    df = pd.read_parquet(path)
    df.iloc[:-3].to_parquet(path)
    with pytest.raises(MetadataMismatchError, match=rf"number of rows.*{ep.data_path}.*episode 0"):
        LeRobotReader(root)[0]


def test_truncated_video(copy):
    root = copy(codec="h264", gop=250)
    meta = load_metadata(root)
    ep = meta.episodes[-1]
    path = root / ep.videos[meta.camera_keys[0]].path
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    reader = LeRobotReader(root, episodes=[ep.episode_index])
    with pytest.raises(RoboResumeError, match=rf"{path.name}.*episode {ep.episode_index}"):
        for i in range(len(reader)):
            reader[i]


def test_zero_byte_video(copy):
    root = copy()
    meta = load_metadata(root)
    ep = meta.episodes[0]
    path = root / ep.videos[meta.camera_keys[0]].path
    path.write_bytes(b"")
    with pytest.raises(CorruptFileError, match=rf"cannot be opened.*{path.name}.*episode 0.*Fix"):
        LeRobotReader(root)[0]


def test_path_escaping_root(copy):
    root = copy()
    edit_info(root, data_path="../../etc/{chunk_index}{file_index}.parquet")
    with pytest.raises(DatasetFormatError, match=r"escapes the dataset root"):
        load_metadata(root)


def test_streaming_reports_missing_video(open50):
    ds = ChunkedEpisodeDataset(open50, batch_size=4, episodes=[0, 1], chunk_frames=32)
    with pytest.raises(MissingFileError, match=r"file-001\.mp4.*episode 1"):
        for _ in ds:
            pass


def test_unknown_delta_key(factory):
    root = factory().root
    with pytest.raises(DatasetFormatError, match=r"unknown feature 'actions'.*Fix"):
        LeRobotReader(root, delta_timestamps={"actions": [0.0]})


@pytest.mark.timeout(20)
@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_huge_length_everywhere_is_refused_quickly(copy, version):
    """10^12 frames in the episode metadata and in info.json's total_frames: no planning loop."""
    root = copy(version=version, episode_lengths=(5, 7))
    huge = 10**12
    if version == "v3.0":
        path = next((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        df = pd.read_parquet(path)
        df.loc[df["episode_index"] == 1, ["length", "dataset_to_index"]] = [huge, 5 + huge]
        df.to_parquet(path)
    else:
        path = root / "meta" / "episodes.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        rows[1]["length"] = huge
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    edit_info(root, total_frames=5 + huge)
    for make in (load_metadata, LeRobotReader, lambda r: ChunkedEpisodeDataset(r, batch_size=4)):
        with pytest.raises(
            DatasetFormatError, match=r"impossibly long.*Found length 1000000000000.*episode 1"
        ):
            make(root)


@pytest.mark.timeout(10)
def test_plan_size_is_bounded_before_allocating():
    from robo_resume.index.plan import MAX_PLAN_CHUNKS, EpisodeSpan, make_chunks

    spans = [EpisodeSpan(e, e * 2**27, 2**27) for e in range(4)]
    with pytest.raises(
        DatasetFormatError,
        match=rf"plan would be too large.*at most {MAX_PLAN_CHUNKS} chunks.*at least "
        rf"{4 * 2**27} chunks.*episode 0.*Fix: check the episode lengths",
    ):
        make_chunks(spans, 1)


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_frame_task_not_listed_by_its_episode(copy, version):
    """A frame whose task_index is a valid task of the dataset but not one its episode's
    metadata lists is refused (it was read as that other task; found by test_fuzz's long run)."""
    root = copy(episode_lengths=(5, 7, 4), version=version)
    meta = load_metadata(root)
    ep = meta.episodes[0]
    assert len(meta.tasks) > 1 and len(ep.tasks) == 1  # another valid task exists
    other = next(i for i, t in enumerate(meta.tasks) if t not in ep.tasks)
    path = root / ep.data_path
    df = pd.read_parquet(path)
    row = int(df.index[(df.episode_index == 0) & (df.frame_index == 2)][0])
    df.loc[row, "task_index"] = other
    df.to_parquet(path)
    message = (
        rf"task_index' names a task that its episode's metadata does not list.*"
        rf"{ep.data_path}.*episode 0.*frame 2"
    )
    with pytest.raises(MetadataMismatchError, match=message):
        LeRobotReader(root)[2]
    ds = ChunkedEpisodeDataset(root, batch_size=4, episodes=[0])
    with pytest.raises(MetadataMismatchError, match=message):
        next(iter(ds.dataloader(num_workers=0)))
