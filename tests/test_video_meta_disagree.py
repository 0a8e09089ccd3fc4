"""Videos that disagree with meta/: read as lerobot 0.6.1 reads them, or refused.

lerobot reads a frame at ``from_timestamp + timestamp`` of its episode's mp4, so frames that no
episode's rows reach (an episode trimmed in its parquet while its video was kept whole, a
recording that ran past its last row) change nothing it returns. robo_resume returns the same
items and warns once per file. Where lerobot would return other frames without a word (an
episode's ``from_timestamp`` that does not follow the episodes before it, a file copied from
other episodes that is too short), robo_resume refuses, naming what it expected and found, the
file, the episode, the frame and the fix.

Every dataset is written by lerobot 0.6.1's own writer (``conftest.write_with_lerobot``) and
then edited. lerobot 0.6.1 reads v3.0 only, so a v2.1 dataset here is the v3.0 one of one
file per episode moved into the v2.1 layout (same parquet and mp4 files, ``episodes.jsonl``),
and it is compared with lerobot reading that v3.0 twin with the same edit.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_with_lerobot

from robo_resume import ChunkedEpisodeDataset, LeRobotReader, RoboResumeError, VideoDecodeError
from robo_resume.items import unbind

pytestmark = pytest.mark.timeout(300)

LENGTHS = (12, 20, 9)  # the per-episode-file source (v2.1 and its v3.0 twin)
TOP = "observation.images.top"
DELTA = {"observation.state": [-1 / 15, 0.0], "action": [0.0, 1 / 15], TOP: [-1 / 15, 0.0]}


# --------------------------------------------------------------------------- edits


def _episode_files(root: Path) -> list[Path]:
    return sorted(root.glob("meta/episodes/chunk-*/file-*.parquet"))


def _set(table: pa.Table, name: str, values) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(values, type=table.schema.field(i).type))


def trim(root: Path, keep: dict[int, int]) -> None:
    """Cut episode ``e`` to its first ``keep[e]`` rows in the data parquet and meta/ (length,
    dataset_from_index/to_index, ``index`` renumbered, total_frames), leaving its video and
    its from/to_timestamp as they are: the mp4 holds frames the parquet no longer has."""
    tables = {p: pq.read_table(p) for p in _episode_files(root)}
    rows = sorted(
        (e, n)
        for t in tables.values()
        for e, n in zip(t["episode_index"].to_pylist(), t["length"].to_pylist(), strict=True)
    )
    new = {e: keep.get(e, n) for e, n in rows}
    start, from_index = 0, {}
    for e, _ in rows:
        from_index[e] = start
        start += new[e]
    for path, t in tables.items():
        eps = t["episode_index"].to_pylist()
        t = _set(t, "length", [new[e] for e in eps])
        t = _set(t, "dataset_from_index", [from_index[e] for e in eps])
        t = _set(t, "dataset_to_index", [from_index[e] + new[e] for e in eps])
        pq.write_table(t, path)
    for path in sorted(root.glob("data/**/*.parquet")):
        t = pq.read_table(path)
        ep, frame = t["episode_index"].to_numpy(), t["frame_index"].to_numpy()
        kept = frame < np.array([new[int(e)] for e in ep], dtype=np.int64)
        t = t.filter(pa.array(kept))
        ep, frame = ep[kept], frame[kept]
        index = np.array([from_index[int(e)] for e in ep], dtype=np.int64) + frame
        pq.write_table(_set(t, "index", index), path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["total_frames"] = start
    info_path.write_text(json.dumps(info, indent=4))


def _frames_of(path: Path) -> tuple[list[np.ndarray], Fraction]:
    import av

    with av.open(str(path)) as src:
        stream = src.streams.video[0]
        return [f.to_ndarray(format="rgb24") for f in src.decode(stream)], stream.average_rate


def add_trailing_frames(path: Path, n: int) -> int:
    """Re-encode the mp4 at ``path`` (h264, frame ``i`` at ``i / fps``) with ``n`` other frames
    after its own; returns how many frames it had."""
    import av

    frames, rate = _frames_of(path)
    rng = np.random.default_rng(7)
    extra = [rng.integers(0, 255, size=frames[0].shape, dtype=np.uint8) for _ in range(n)]
    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(tmp), "w") as out:
        stream = out.add_stream("libx264", rate=rate, options={"crf": "18", "g": "4"})
        stream.pix_fmt = "yuv420p"
        stream.height, stream.width = frames[0].shape[:2]
        for i, img in enumerate(frames + extra):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, int(rate))
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    tmp.replace(path)
    return len(frames)


def to_v21(src: Path, dst: Path) -> Path:
    """The v3.0 dataset ``src`` of one data file and one mp4 per camera and episode, moved into
    the v2.1 layout at ``dst`` (the same parquet and mp4 files; ``episodes.jsonl``,
    ``tasks.jsonl``, v2.1 info.json)."""
    shutil.copytree(src / "meta", dst / "meta")
    info = json.loads((src / "meta" / "info.json").read_text())
    cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    eps = pa.concat_tables([pq.read_table(p) for p in _episode_files(src)]).to_pylist()
    lines = []
    for row in sorted(eps, key=lambda r: r["episode_index"]):
        e = row["episode_index"]
        data = info["data_path"].format(
            chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
        )
        out = dst / f"data/chunk-000/episode_{e:06d}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / data, out)
        for cam in cams:
            assert row[f"videos/{cam}/from_timestamp"] == 0.0, "one mp4 per episode"
            video = info["video_path"].format(
                video_key=cam,
                chunk_index=row[f"videos/{cam}/chunk_index"],
                file_index=row[f"videos/{cam}/file_index"],
            )
            out = dst / f"videos/chunk-000/{cam}/episode_{e:06d}.mp4"
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / video, out)
        lines.append({"episode_index": e, "tasks": row["tasks"], "length": row["length"]})
    meta = dst / "meta"
    shutil.rmtree(meta / "episodes")
    tasks = pq.read_table(meta / "tasks.parquet").to_pylist()
    (meta / "tasks.parquet").unlink()
    text = "".join(json.dumps(x) + "\n" for x in lines)
    (meta / "episodes.jsonl").write_text(text)
    task_lines = [  # the task string: a column, or the pandas index lerobot writes it as
        {"task_index": t["task_index"], "task": t.get("task", t.get("__index_level_0__"))}
        for t in sorted(tasks, key=lambda t: t["task_index"])
    ]
    (meta / "tasks.jsonl").write_text("".join(json.dumps(x) + "\n" for x in task_lines))
    info.update(
        codebase_version="v2.1",
        total_chunks=1,
        chunks_size=1000,
        total_videos=len(eps) * len(cams),
        data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        video_path="videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
    )
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    return dst


# --------------------------------------------------------------------------- comparison


def lerobot_dataset(root: Path, **kw):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/oracle", root=root, video_backend="pyav", return_uint8=True, **kw)


def assert_same(ours: dict, theirs: dict, where: str) -> None:
    assert list(ours) == list(theirs), f"{where}: keys {list(ours)} != {list(theirs)}"
    for k, b in theirs.items():
        a = ours[k]
        if isinstance(b, str):
            assert a == b, f"{where}: {k} {a!r} != {b!r}"
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {k}"
        d = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        assert d == 0, f"{where}: {k} differs by {d}"


def compare_with_lerobot(ours_root: Path, theirs_root: Path, *, num_workers: int) -> int:
    """Every item streamed by ChunkedEpisodeDataset (one epoch, with windows) equals lerobot's
    item of the same index; so does LeRobotReader's. Returns the number of items lerobot has
    (with workers, after checking that the stream gave at least half of them, once each)."""
    theirs = lerobot_dataset(theirs_root, delta_timestamps=DELTA)
    ds = ChunkedEpisodeDataset(
        ours_root, batch_size=4, chunk_frames=6, delta_timestamps=DELTA, image_dtype="uint8"
    )
    seen = []
    tracker = ds.tracker()
    for batch in ds.dataloader(num_workers=num_workers):
        for row in unbind(tracker.consume(batch)):
            i = int(row["index"])
            assert_same(row, theirs[i], f"{ours_root.name} streamed index={i}")
            seen.append(i)
    assert len(set(seen)) == len(seen), "a frame twice in one epoch"
    if num_workers == 0:
        assert sorted(seen) == list(range(len(theirs)))
    else:  # every stream gets as many frames: the tail that does not fill a share is dropped
        assert set(seen) <= set(range(len(theirs))) and len(seen) > len(theirs) // 2
    reader = LeRobotReader(ours_root, delta_timestamps=DELTA, image_dtype="uint8")
    assert len(reader) == len(theirs)
    for i in (0, len(reader) // 2, len(reader) - 1):
        assert_same(reader[i], theirs[i], f"{ours_root.name} reader[{i}]")
    return len(theirs)


def odd_video_warnings(caplog, root: Path) -> dict[str, list[str]]:
    """The warnings about frames no episode reads, by video file (relative to ``root``)."""
    out: dict[str, list[str]] = {}
    for r in caplog.records:
        m = re.match(r"video (\S+) \(", r.getMessage())
        if r.levelno == logging.WARNING and m and "Harmless" in r.getMessage():
            rel = Path(m.group(1)).relative_to(root).as_posix()
            out.setdefault(rel, []).append(r.getMessage())
    return out


# --------------------------------------------------------------------------- sources


@pytest.fixture(scope="module")
def per_episode(tmp_path_factory) -> Path:
    """lerobot-written v3.0, one data file and one mp4 per camera and episode (as v2.1)."""
    return write_with_lerobot(
        tmp_path_factory.mktemp("per_episode") / "ds",
        LENGTHS,
        cameras=("top",),
        video_files_size_in_mb=1e-6,
        data_files_size_in_mb=1e-6,
    )


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- (a) trimmed


@pytest.mark.parametrize("num_workers", [0, 2])
def test_trimmed_v30_episodes_read_as_lerobot_reads_them(lerobot_written, tmp_path, num_workers):
    """Episodes 0 and 1 of a shared mp4 cut in their parquets: the next episode's
    from_timestamp is after the whole video segment of the one before it (to_timestamp)."""
    root = _copy(lerobot_written, tmp_path / "trimmed30")
    trim(root, {0: 5, 1: 20, 3: 11})
    assert compare_with_lerobot(root, root, num_workers=num_workers) == 5 + 20 + 7 + 11


def test_trimmed_v30_warns_once_per_file(lerobot_written, tmp_path, caplog):
    root = _copy(lerobot_written, tmp_path / "trimmed30")
    trim(root, {0: 5, 1: 20, 3: 11})
    caplog.set_level(logging.WARNING, logger="robo_resume")
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=6)
    loader = ds.dataloader(num_workers=0)
    for _ in range(2):  # two epochs
        assert sum(len(b["index"]) for b in loader) == 43
    LeRobotReader(root)[0]  # another reader in the process: no second warning either
    warned = odd_video_warnings(caplog, root)
    cams = [TOP, "observation.images.wrist"]
    assert sorted(warned) == [f"videos/{cam}/chunk-000/file-000.mp4" for cam in cams], warned
    for cam, (m,) in zip(cams, warned.values(), strict=True):  # once per file
        assert f"('{cam}', opened for episode " in m
        assert "episode 0's video segment holds 7 frames after its 5 rows" in m
        assert "episode 1's video segment holds 5 frames after its 20 rows" in m
        assert "episode 3's video segment holds 7 frames after its 11 rows" in m
        assert "Harmless: frames are read at from_timestamp + timestamp, as lerobot" in m


@pytest.mark.parametrize("num_workers", [0, 2])
def test_trimmed_v21_episodes_read_as_lerobot_reads_them(
    per_episode, tmp_path, caplog, num_workers
):
    """The v2.1 case of the issue: parquets cut to their first frames, every mp4 kept whole."""
    keep = {0: 7, 1: 15, 2: 4}
    twin = _copy(per_episode, tmp_path / "twin30")
    trim(twin, keep)
    v21 = to_v21(twin, tmp_path / "trimmed21")
    caplog.set_level(logging.WARNING, logger="robo_resume")
    assert compare_with_lerobot(v21, twin, num_workers=num_workers) == sum(keep.values())
    if num_workers == 0:
        warned = odd_video_warnings(caplog, v21)
        files = [f"videos/chunk-000/{TOP}/episode_{e:06d}.mp4" for e in range(3)]
        assert sorted(warned) == files, warned
        for e, n in keep.items():
            (message,) = warned[files[e]]
            assert f"episode {e}" in message
            assert f"{LENGTHS[e] - n} trailing frames after the last episode (episode {e})" in (
                message
            )


# --------------------------------------------------------------------------- (b) extra frames


@pytest.mark.parametrize("num_workers", [0, 2])
def test_extra_trailing_frames_read_as_lerobot_reads_them(
    lerobot_written, tmp_path, caplog, num_workers
):
    """A v3.0 mp4 that recorded 3 frames past its last episode's rows."""
    root = _copy(lerobot_written, tmp_path / "extra30")
    video = root / f"videos/{TOP}/chunk-000/file-000.mp4"
    assert add_trailing_frames(video, 3) == sum((12, 25, 7, 18))
    caplog.set_level(logging.WARNING, logger="robo_resume")
    assert compare_with_lerobot(root, root, num_workers=num_workers) == 62
    if num_workers == 0:
        (message,) = odd_video_warnings(caplog, root)[f"videos/{TOP}/chunk-000/file-000.mp4"]
        assert str(video) in message and f"'{TOP}'" in message
        assert (
            "3 trailing frames after the last episode (episode 3) of meta/ (65 frames in the "
            "container, 62 in its episodes)" in message
        )
        assert f"('{TOP}', opened for episode " in message and "Harmless" in message


