"""Bad-input corpus: malformed datasets made by corrupting factory output.

Every case copies a small pristine factory dataset (session-scoped), corrupts one thing, and
checks that loading, random access (``LeRobotReader(root)[i]``) and streaming
(``ChunkedEpisodeDataset(root, batch_size=4)`` iterated in the main process) raise a specific
exception from :mod:`robo_resume.errors` whose message names the file, the episode and frame
where they apply, and the fix. Nothing may hang, crash or return wrong frames silently.

Pristine layout (v3.0): episodes (12, 9, 15) at 10 fps, one camera; episodes 0 and 1 share
``data/chunk-000/file-000.parquet`` and ``videos/<cam>/chunk-000/file-000.mp4``, episode 2 is in
``file-001``.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import robo_resume.items
from robo_resume import (
    ChunkedEpisodeDataset,
    CorruptFileError,
    DatasetFormatError,
    LeRobotReader,
    MetadataMismatchError,
    MissingFileError,
    UnsupportedVersionError,
    VideoDecodeError,
    load_metadata,
)
from robo_resume.format.tabular import ParquetTable
from robo_resume.format.video import VideoReader
from robo_resume.testing import decode_frame_identity

pytestmark = pytest.mark.timeout(60)

LENGTHS = (12, 9, 15)
BASE = {"episode_lengths": LENGTHS, "codec": "h264", "gop": 4}
CAM = "observation.images.cam0"
DATA0, DATA1 = "data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet"
VIDEO0 = f"videos/{CAM}/chunk-000/file-000.mp4"
VIDEO1 = f"videos/{CAM}/chunk-000/file-001.mp4"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"


def _video_check_wired() -> bool:
    """The item builder compares each opened video with info.json (check_video_stream)."""
    return "check_video_stream" in inspect.getsource(robo_resume.items.builder)


def _table_check_wired(root: Path) -> bool:
    """items.py gives ParquetTable the fps and features (timestamp and dtype checks)."""
    meta = load_metadata(root)
    table = robo_resume.items.ItemBuilder(meta).table(meta.episodes[0])
    return getattr(table, "fps", None) is not None and getattr(table, "features", None) is not None


@pytest.fixture(scope="session")
def pristine(factory) -> Path:
    return factory(**BASE).root


@pytest.fixture(scope="session")
def pristine21(factory) -> Path:
    return factory(**BASE, version="v2.1").root


@pytest.fixture(scope="session")
def donors(factory) -> dict[str, Path]:
    """Datasets whose file-000.mp4 replaces the pristine one: shorter, bigger, faster."""
    return {
        "short": factory(**{**BASE, "episode_lengths": (12, 5, 15)}).root,
        "big": factory(**BASE, height=96, width=128).root,
        "fast": factory(**BASE, fps=20).root,
    }


# --------------------------------------------------------------------------- corruptions


def read_table(path: Path) -> pa.Table:
    return pq.read_table(path)


def write_table(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path)


def set_column(path: Path, name: str, values) -> None:
    t = read_table(path)
    t = t.set_column(t.schema.get_field_index(name), name, pa.array(values))
    write_table(path, t)


def edit_info(root: Path, **changes) -> None:
    p = root / "meta" / "info.json"
    info = json.loads(p.read_text())
    info.update(changes)
    p.write_text(json.dumps(info))


def edit_episodes(root: Path, episode: int, **values) -> None:
    p = root / EPISODES
    df = pd.read_parquet(p)
    for k, v in values.items():
        df.loc[df["episode_index"] == episode, k] = v
    df.to_parquet(p)


def edit_episodes_column(root: Path, name: str, fn) -> None:
    p = root / EPISODES
    df = pd.read_parquet(p)
    df[name] = fn(df[name])
    df.to_parquet(p)


def edit_jsonl(path: Path, fn) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(r) + "\n" for r in fn(rows)))


def truncate(path: Path, fraction: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def faststart_then_truncate(path: Path, fraction: float = 0.6) -> None:
    """Move the mp4 index to the front (as many tools do), then cut the frame data short (at
    ``fraction`` of the file)."""
    import av

    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(path)) as src, av.open(str(tmp), "w", options={"movflags": "faststart"}) as o:
        stream = o.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                o.mux(packet)
    tmp.replace(path)
    truncate(path, fraction)


def audio_only_mp4(path: Path) -> None:
    """An mp4 that opens fine but holds no video stream (e.g. a mis-exported file)."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = 8000
        for _ in range(4):
            frame.pts = None
            out.mux(stream.encode(frame))
        out.mux(stream.encode())


