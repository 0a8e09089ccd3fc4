"""Datasets made by lerobot 0.6.1's dataset tools read as lerobot reads them.

``lerobot-edit-dataset`` runs the functions of ``lerobot.datasets.dataset_tools``; these tests
call the same functions on small datasets written by lerobot's own writer
(``conftest.write_with_lerobot``): ``delete_episodes``, ``split_dataset`` (both parts),
``merge_datasets`` (packed into shards, and one file per source file), ``remove_feature`` (a
column and a camera), ``modify_tasks`` (in place), ``reencode_dataset`` (in place, to h264 with
another GOP) and ``convert_image_to_video_dataset``. Each result is streamed by
``ChunkedEpisodeDataset`` (default order, 0 and 2 workers, windows) and read by
``LeRobotReader`` (every index), and every item equals
``LeRobotDataset(..., return_uint8=True, video_backend="pyav")``'s item of the same index: the
same keys in the same order, dtypes and shapes, a maximum difference of 0. A streamed epoch
holds each frame of its schedule once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import write_with_lerobot
from test_video_meta_disagree import assert_same, lerobot_dataset

from robo_resume import ChunkedEpisodeDataset, LeRobotReader, MetadataMismatchError
from robo_resume.items import unbind

pytestmark = [pytest.mark.lerobot, pytest.mark.timeout(300)]

LENGTHS = (6, 9, 5, 7)  # uneven; all four episodes share one data file and one mp4 per camera
TOP, WRIST = "observation.images.top", "observation.images.wrist"
DELTA = {"observation.state": [-1 / 15, 0.0], "action": [0.0, 1 / 15], TOP: [-1 / 15, 0.0]}


def _lerobot(root: Path, repo_id: str = "local/source"):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(repo_id, root=root, video_backend="pyav")


# --------------------------------------------------------------------------- the edits


def _delete(src: Path, out: Path) -> Path:
    from lerobot.datasets.dataset_tools import delete_episodes

    delete_episodes(_lerobot(src), [1], output_dir=out, repo_id="local/deleted")
    return out


def _split(src: Path, out: Path) -> Path:
    """Episodes 0, 2, 3 (kept segments of a shared mp4, re-encoded) and episode 1."""
    from lerobot.datasets.dataset_tools import split_dataset

    split_dataset(_lerobot(src), {"train": [0, 2, 3], "val": [1]}, output_dir=out)
    return out


def _merge(src: Path, out: Path, *, concatenate: bool) -> Path:
    """The split's parts merged back, ``val`` first: episodes and frames renumbered, the
    second source's from_timestamps offset inside the packed mp4 (or its own files)."""
    from lerobot.datasets.dataset_tools import merge_datasets

    parts = _split(src, out.with_name(out.name + "_parts"))
    merge_datasets(
        [_lerobot(parts / "val", "local/val"), _lerobot(parts / "train", "local/train")],
        "local/merged",
        output_dir=out,
        concatenate_videos=concatenate,
        concatenate_data=concatenate,
    )
    return out


def _remove(src: Path, out: Path) -> Path:
    from lerobot.datasets.dataset_tools import remove_feature

    remove_feature(_lerobot(src), ["action", WRIST], output_dir=out, repo_id="local/removed")
    return out


def _tasks(src: Path, out: Path) -> Path:
    """In place (as lerobot-edit-dataset does) on a copy: one episode's task set, one task
    string replaced, so task_index values are renumbered."""
    from lerobot.datasets.dataset_tools import modify_tasks

    shutil.copytree(src, out)
    modify_tasks(_lerobot(out), episode_tasks={0: "lift"}, task_replacements={"place": "drop"})
    return out


def _reencode(src: Path, out: Path) -> Path:
    """In place on a copy (lerobot-edit-dataset copies first too): every mp4 to h264, GOP 5."""
    from lerobot.configs import RGBEncoderConfig
    from lerobot.datasets.dataset_tools import reencode_dataset

    shutil.copytree(src, out)
    reencode_dataset(_lerobot(out), rgb_encoder=RGBEncoderConfig(vcodec="h264", g=5, crf=18))
    return out