def test_extra_trailing_frames_v21(per_episode, tmp_path, caplog):
    twin = _copy(per_episode, tmp_path / "twin30")
    add_trailing_frames(twin / f"videos/{TOP}/chunk-000/file-001.mp4", 2)  # episode 1's
    v21 = to_v21(twin, tmp_path / "extra21")
    caplog.set_level(logging.WARNING, logger="robo_resume")
    assert compare_with_lerobot(v21, twin, num_workers=0) == sum(LENGTHS)
    (message,) = odd_video_warnings(caplog, v21)[f"videos/chunk-000/{TOP}/episode_000001.mp4"]
    assert "2 trailing frames after the last episode (episode 1) of meta/" in message


# --------------------------------------------------------------------------- (c) swapped


def test_swapped_from_timestamps_are_refused(lerobot_written, tmp_path):
    """Episodes 1 and 2 of a shared mp4 with each other's from_timestamp: lerobot reads each
    from the other's place (other frames, no error); refused before any frame is read."""
    root = _copy(lerobot_written, tmp_path / "swapped")
    (path,) = _episode_files(root)
    t = pq.read_table(path)
    for cam in (TOP, "observation.images.wrist"):
        col = f"videos/{cam}/from_timestamp"
        v = t[col].to_pylist()
        v[1], v[2] = v[2], v[1]
        t = _set(t, col, v)
    pq.write_table(t, path)
    with pytest.raises(
        RoboResumeError,
        match=r"from_timestamp for 'observation\.images\.(top|wrist)' does not point at its "
        r"first frame.*Expected from_timestamp 1\.266667 \(frame 19 of the file: where the rows "
        r"of the episodes before it in this mp4 end\) or 2\.933333 \(where the previous "
        r"episode's to_timestamp ends\)\. Found from_timestamp 2\.466667 \(frame 37\.00\)\. "
        r"At file "
        r".*file-000\.mp4, episode 1, frame 0\. Fix: every frame of the episode would be read "
        r"from another time; set videos/observation\.images\.(top|wrist)/from_timestamp",
    ):
        LeRobotReader(root)[12]
    # lerobot reads it without a word, episode 1 from episode 2's place: other frames
    theirs, pristine = lerobot_dataset(root), lerobot_dataset(lerobot_written)
    assert not (theirs[12][TOP] == pristine[12][TOP]).all()
    assert (theirs[0][TOP] == pristine[0][TOP]).all()
    ds = ChunkedEpisodeDataset(root, batch_size=4)
    with pytest.raises(RoboResumeError, match="does not point at its first frame"):
        next(iter(ds.dataloader(num_workers=0)))