def swap_timestamps(root: Path) -> None:
    t = read_table(root / DATA0)
    ts = t.column("timestamp").to_numpy().copy()
    ts[3], ts[4] = ts[4], ts[3]
    set_column(root / DATA0, "timestamp", ts)


def shift_timestamps(root: Path) -> None:
    """Episode 0's timestamps one frame late: monotonic, but every frame would be its neighbour."""
    t = read_table(root / DATA0)
    ts = t.column("timestamp").to_numpy().astype(np.float64)
    ep = t.column("episode_index").to_numpy()
    ts[ep == 0] += 0.1
    set_column(root / DATA0, "timestamp", ts.astype(np.float32))


def stringify(root: Path) -> None:
    t = read_table(root / DATA0)
    values = [json.dumps(v) for v in t.column("observation.state").to_pylist()]
    set_column(root / DATA0, "observation.state", values)


def float_index(root: Path) -> None:
    t = read_table(root / DATA0)
    set_column(root / DATA0, "index", t.column("index").to_numpy().astype(np.float64) + 0.5)


def drop_column(root: Path, name: str) -> None:
    t = read_table(root / DATA0)
    write_table(root / DATA0, t.drop_columns([name]))


def change_rows(root: Path, rows: int) -> None:
    t = read_table(root / DATA1)
    write_table(
        root / DATA1,
        t.slice(0, t.num_rows + rows) if rows < 0 else pa.concat_tables([t, t.slice(0, rows)]),
    )


def shift_index(root: Path) -> None:
    t = read_table(root / DATA1)
    set_column(root / DATA1, "index", t.column("index").to_numpy() + 1)


def extra_camera(root: Path) -> None:
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.images.cam9"] = dict(info["features"][CAM])
    (root / "meta" / "info.json").write_text(json.dumps(info))


def resolution_change(path: Path, at: int) -> None:
    """Re-encode an mp4 so that its frames from ``at`` on are twice as big (the stream header
    keeps the first size; h264 with in-band parameter sets, as a spliced recording has)."""
    import av

    with av.open(str(path)) as src:
        vs = src.streams.video[0]
        rate = vs.average_rate
        frames = [f.to_ndarray(format="rgb24") for f in src.decode(vs)]
    parts = []
    for k, (lo, hi, scale) in enumerate(((0, at, 1), (at, len(frames), 2))):
        part = path.with_suffix(f".part{k}.mp4")
        with av.open(str(part), "w") as out:
            s = out.add_stream("libx264", rate=rate)
            h, w = frames[0].shape[:2]
            s.width, s.height, s.pix_fmt = w * scale, h * scale, "yuv420p"
            s.options = {"x264-params": "repeat-headers=1:keyint=4:scenecut=0"}
            for i in range(lo, hi):
                img = np.kron(frames[i], np.ones((scale, scale, 1), dtype=np.uint8))
                f = av.VideoFrame.from_ndarray(img, format="rgb24")
                f.pts = i - lo
                out.mux(s.encode(f))
            out.mux(s.encode())
        parts.append((part, lo))
    with av.open(str(parts[0][0])) as first, av.open(str(path), "w") as out:
        stream = out.add_stream_from_template(first.streams.video[0])
        for part, lo in parts:
            with av.open(str(part)) as src:
                vs = src.streams.video[0]
                shift = round(lo / rate / vs.time_base)
                for packet in src.demux(vs):
                    if packet.dts is None:
                        continue
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = stream
                    out.mux(packet)
            part.unlink()


def set_rows(path: Path, name: str, fn) -> None:
    """Replace column ``name`` of a data file with ``fn(values as a Python list)``."""
    set_column(path, name, fn(read_table(path).column(name).to_pylist()))


def copy_from(donor: str, rel: str = VIDEO0) -> Callable:
    def corrupt(root: Path, donors: dict[str, Path]) -> None:
        shutil.copyfile(donors[donor] / rel, root / rel)

    return corrupt


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Case:
    """One malformed dataset.

    ``stage`` is "load" (constructors raise) or "read" (metadata loads; reading ``episode``
    raises, by random access and by streaming). ``wired`` names the check in items.py the case
    needs ("video" or "table"), if any.
    """

    id: str
    corrupt: Callable
    error: type[Exception] | tuple[type[Exception], ...]
    match: str
    stage: str
    episode: int | None = None
    version: str = "v3.0"
    wired: str | None = None
    first_batch: bool = True  # the first batch of the episode alone already hits the damage
    stream_match: str | None = None  # when the shuffled stream may hit another frame first