def _convert(src: Path, out: Path) -> Path:
    """A dataset of PNG image features (written by lerobot) encoded into mp4 cameras."""
    from lerobot.datasets.dataset_tools import convert_image_to_video_dataset

    images = write_with_lerobot(
        out.with_name(out.name + "_images"), (6, 9, 5), camera_dtype="image"
    )
    convert_image_to_video_dataset(
        _lerobot(images, "local/images"), output_dir=out, repo_id="local/converted", num_workers=1
    )
    return out


def _cli_delete(src: Path, out: Path) -> Path:
    """The command line itself: ``lerobot-edit-dataset --operation.type delete_episodes``."""
    argv = [sys.executable, "-m", "lerobot.scripts.lerobot_edit_dataset", "--repo_id"]
    argv += ["local/source", "--root", str(src), "--new_root", str(out)]
    argv += ["--operation.type", "delete_episodes", "--operation.episode_indices", "[0, 2]"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


EDITS: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    # name: (edit, the dataset folder to read, relative to the edit's output)
    "delete_episodes": (_delete, "."),
    "cli_delete_episodes": (_cli_delete, "."),
    "split_train": (_split, "train"),
    "split_val": (_split, "val"),
    "merge": (lambda s, o: _merge(s, o, concatenate=True), "."),
    "merge_per_file": (lambda s, o: _merge(s, o, concatenate=False), "."),
    "remove_feature": (_remove, "."),
    "modify_tasks": (_tasks, "."),
    "reencode_videos": (_reencode, "."),
    "convert_image_to_video": (_convert, "."),
}
FRAMES = {  # frames the edited dataset must hold (not read from it: the edit could lose some)
    "delete_episodes": 6 + 5 + 7,
    "cli_delete_episodes": 9 + 7,
    "split_train": 6 + 5 + 7,
    "split_val": 9,
    "merge": sum(LENGTHS),
    "merge_per_file": sum(LENGTHS),
    "remove_feature": sum(LENGTHS),
    "modify_tasks": sum(LENGTHS),
    "reencode_videos": sum(LENGTHS),
    "convert_image_to_video": 6 + 9 + 5,
}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """lerobot-written v3.0: four uneven episodes, two 48x64 cameras."""
    return write_with_lerobot(tmp_path_factory.mktemp("tools_source") / "ds", LENGTHS)


@pytest.fixture(scope="module")
def edited(source, tmp_path_factory) -> Callable[[str], Path]:
    """``edited(name)``: the folder of EDITS[name]'s result, made once per module."""
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        edit, sub = EDITS[name]
        key = edit.__name__ if sub != "." else name
        if key not in made:
            made[key] = edit(source, tmp_path_factory.mktemp(name) / "out")
        return (made[key] / sub).resolve()

    return make


# --------------------------------------------------------------------------- comparison


def windows(root: Path, delta: dict[str, list[float]] | None = DELTA):
    """``delta`` without the features the edit removed."""
    features = json.loads((root / "meta" / "info.json").read_text())["features"]
    return None if delta is None else {k: v for k, v in delta.items() if k in features}


def schedule_frames(ds: ChunkedEpisodeDataset, num_workers: int) -> list[int]:
    """The dataset ``index`` values the first epoch's schedule gives all streams."""
    sched = ds.schedule(num_workers)
    streams = range(max(num_workers, 1))
    return [int(i) for s in streams for i in sched.frame_indices(0, s)]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", list(EDITS))
def test_streamed_items_equal_lerobot(edited, name, num_workers):
    root = edited(name)
    delta = windows(root)
    theirs = lerobot_dataset(root, delta_timestamps=delta)
    assert len(theirs) == FRAMES[name]
    ds = ChunkedEpisodeDataset(root, batch_size=4, delta_timestamps=delta, image_dtype="uint8")
    tracker = ds.tracker()
    seen = []
    for batch in ds.dataloader(num_workers=num_workers):
        for row in unbind(tracker.consume(batch)):
            i = int(row["index"])
            assert_same(row, theirs[i], f"{name} streamed index={i} ({num_workers} workers)")
            seen.append(i)
    want = schedule_frames(ds, num_workers)
    assert Counter(seen) == Counter(want), f"{name}: the epoch is not its schedule's frames"
    assert len(set(seen)) == len(seen), f"{name}: a frame twice in one epoch"
    if num_workers == 0:
        assert sorted(seen) == list(range(len(theirs)))
    else:  # equal shares per stream: fewer than one frame per stream is dropped
        assert len(theirs) - len(seen) < num_workers


