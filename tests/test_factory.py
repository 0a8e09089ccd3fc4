"""The dataset factory (robo_resume.testing) writes real LeRobot datasets with known truth."""

from __future__ import annotations

import json
import os
from pathlib import Path

import av
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from robo_resume.testing import (
    CODECS,
    decode_frame_identity,
    expected_action,
    expected_state,
    frame_image,
    make_dataset,
)

CODEC_GOPS = {"av1": 2, "h264": 250, "mpeg4": 12}
SIZES = [(48, 64), (96, 96), (224, 224), (480, 640)]


def decode_mp4(path: Path) -> tuple[list[np.ndarray], list[float], list[int]]:
    """Every frame (RGB HWC), its time in seconds, and the frame numbers of keyframe packets."""
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        pkts = sorted((p.pts, p.is_keyframe) for p in c.demux(stream) if p.size)
    keyframes = [i for i, (_, key) in enumerate(pkts) if key]
    with av.open(str(path)) as c:
        frames = list(c.decode(video=0))
    return (
        [f.to_ndarray(format="rgb24") for f in frames],
        [float(f.time) for f in frames],
        keyframes,
    )


def episodes_table(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")


# --------------------------------------------------------------------------- pixel pattern


def test_pattern_roundtrip_all_layouts():
    for h, w in SIZES:
        for e, f, c in ((0, 0, 0), (16383, 65535, 3), (300, 4000, 2), (7, 1, 1)):
            img = frame_image(e, f, c, h, w)
            assert img.shape == (h, w, 3) and img.dtype == np.uint8
            assert set(np.unique(img)) <= {30, 225}
            chw = np.ascontiguousarray(img.transpose(2, 0, 1))
            for variant in (
                img,
                chw,
                chw.astype(np.float32) / 255,
                torch.from_numpy(chw),
                torch.from_numpy(chw).float() / 255,
                torch.from_numpy(img),
            ):
                assert decode_frame_identity(variant) == (e, f, c)
    # neighbours differ in many cells (the checksum spreads a one-bit change)
    a, b = frame_image(3, 10, 0, 48, 64), frame_image(3, 11, 0, 48, 64)
    assert (a != b).mean() > 0.1


def test_pattern_rejects_damage_and_strangers():
    img = frame_image(5, 17, 1, 96, 96)
    noisy = np.clip(img.astype(int) + np.random.default_rng(0).integers(-60, 61, img.shape), 0, 255)
    assert decode_frame_identity(noisy.astype(np.uint8)) == (5, 17, 1)
    flipped = img.copy()
    flipped[:16, :12] = 255 - flipped[:16, :12]  # invert cell (0, 0)
    with pytest.raises(ValueError, match="checksum"):
        decode_frame_identity(flipped)
    with pytest.raises(ValueError, match="checksum"):
        decode_frame_identity(np.zeros((48, 64, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="too small"):
        decode_frame_identity(np.zeros((40, 64, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="Cannot encode"):
        frame_image(2**14, 0, 0, 48, 64)


# --------------------------------------------------------------------------- video


@pytest.mark.parametrize("size", [(48, 64), (96, 96)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(("codec", "gop"), CODEC_GOPS.items(), ids=list(CODEC_GOPS))
def test_frame_identity_survives_codec(tmp_path, codec, gop, size):
    h, w = size
    ds = make_dataset(tmp_path / "ds", codec=codec, gop=gop, height=h, width=w, num_cameras=2)
    info = json.loads((ds.root / "meta" / "info.json").read_text())
    eps = episodes_table(ds.root)
    checked = 0
    for c, cam in enumerate(ds.camera_keys):
        assert info["features"][cam]["info"]["video.codec"] == codec
        files = eps.groupby([f"videos/{cam}/chunk_index", f"videos/{cam}/file_index"])
        for (chunk, file), rows in files:
            path = ds.root / info["video_path"].format(
                video_key=cam, chunk_index=chunk, file_index=file
            )
            images, times, keyframes = decode_mp4(path)
            expected = [None] * len(images)
            for _, row in rows.iterrows():
                start = round(row[f"videos/{cam}/from_timestamp"] * ds.fps)
                assert row[f"videos/{cam}/to_timestamp"] == pytest.approx(
                    (start + row["length"]) / ds.fps
                )
                for f in range(row["length"]):
                    expected[start + f] = (row["episode_index"], f, c)
            assert len(images) == int(rows["length"].sum()) and None not in expected
            assert [decode_frame_identity(img) for img in images] == expected
            assert times == pytest.approx([i / ds.fps for i in range(len(images))])
            assert keyframes == list(range(0, len(images), gop))
            checked += len(images)
    assert checked == ds.total_frames * 2


def test_every_codec_is_tested():
    assert tuple(CODEC_GOPS) == CODECS == ("av1", "h264", "mpeg4")


# --------------------------------------------------------------------------- lerobot


@pytest.mark.lerobot
@pytest.mark.parametrize("num_cameras", [0, 1, 2])
def test_v30_loads_in_lerobot(tmp_path, num_cameras):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = make_dataset(tmp_path / "ds", num_cameras=num_cameras)
    lds = LeRobotDataset("local/factory", root=ds.root, video_backend="pyav")
    assert len(lds) == ds.total_frames == 120
    assert lds.meta.total_episodes == len(ds.episode_lengths)
    for e, f in ((0, 0), (0, 22), (1, 0), (1, 40), (2, 5), (3, 29), (4, 0), (4, 8)):
        i = ds.dataset_index(e, f)
        item = lds[i]
        assert int(item["episode_index"]) == e and int(item["frame_index"]) == f
        assert int(item["index"]) == i
        assert torch.equal(item["observation.state"], torch.from_numpy(expected_state(e, f, 4)))
        assert torch.equal(item["action"], torch.from_numpy(expected_action(e, f, 3)))
        assert float(item["timestamp"]) == np.float32(f / ds.fps)
        assert item["task"] == ds.tasks[ds.episode_task_index(e)] == ds.tasks[e % 2]
        for c, cam in enumerate(ds.camera_keys):
            assert item[cam].shape == (3, ds.height, ds.width)
            assert decode_frame_identity(item[cam]) == (e, f, c)
        assert set(ds.camera_keys) <= set(item)


@pytest.mark.lerobot
def test_v30_files_match_what_lerobot_writes(tmp_path, lerobot_written):
    """Same parquet column names, order and Arrow types, same info.json keys as lerobot 0.6.1.

    lerobot 0.6 changed what it writes (0.4.4 differed): integer min/max stats are floats, the
    tasks.parquet index is named "task", info.json keys come in another order, and a camera's
    info records its encoder settings (video.g, video.crf, ...) and is_depth_map.
    """
    ds = make_dataset(tmp_path / "ds", num_cameras=2, state_dim=3, action_dim=2, fps=15)
    cams = dict(
        zip(("observation.images.top", "observation.images.wrist"), ds.camera_keys, strict=True)
    )

    def rename(name: str) -> str:
        for theirs, ours in cams.items():
            name = name.replace(theirs, ours)
        return name

    def schema(path: Path) -> list[tuple[str, pa.DataType]]:
        return [(rename(f.name), f.type) for f in pq.read_schema(path)]

    data = "data/chunk-000/file-000.parquet"
    assert schema(ds.root / data) == schema(lerobot_written / data)
    ours_meta = pq.read_schema(ds.root / data).metadata[b"huggingface"]
    theirs_meta = pq.read_schema(lerobot_written / data).metadata[b"huggingface"]
    assert json.loads(ours_meta)["info"] == json.loads(theirs_meta)["info"]
    episodes = "meta/episodes/chunk-000/file-000.parquet"
    assert schema(ds.root / episodes) == schema(lerobot_written / episodes)
    tasks = "meta/tasks.parquet"
    assert schema(ds.root / tasks) == schema(lerobot_written / tasks)

    ours = json.loads((ds.root / "meta" / "info.json").read_text())
    theirs = json.loads((lerobot_written / "meta" / "info.json").read_text())
    assert list(ours) == list(theirs)
    for key in ("codebase_version", "data_path", "video_path", "robot_type", "fps"):
        assert ours[key] == theirs[key]
    for theirs_key, ours_key in cams.items():
        ours_ft, theirs_ft = ours["features"][ours_key], theirs["features"][theirs_key]
        assert list(ours_ft["info"]) == list(theirs_ft["info"])
        # the one setting the factory encodes with on purpose differently (see _codec_options)
        assert (ours_ft["info"]["video.preset"], theirs_ft["info"]["video.preset"]) == (8, 12)
        ours_ft["info"]["video.preset"] = theirs_ft["info"]["video.preset"]
        assert ours_ft == theirs_ft
    for key in ("observation.state", "action", "timestamp", "index", "task_index"):
        assert ours["features"][key] == theirs["features"][key]
    ours_stats = json.loads((ds.root / "meta" / "stats.json").read_text())
    theirs_stats = json.loads((lerobot_written / "meta" / "stats.json").read_text())
    assert {rename(k) for k in theirs_stats} == set(ours_stats)
    for key, stats in theirs_stats.items():
        assert set(stats) == set(ours_stats[rename(key)])
        for name, value in stats.items():
            assert np.shape(value) == np.shape(ours_stats[rename(key)][name]), (key, name)


# --------------------------------------------------------------------------- layouts


def test_v30_layout_and_values(tmp_path):
    ds = make_dataset(tmp_path / "ds", num_cameras=1)
    root = ds.root
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    cam = ds.camera_keys[0]
    assert files == sorted(
        [
            "data/chunk-000/file-000.parquet",
            "data/chunk-000/file-001.parquet",
            "data/chunk-001/file-000.parquet",
            f"videos/{cam}/chunk-000/file-000.mp4",
            f"videos/{cam}/chunk-000/file-001.mp4",
            f"videos/{cam}/chunk-001/file-000.mp4",
            "meta/episodes/chunk-000/file-000.parquet",
            "meta/info.json",
            "meta/stats.json",
            "meta/tasks.parquet",
        ]
    )
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["chunks_size"] == 2
    assert info["total_frames"] == 120 and info["total_episodes"] == 5 and info["total_tasks"] == 2
    assert info["splits"] == {"train": "0:5"}
    assert info["features"]["observation.state"] == {
        "dtype": "float32",
        "shape": [4],
        "names": None,
    }

    eps = episodes_table(root)
    assert eps["episode_index"].tolist() == [0, 1, 2, 3, 4]
    assert eps["length"].tolist() == [23, 41, 17, 30, 9]
    assert [list(t) for t in eps["tasks"]] == [[ds.tasks[e % 2]] for e in range(5)]
    assert eps["data/chunk_index"].tolist() == [0, 0, 0, 0, 1]
    assert eps["data/file_index"].tolist() == [0, 0, 1, 1, 0]
    assert eps["dataset_from_index"].tolist() == [0, 23, 64, 81, 111]
    assert eps["dataset_to_index"].tolist() == [23, 64, 81, 111, 120]
    assert eps[f"videos/{cam}/from_timestamp"].tolist() == [0.0, 2.3, 0.0, 1.7, 0.0]
    assert eps[f"videos/{cam}/to_timestamp"].tolist() == [2.3, 6.4, 1.7, 4.7, 0.9]
    assert eps[f"videos/{cam}/file_index"].tolist() == [0, 0, 1, 1, 0]
    tasks = pd.read_parquet(root / "meta" / "tasks.parquet")
    assert tasks.index.tolist() == list(ds.tasks) and tasks["task_index"].tolist() == [0, 1]

    seen = []
    for _, row in eps.drop_duplicates(["data/chunk_index", "data/file_index"]).iterrows():
        path = root / info["data_path"].format(
            chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
        )
        pf = pq.ParquetFile(path)
        if pf.metadata.num_rows > 16:
            assert pf.metadata.num_row_groups > 1
        table = pf.read()
        assert table.schema.field("observation.state").type == pa.list_(pa.float32(), 4)
        assert table.schema.field("timestamp").type == pa.float32()
        check_rows(ds, table.to_pandas())
        seen += table.column("index").to_pylist()
    assert seen == list(range(120))

    stats = json.loads((root / "meta" / "stats.json").read_text())
    assert stats["observation.state"]["max"] == [4.0, 40.0, 4008.0, 0.5]
    assert stats["index"]["min"] == [0] and stats["index"]["count"] == [120]
    assert 30 / 255 < stats[cam]["mean"][0][0][0] < 225 / 255


def check_rows(ds, df: pd.DataFrame) -> None:
    for row in df.itertuples(index=False):
        e, f = row.episode_index, row.frame_index
        assert np.array_equal(np.asarray(row[0], np.float32), expected_state(e, f, ds.state_dim))
        assert np.array_equal(np.asarray(row[1], np.float32), expected_action(e, f, ds.action_dim))
        assert row.timestamp == np.float32(f / ds.fps)
        assert row.index == ds.dataset_index(e, f)
        assert row.task_index == ds.episode_task_index(e)


def test_layout_rolls_files_and_chunks(tmp_path):
    ds = make_dataset(
        tmp_path / "ds",
        episode_lengths=(3,) * 10,
        episodes_per_file=3,
        files_per_chunk=2,
        num_cameras=1,
        codec="mpeg4",
    )
    data = sorted(p.relative_to(ds.root).as_posix() for p in ds.root.glob("data/*/*"))
    assert data == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
        "data/chunk-001/file-001.parquet",
    ]
    videos = sorted(p.name for p in ds.root.glob("videos/*/*/*.mp4"))
    assert len(videos) == 4
    eps = episodes_table(ds.root)
    assert eps.groupby(["data/chunk_index", "data/file_index"]).size().tolist() == [3, 3, 3, 1]
    last = ds.root / "videos" / ds.camera_keys[0] / "chunk-001" / "file-000.mp4"
    images, _, _ = decode_mp4(last)
    assert [decode_frame_identity(i)[:2] for i in images] == [
        (e, f) for e in (6, 7, 8) for f in range(3)
    ]


def test_v21_layout(tmp_path):
    ds = make_dataset(tmp_path / "ds", version="v2.1", num_cameras=2, codec="h264", gop=10)
    root = ds.root
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v2.1"
    assert info["total_chunks"] == 3 and info["chunks_size"] == 2 and info["total_videos"] == 10
    episodes = [json.loads(line) for line in (root / "meta" / "episodes.jsonl").open()]
    assert episodes == [
        {"episode_index": e, "tasks": [ds.tasks[e % 2]], "length": n}
        for e, n in enumerate(ds.episode_lengths)
    ]
    tasks = [json.loads(line) for line in (root / "meta" / "tasks.jsonl").open()]
    assert tasks == [{"task_index": 0, "task": ds.tasks[0]}, {"task_index": 1, "task": ds.tasks[1]}]
    ep_stats = [json.loads(line) for line in (root / "meta" / "episodes_stats.jsonl").open()]
    assert [s["episode_index"] for s in ep_stats] == list(range(5))
    assert ep_stats[1]["stats"]["frame_index"]["max"] == [40]
    assert json.loads((root / "meta" / "stats.json").read_text())["index"]["max"] == [119]

    for e, n in enumerate(ds.episode_lengths):
        chunk = e // info["chunks_size"]
        path = root / info["data_path"].format(episode_chunk=chunk, episode_index=e)
        df = pd.read_parquet(path)
        assert df["frame_index"].tolist() == list(range(n))
        assert (df["episode_index"] == e).all()
        check_rows(ds, df)
        for c, cam in enumerate(ds.camera_keys):
            video = root / info["video_path"].format(
                episode_chunk=chunk, video_key=cam, episode_index=e
            )
            images, times, keyframes = decode_mp4(video)
            assert [decode_frame_identity(i) for i in images] == [(e, f, c) for f in range(n)]
            assert times == pytest.approx([f / ds.fps for f in range(n)])
            assert keyframes == list(range(0, n, 10))
    assert len(list(root.rglob("*.parquet"))) == 5 and len(list(root.rglob("*.mp4"))) == 10
    assert {p.parent.parent.name for p in root.glob("videos/*/*/*.mp4")} == {
        "chunk-000",
        "chunk-001",
        "chunk-002",
    }


def test_v21_without_cameras(tmp_path):
    ds = make_dataset(tmp_path / "ds", version="v2.1", num_cameras=0, episode_lengths=(4, 5))
    info = json.loads((ds.root / "meta" / "info.json").read_text())
    assert info["video_path"] is None and info["total_videos"] == 0
    assert not (ds.root / "videos").exists()
    assert ds.camera_keys == () and ds.total_frames == 9


# --------------------------------------------------------------------------- options, errors


def test_overwrite_and_progress(tmp_path, capsys):
    root = tmp_path / "ds"
    make_dataset(root, episode_lengths=(3, 4), num_cameras=0)
    capsys.readouterr()
    ds = make_dataset(root, episode_lengths=(5,), num_cameras=1, overwrite=True, progress=True)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chunk-000/file-000" in err
    assert json.loads((root / "meta" / "info.json").read_text())["total_frames"] == 5
    assert ds.root == root and ds.episode_lengths == (5,)
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary folder left behind
    make_dataset(tmp_path / "quiet", episode_lengths=(2,))
    assert capsys.readouterr().err == ""


def test_errors(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown codec 'vp9'.*av1.*h264.*mpeg4"):
        make_dataset(tmp_path / "a", codec="vp9")
    with pytest.raises(ValueError, match=r"too small.*height>=48 and width>=64"):
        make_dataset(tmp_path / "b", height=40, width=64)
    with pytest.raises(ValueError, match=r"too small"):
        make_dataset(tmp_path / "b", height=48, width=56)
    with pytest.raises(ValueError, match=r"too small"):
        frame_image(0, 0, 0, 47, 64)
    with pytest.raises(ValueError, match="episode_lengths must be"):
        make_dataset(tmp_path / "c", episode_lengths=(3, 0))
    with pytest.raises(ValueError, match="episode_lengths must be"):
        make_dataset(tmp_path / "c", episode_lengths=())
    with pytest.raises(ValueError, match="Unknown version"):
        make_dataset(tmp_path / "c", version="v2.0")
    with pytest.raises(ValueError, match="num_cameras"):
        make_dataset(tmp_path / "c", num_cameras=5)
    with pytest.raises(ValueError, match="gop must be a positive int"):
        make_dataset(tmp_path / "c", gop=0)
    with pytest.raises(ValueError, match="tasks must be"):
        make_dataset(tmp_path / "c", tasks=())
    assert not list(tmp_path.iterdir())  # argument errors write nothing

    make_dataset(tmp_path / "d", episode_lengths=(2,), num_cameras=0)
    with pytest.raises(ValueError, match=r"already exists.*overwrite=True"):
        make_dataset(tmp_path / "d", episode_lengths=(2,), num_cameras=0)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="does not look like a dataset"):
        make_dataset(precious, overwrite=True)
    assert (precious / "notes.txt").read_text() == "keep me"


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="no POSIX scheduling calls")
def test_make_dataset_leaves_the_cpu_policy_alone(tmp_path):
    """SVT-AV1 (as root) switches its calling thread to SCHED_FIFO 99; the factory puts the
    policy back, or every DataLoader worker forked afterwards would run real-time."""
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    make_dataset(tmp_path / "ds", episode_lengths=(5, 4), num_cameras=1, codec="av1")
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