def _f(rel: str) -> str:
    return re.escape(rel)


def _no_donor(fn: Callable[[Path], None]) -> Callable:
    return lambda root, donors: fn(root)


CASES = [
    # ---- video files
    Case(
        "mp4_truncated",
        _no_donor(lambda r: truncate(r / VIDEO1, 1 / 3)),
        CorruptFileError,
        rf"video file cannot be opened.*{_f(VIDEO1)}, episode 2.*Fix: download this file again",
        "read",
        2,
    ),
    Case(
        "mp4_truncated_frame_data",
        _no_donor(lambda r: faststart_then_truncate(r / VIDEO1)),
        (CorruptFileError, VideoDecodeError),  # decode error, or the data ends early
        rf"cannot be decoded.*{_f(VIDEO1)}, episode 2.*Fix: download",
        "read",
        2,
        stream_match=rf"{_f(VIDEO1)}, episode 2.*Fix: .*download",
    ),
    Case(
        "mp4_zero_bytes",
        _no_donor(lambda r: (r / VIDEO1).write_bytes(b"")),
        CorruptFileError,
        rf"cannot be opened.*{_f(VIDEO1)}, episode 2.*Fix: .*truncated or empty",
        "read",
        2,
    ),
    Case(
        "mp4_shorter_than_episode",
        copy_from("short"),
        VideoDecodeError,
        rf"frame is not in the file.*Expected a frame at 1\.7000s.*ends before.*{_f(VIDEO0)}, "
        r"episode 1, frame 5\..*Fix: .*shorter than",
        "read",
        1,
        first_batch=False,
        stream_match=rf"ends before.*{_f(VIDEO0)}, episode 1, frame [5-8]\..*Fix",
    ),
    Case(
        "mp4_wrong_resolution",
        copy_from("big"),
        MetadataMismatchError,
        rf"frame size differs.*Expected 48x64.*Found 96x128.*{_f(VIDEO0)}, episode 0.*"
        r"Fix: re-encode the video at 48x64",
        "read",
        0,
        wired="video",
        stream_match=rf"frame size differs.*Found 96x128.*{_f(VIDEO0)}, episode [01].*Fix",
    ),
    Case(
        "mp4_fps_mismatch",
        copy_from("fast"),
        MetadataMismatchError,
        rf"frame rate differs.*Expected 10 fps.*Found 20 fps.*{_f(VIDEO0)}, episode 0.*"
        r"Fix: re-encode the video at the dataset's fps",
        "read",
        0,
        wired="video",
        stream_match=rf"frame rate differs.*Found 20 fps.*{_f(VIDEO0)}, episode [01].*Fix",
    ),
    Case(
        "mp4_without_video_stream",
        _no_donor(lambda r: audio_only_mp4(r / VIDEO1)),
        CorruptFileError,
        rf"no video stream.*{_f(VIDEO1)}, episode 2.*Fix",
        "read",
        2,
    ),
    Case(
        "mp4_missing",
        _no_donor(lambda r: (r / VIDEO1).unlink()),
        MissingFileError,
        rf"video file is missing.*{_f(VIDEO1)}, episode 2.*Fix: .*episodes=",
        "read",
        2,
    ),
    Case(
        "camera_without_episode_columns",
        _no_donor(extra_camera),
        DatasetFormatError,
        rf"lacks required columns.*videos/observation\.images\.cam9/chunk_index.*{_f(EPISODES)}"
        r".*Fix",
        "load",
    ),
    # ---- data files
    Case(
        "parquet_missing_column",
        _no_donor(lambda r: drop_column(r, "action")),
        CorruptFileError,
        rf"lacks columns.*missing \['action'\].*{_f(DATA0)}, episode 0.*Fix",
        "read",
        0,
        stream_match=rf"lacks columns.*missing \['action'\].*{_f(DATA0)}, episode [01].*Fix",
    ),
    Case(
        "parquet_string_column",
        _no_donor(stringify),
        CorruptFileError,
        rf"column 'observation\.state' has the wrong type.*arrow type string.*{_f(DATA0)}, "
        r"episode 0.*Fix",
        "read",
        0,
        stream_match=rf"column 'observation\.state' has the wrong type.*{_f(DATA0)}, episode [01]",
    ),
    Case(
        "parquet_float_index_column",
        _no_donor(float_index),
        CorruptFileError,
        rf"column 'index' has the wrong type.*Expected int64 values.*double.*{_f(DATA0)}, "
        r"episode 0.*Fix",
        "read",
        0,
        wired="table",
        stream_match=rf"column 'index' has the wrong type.*{_f(DATA0)}, episode [01].*Fix",
    ),
    Case(
        "parquet_fewer_rows",
        _no_donor(lambda r: change_rows(r, -3)),
        MetadataMismatchError,
        rf"number of rows.*Found 12 rows.*{_f(DATA1)}, episode 2.*Fix",
        "read",
        2,
    ),
    Case(
        "parquet_more_rows",
        _no_donor(lambda r: change_rows(r, 4)),
        MetadataMismatchError,
        rf"number of rows.*Expected 15 rows.*Found 19 rows.*{_f(DATA1)}, episode 2.*Fix",
        "read",
        2,
    ),
    Case(
        "parquet_truncated",
        _no_donor(lambda r: truncate(r / DATA0, 0.5)),
        CorruptFileError,
        rf"not a readable parquet.*{_f(DATA0)}, episode [01].*Fix: download this file again",
        "read",
        0,
    ),
    Case(
        "timestamps_not_monotonic",
        _no_donor(swap_timestamps),
        CorruptFileError,
        rf"timestamps do not increase.*Found timestamp 0\.300000 at row 4.*{_f(DATA0)}, "
        r"episode 0, frame 4.*Fix",
        "read",
        0,
    ),
    Case(
        "timestamps_inconsistent_with_fps",
        _no_donor(shift_timestamps),
        CorruptFileError,
        rf"timestamp disagrees with frame_index / fps.*Expected timestamp 0\.000000.*"
        rf"Found timestamp 0\.100000.*{_f(DATA0)}, episode 0, frame 0.*Fix",
        "read",
        0,
        wired="table",
        stream_match=rf"timestamp disagrees with frame_index.*{_f(DATA0)}, episode 0, frame \d+",
    ),
    Case(
        "index_disagrees_with_metadata",
        _no_donor(shift_index),
        MetadataMismatchError,
        rf"'index' column disagrees.*Expected index=21.*Found index=22.*{_f(DATA1)}, episode 2, "
        r"frame 0.*Fix",
        "read",
        2,
        stream_match=rf"'index' column disagrees.*{_f(DATA1)}, episode 2, frame \d+\..*Fix",
    ),
    Case(
        "mp4_resolution_changes_mid_stream",
        _no_donor(lambda r: resolution_change(r / VIDEO0, 16)),
        MetadataMismatchError,
        rf"changes its frame size mid-stream.*Expected every frame 48x64.*Found a 96x128 frame at "
        rf"1\.6000s.*{_f(VIDEO0)}, episode 1.*Fix: re-encode",
        "read",
        1,
        first_batch=False,
        stream_match=rf"frame size mid-stream.*{_f(VIDEO0)}, episode 1.*Fix",
    ),
    Case(
        "from_timestamp_one_frame_late",
        _no_donor(lambda r: edit_episodes(r, 1, **{f"videos/{CAM}/from_timestamp": 1.3})),
        MetadataMismatchError,
        rf"from_timestamp for '{re.escape(CAM)}' does not point at its first frame.*"
        rf"Expected from_timestamp 1\.200000 \(frame 12.*Found from_timestamp 1\.300000.*"
        rf"{_f(VIDEO0)}, episode 1, frame 0.*Fix",
        "read",
        1,
        wired="video",
    ),
    # The mp4 of other episodes with more frames than these (VIDEO0 copied over VIDEO1) reads
    # as lerobot reads it, with a warning: from the file alone it is an episode trimmed in its
    # parquet (tests/test_video_meta_disagree.py). With fewer frames it is refused:
    Case(
        "mp4_of_other_episodes_too_short",
        _no_donor(lambda r: shutil.copyfile(r / VIDEO1, r / VIDEO0)),
        VideoDecodeError,
        rf"frame is not in the file.*Expected a frame at 1\.5000s.*ends before.*{_f(VIDEO0)}, "
        r"episode 1, frame 3\..*Fix: .*shorter than",
        "read",
        1,
        first_batch=False,
        stream_match=rf"ends before.*{_f(VIDEO0)}, episode 1, frame [3-8]\..*Fix",
    ),
    # ---- rows that disagree with the metadata
    Case(
        "episode_index_names_another_episode",
        _no_donor(lambda r: set_rows(r / DATA1, "episode_index", lambda v: [1] * len(v))),
        MetadataMismatchError,
        rf"'episode_index' column disagrees.*Expected episode_index=2.*Found episode_index=1.*"
        rf"{_f(DATA1)}, episode 2, frame 0.*Fix",
        "read",
        2,
        stream_match=rf"'episode_index' column disagrees.*{_f(DATA1)}, episode 2, frame \d+.*Fix",
    ),
    Case(
        "feature_shape_disagrees_with_info",
        _no_donor(
            lambda r: edit_info(
                r,
                features={
                    **json.loads((r / "meta/info.json").read_text())["features"],
                    "observation.state": {"dtype": "float32", "shape": [7], "names": None},
                },
            )
        ),
        MetadataMismatchError,
        rf"column 'observation\.state' has another shape.*Expected 7 values per row.*"
        rf"Found 4 values per row.*{_f(DATA0)}, episode 0.*Fix",
        "read",
        0,
        # every data file disagrees: the stream names whichever it reads first
        stream_match=r"'observation\.state' has another shape.*data/chunk-000/file-00[0-9]"
        r"\.parquet, episode \d",
    ),
    Case(
        "null_in_feature_column",
        _no_donor(
            lambda r: set_rows(
                r / DATA1,
                "observation.state",
                lambda v: [None if i == 3 else x for i, x in enumerate(v)],
            )
        ),
        CorruptFileError,
        rf"column 'observation\.state' holds nulls.*first at row 3.*{_f(DATA1)}, episode 2.*Fix",
        "read",
        2,
    ),
    Case(
        "null_inside_a_list_value",
        _no_donor(
            lambda r: set_rows(
                r / DATA1,
                "observation.state",
                lambda v: [[None, *x[1:]] if i == 3 else x for i, x in enumerate(v)],
            )
        ),
        CorruptFileError,
        rf"column 'observation\.state' holds null values inside its lists.*first in row 3.*"
        rf"{_f(DATA1)}, episode 2.*Fix",
        "read",
        2,
    ),
    Case(
        "task_index_without_task",
        _no_donor(lambda r: set_rows(r / DATA1, "task_index", lambda v: [7] * len(v))),
        MetadataMismatchError,
        rf"'task_index' names a task.*Expected task_index in \[0, 2\).*Found task_index=7.*"
        rf"{_f(DATA1)}, episode 2, frame 0.*Fix",
        "read",
        2,
        stream_match=rf"'task_index' names a task.*{_f(DATA1)}, episode 2, frame \d+.*Fix",
    ),
    # ---- metadata
    Case(
        "meta_length_huge",
        _no_donor(lambda r: edit_episodes(r, 1, length=10**12, dataset_to_index=12 + 10**12)),
        DatasetFormatError,
        r"impossibly long.*length <= 134217728.*Found length 1000000000000.*episode 1.*Fix",
        "load",
    ),
    Case(
        "meta_length_disagrees_with_total_frames",
        _no_donor(lambda r: edit_episodes(r, 2, length=16, dataset_to_index=37)),
        MetadataMismatchError,
        r"disagree with meta/info\.json's total_frames.*Expected lengths summing to "
        r"total_frames=36.*Found lengths summing to 37.*meta.*Fix",
        "load",
    ),
    Case(
        "meta_from_index_not_contiguous",
        _no_donor(lambda r: edit_episodes(r, 2, dataset_from_index=22, dataset_to_index=37)),
        MetadataMismatchError,
        r"index ranges are not contiguous.*Expected dataset_from_index 21.*"
        r"Found dataset_from_index 22.*episode 2.*Fix",
        "load",
    ),
    Case(
        "meta_nan_from_timestamp",
        _no_donor(lambda r: edit_episodes(r, 1, **{f"videos/{CAM}/from_timestamp": np.nan})),
        DatasetFormatError,
        rf"column 'videos/{re.escape(CAM)}/from_timestamp' holds an invalid value.*finite.*"
        rf"nan in row 1.*{_f(EPISODES)}, episode 1.*Fix",
        "load",
    ),
    Case(
        "meta_nan_in_integer_column",
        _no_donor(lambda r: edit_episodes(r, 2, dataset_from_index=np.nan)),
        DatasetFormatError,
        rf"column 'dataset_from_index' holds an invalid value.*integers.*nan in row 2.*"
        rf"{_f(EPISODES)}, episode 2.*Fix",
        "load",
    ),
    Case(
        "meta_text_in_integer_column",
        _no_donor(lambda r: edit_episodes_column(r, "length", lambda c: c.astype(str))),
        DatasetFormatError,
        rf"column 'length' holds an invalid value.*integers.*'12' in row 0.*{_f(EPISODES)}, "
        r"episode 0.*Fix",
        "load",
    ),
    Case(
        "data_path_attribute_placeholder",
        _no_donor(lambda r: edit_info(r, data_path="data/{chunk_index.nope}/{file_index}.parquet")),
        DatasetFormatError,
        r"data template cannot be filled.*chunk_index\.nope.*info\.json, episode 0.*Fix",
        "load",
    ),
    Case(
        "feature_given_as_list",
        _no_donor(
            lambda r: edit_info(
                r,
                features={
                    **json.loads((r / "meta/info.json").read_text())["features"],
                    "action": ["float32", [3]],
                },
            )
        ),
        DatasetFormatError,
        r"feature 'action' is malformed.*Found a list.*info\.json.*Fix",
        "load",
    ),
    Case(
        "meta_info_missing",
        _no_donor(lambda r: (r / "meta/info.json").unlink()),
        MissingFileError,
        r"metadata file is missing.*meta/info\.json.*Fix",
        "load",
    ),
    Case(
        "meta_info_bad_json",
        _no_donor(lambda r: (r / "meta/info.json").write_text("{nope")),
        CorruptFileError,
        r"not valid JSON.*meta/info\.json.*Fix: restore",
        "load",
    ),
    Case(
        "meta_episodes_missing",
        _no_donor(lambda r: shutil.rmtree(r / "meta/episodes")),
        MissingFileError,
        r"episode metadata of a v3\.0 dataset is missing.*meta/episodes.*Fix",
        "load",
    ),
    Case(
        "meta_episodes_corrupt",
        _no_donor(lambda r: truncate(r / EPISODES, 0.5)),
        CorruptFileError,
        rf"episode metadata parquet file cannot be read.*{_f(EPISODES)}.*Fix",
        "load",
    ),
    Case(
        "meta_tasks_missing",
        _no_donor(lambda r: (r / "meta/tasks.parquet").unlink()),
        MissingFileError,
        r"metadata file is missing.*meta/tasks\.parquet.*Fix",
        "load",
    ),
    Case(
        "episode_with_zero_frames",
        _no_donor(lambda r: edit_episodes(r, 1, length=0, dataset_to_index=12)),
        DatasetFormatError,
        r"episode has no frames.*length 0.*episode 1.*Fix: remove",
        "load",
    ),
    Case(
        "episode_lengths_disagree",
        _no_donor(lambda r: edit_episodes(r, 1, dataset_to_index=25)),
        MetadataMismatchError,
        r"disagrees with itself.*length \(9\).*dataset_to_index 25.*episode 1.*Fix",
        "load",
    ),
    Case(
        "unsupported_version",
        _no_donor(lambda r: edit_info(r, codebase_version="v2.0")),
        UnsupportedVersionError,
        r"Expected v2\.1 or v3\.0.*'v2\.0'.*info\.json.*"
        r"Fix: convert .*convert_dataset_v20_to_v21",
        "load",
    ),
    Case(
        "invalid_fps",
        _no_donor(lambda r: edit_info(r, fps=0)),
        DatasetFormatError,
        r"invalid fps.*Found 0.*info\.json.*Fix",
        "load",
    ),
    Case(
        "data_path_escapes_root",
        _no_donor(lambda r: edit_info(r, data_path="../../{chunk_index}/{file_index}.parquet")),
        DatasetFormatError,
        r"data path escapes the dataset root.*\.\./\.\./0/0\.parquet.*"
        r"episode 0.*Fix: fix data_path",
        "load",
    ),
    Case(
        "video_path_absolute",
        _no_donor(lambda r: edit_info(r, video_path="/tmp/{video_key}/{chunk_index}.mp4")),
        DatasetFormatError,
        r"video path escapes the dataset root.*/tmp/.*Fix",
        "load",
    ),
    # ---- v2.1 layout
    Case(
        "v21_episodes_jsonl_missing",
        _no_donor(lambda r: (r / "meta/episodes.jsonl").unlink()),
        MissingFileError,
        r"metadata file is missing.*meta/episodes\.jsonl.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_tasks_jsonl_missing",
        _no_donor(lambda r: (r / "meta/tasks.jsonl").unlink()),
        MissingFileError,
        r"metadata file is missing.*meta/tasks\.jsonl.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_episodes_jsonl_bad_line",
        _no_donor(lambda r: (r / "meta/episodes.jsonl").write_text('{"episode_index": 0}\n{bad\n')),
        CorruptFileError,
        r"Line 2 of a JSON-lines.*episodes\.jsonl.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_episode_with_zero_frames",
        _no_donor(
            lambda r: edit_jsonl(
                r / "meta/episodes.jsonl",
                lambda rows: [{**x, "length": 0} if x["episode_index"] == 2 else x for x in rows],
            )
        ),
        DatasetFormatError,
        r"episode has no frames.*episode 2.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_duplicate_episode",
        _no_donor(lambda r: edit_jsonl(r / "meta/episodes.jsonl", lambda rows: [*rows, rows[1]])),
        DatasetFormatError,
        r"appears twice.*episode_index 1 twice.*episode 1.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_without_video_path",
        _no_donor(lambda r: edit_info(r, video_path=None)),
        DatasetFormatError,
        r"declares video features but no video_path.*observation\.images\.cam0.*info\.json.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_text_length",
        _no_donor(
            lambda r: edit_jsonl(
                r / "meta/episodes.jsonl",
                lambda rows: [{**x, "length": "9"} if x["episode_index"] == 1 else x for x in rows],
            )
        ),
        DatasetFormatError,
        r"column 'length' holds an invalid value.*'9' in row 1.*episodes\.jsonl, episode 1.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_length_huge",
        _no_donor(
            lambda r: edit_jsonl(
                r / "meta/episodes.jsonl",
                lambda rows: [
                    {**x, "length": 10**12} if x["episode_index"] == 1 else x for x in rows
                ],
            )
        ),
        DatasetFormatError,
        r"impossibly long.*Found length 1000000000000.*episode 1.*Fix",
        "load",
        version="v2.1",
    ),
    Case(
        "v21_mp4_missing",
        _no_donor(lambda r: (r / f"videos/chunk-000/{CAM}/episode_000001.mp4").unlink()),
        MissingFileError,
        r"video file is missing.*episode_000001\.mp4, episode 1.*Fix",
        "read",
        1,
        version="v2.1",
    ),
]