@pytest.mark.parametrize("delta", [None, DELTA], ids=["plain", "window"])
@pytest.mark.parametrize("name", list(EDITS))
def test_reader_items_equal_lerobot(edited, name, delta):
    root = edited(name)
    delta = windows(root, delta)
    theirs = lerobot_dataset(root, delta_timestamps=delta)
    ours = LeRobotReader(root, delta_timestamps=delta, image_dtype="uint8")
    assert len(ours) == len(theirs) == FRAMES[name]
    for i in range(len(ours)):
        assert_same(ours[i], theirs[i], f"{name} reader[{i}]")


def test_edits_did_what_they_say(edited):
    """The edits are real: so the comparisons above are not of the unedited source."""
    assert LeRobotReader(edited("remove_feature"))[0].keys().isdisjoint({"action", WRIST})
    tasks = {LeRobotReader(edited("modify_tasks"))[i]["task"] for i in (0, 6, 15, 20)}
    assert tasks == {"lift", "drop", "push", "pick"}
    merged = LeRobotReader(edited("merge"))
    state = np.stack([merged[i]["observation.state"].numpy() for i in range(len(merged))])
    # val (source episode 1) first, then train (0, 2, 3): the state holds (episode, frame)
    assert [int(e) for e in state[:, 0][np.r_[True, np.diff(state[:, 0]) != 0]]] == [1, 0, 2, 3]
    info = (edited("reencode_videos") / "meta" / "info.json").read_text()
    assert '"video.codec": "h264"' in info and '"video.g": 5' in info


def test_convert_image_to_video_of_some_episodes_is_broken_in_lerobot(tmp_path, monkeypatch):
    """lerobot 0.6.1's ``convert_image_to_video_dataset(episode_indices=[0, 2])`` keeps the
    source's episode_index (0, 2) and ``index`` values (0-5, 15-19) while meta/ numbers the
    episodes' rows 0-10, so lerobot cannot load its own result: ``LeRobotDataset`` finds episode
    1 missing locally and goes to the Hub (``OfflineModeIsEnabled`` here, no network), and with
    ``episodes=[0, 2]`` raises ``IndexError: Episode index 2 out of range``. robo_resume reads
    episode 0 as lerobot does and refuses episode 2's rows, naming the file and the index."""
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled
    from lerobot.datasets.dataset_tools import convert_image_to_video_dataset

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    images = write_with_lerobot(
        tmp_path / "images", (6, 9, 5), cameras=("top",), camera_dtype="image"
    )
    out = tmp_path / "converted"
    with pytest.raises(OfflineModeIsEnabled):  # the tool's last step: LeRobotDataset(out)
        convert_image_to_video_dataset(
            _lerobot(images, "local/images"), output_dir=out, episode_indices=[0, 2], num_workers=1
        )
    with pytest.raises(OfflineModeIsEnabled):
        lerobot_dataset(out)
    with pytest.raises(IndexError, match="Episode index 2 out of range"):
        lerobot_dataset(out, episodes=[0, 2])

    theirs = lerobot_dataset(out, episodes=[0])
    ours = LeRobotReader(out, episodes=[0], image_dtype="uint8")
    assert len(ours) == len(theirs) == 6
    for i in range(6):
        assert_same(ours[i], theirs[i], f"converted episode 0 [{i}]")
    reader = LeRobotReader(out)
    with pytest.raises(
        MetadataMismatchError, match=r"(?s)Expected index=6\. Found index=15.*episode 2, frame 0"
    ):
        reader[6]