def test_swapped_mp4_files_are_refused(per_episode, tmp_path, caplog):
    """The mp4s of episodes 0 (12 frames) and 1 (20 frames) swapped, v2.1: episode 1's file is
    short of its frames (refused, naming the first missing frame); episode 0's has 8 frames
    after its rows (warned: from the file alone this looks like a trimmed episode)."""
    v21 = to_v21(per_episode, tmp_path / "swapped21")
    a = v21 / f"videos/chunk-000/{TOP}/episode_000000.mp4"
    b = v21 / f"videos/chunk-000/{TOP}/episode_000001.mp4"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    caplog.set_level(logging.WARNING, logger="robo_resume")
    reader = LeRobotReader(v21)
    b_rel = re.escape(b.relative_to(v21).as_posix())
    with pytest.raises(
        VideoDecodeError,
        match=r"A requested video frame is not in the file\. Expected a frame at 1\.0000s\. "
        r"Found the video ends before 1\.0000s \(decoded up to 0\.7333s\)\. At file "
        rf".*{b_rel}, episode 1, frame 15\. Fix: the video is shorter than or out of sync",
    ):
        reader[LENGTHS[0] + 15]
    ds = ChunkedEpisodeDataset(v21, batch_size=4)
    with pytest.raises(
        VideoDecodeError, match=rf"ends before 0\.8000s.*{b_rel}, episode 1, frame 12\. Fix"
    ):
        for _ in ds.dataloader(num_workers=0):
            pass
    warned = odd_video_warnings(caplog, v21)[a.relative_to(v21).as_posix()]
    assert "8 trailing frames after the last episode (episode 0)" in warned[0]