@pytest.fixture
def broken(request, tmp_path, pristine, pristine21, donors):
    """Copy the pristine dataset of the case's version and corrupt it."""
    case: Case = request.param
    root = tmp_path / "bad"
    shutil.copytree(pristine if case.version == "v3.0" else pristine21, root)
    case.corrupt(root, donors)
    return case, root


def _read_episode(root: Path, episode: int) -> None:
    """``LeRobotReader(root)[i]`` for every frame of ``episode`` (global positions)."""
    reader = LeRobotReader(root)
    start = sum(LENGTHS[:episode])
    for i in range(start, start + LENGTHS[episode]):
        reader[i]


def _stream(root: Path, episodes: list[int] | None = None, *, first_batch: bool = False) -> None:
    ds = ChunkedEpisodeDataset(root, batch_size=4, episodes=episodes, chunk_frames=8)
    loader = ds.dataloader(num_workers=0)
    if first_batch:
        next(iter(loader))
        return
    for _ in loader:
        pass


@pytest.mark.parametrize("broken", CASES, ids=[c.id for c in CASES], indirect=True)
def test_corpus(broken, request):
    case, root = broken
    if case.wired == "video":
        assert _video_check_wired(), "items.py must compare each video with info.json"
    if case.wired == "table":
        assert _table_check_wired(root), "items.py must give ParquetTable the fps and features"
    if case.stage == "load":
        for make in (
            load_metadata,
            LeRobotReader,
            lambda r: ChunkedEpisodeDataset(r, batch_size=4),
        ):
            with pytest.raises(case.error, match=case.match):
                make(root)
        return
    load_metadata(root)  # the metadata is fine; the damage shows when the episode is read
    with pytest.raises(case.error, match=case.match):
        _read_episode(root, case.episode)
    stream_match = case.stream_match or case.match
    with pytest.raises(case.error, match=stream_match):
        _stream(root)
    with pytest.raises(case.error, match=stream_match):
        _stream(root, [case.episode], first_batch=case.first_batch)


# --------------------------------------------------------------------------- the checks items.py
# is asked to call, exercised directly and through the pipeline with that call simulated


def _simulate_wiring(monkeypatch, root: Path) -> None:
    """What the requested items.py change does: check each opened video once, and give parquet
    tables the fps and features."""
    meta = load_metadata(root)
    cams = {str(meta.root / r.path): c for e in meta.episodes for c, r in e.videos.items()}

    class CheckedVideo(VideoReader):
        def _open(self):
            fresh = self._container is None
            container = super()._open()
            if fresh:
                meta.check_video_stream(
                    cams[str(self.path)], self.info(), file=self.path, episode=self.episode
                )
            return container

    def table(path, **kw):
        return ParquetTable(path, fps=meta.fps, tolerance_s=1e-4, features=meta.features)

    monkeypatch.setattr(robo_resume.items.builder, "VideoReader", CheckedVideo)
    monkeypatch.setattr(robo_resume.items.builder, "ParquetTable", table)


WIRED = [c for c in CASES if c.wired]


@pytest.mark.parametrize("broken", WIRED, ids=[c.id for c in WIRED], indirect=True)
def test_wired_checks_through_the_pipeline(broken, monkeypatch):
    case, root = broken
    _simulate_wiring(monkeypatch, root)
    with pytest.raises(case.error, match=case.match):
        _read_episode(root, case.episode)
    with pytest.raises(case.error, match=case.stream_match or case.match):
        _stream(root, [case.episode], first_batch=True)


def test_wired_checks_accept_good_data(pristine, pristine21, monkeypatch):
    for root in (pristine, pristine21):
        _simulate_wiring(monkeypatch, root)
        reader = LeRobotReader(root)
        for i in range(len(reader)):
            item = reader[i]
            e, f, _ = decode_frame_identity(item[CAM])
            assert (e, f) == (int(item["episode_index"]), int(item["frame_index"]))
        _stream(root)


def test_video_check_on_real_data(open50):
    meta = load_metadata(open50)
    for e in (0, 3, 49):
        ref = meta.episode(e).videos["image"]
        with VideoReader(open50 / ref.path) as v:
            meta.check_video_stream("image", v.info(), file=v.path, episode=e)


def test_table_checks_on_real_data(open50):
    meta = load_metadata(open50)
    ep = meta.episode(0)
    table = ParquetTable(open50 / ep.data_path, fps=meta.fps, features=meta.features)
    rows = table.read(0, ep.length, meta.data_columns(), episode=0)
    assert len(rows["timestamp"]) == ep.length


@pytest.mark.parametrize(
    ("dtype", "extra"),
    [("image", {"shape": [48, 64, 3], "names": ["height", "width", "channels"]}), ("string", {})],
)
def test_image_or_string_feature_over_a_numeric_column_is_refused(pristine, tmp_path, dtype, extra):
    """info.json declares an image (or string) feature whose parquet column holds numbers: the
    read is refused naming the column and the file, instead of returning a tensor where lerobot
    would decode an image (or return a string). See test_image_string_features.py for the
    features themselves."""
    root = tmp_path / "bad"
    shutil.copytree(pristine, root)
    info = json.loads((root / "meta/info.json").read_text())
    state = info["features"]["observation.state"]
    state.update(dtype=dtype, **extra)
    (root / "meta/info.json").write_text(json.dumps(info))
    load_metadata(root)  # the metadata alone is fine
    with pytest.raises(
        CorruptFileError,
        match=rf"column 'observation\.state' has the wrong type\. Expected {dtype} values "
        rf"\(meta/info\.json\)\. Found arrow type fixed_size_list.*{_f(DATA0)}, episode 0\.",
    ):
        LeRobotReader(root)[0]
