"""Format layer and item builder on factory datasets whose every pixel and row is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robo_resume import LeRobotReader, load_metadata
from robo_resume.format import ParquetTable, VideoReader
from robo_resume.items import ItemBuilder
from robo_resume.testing import (
    decode_frame_identity,
    expected_action,
    expected_state,
    frame_image,
    make_dataset,
)

CODECS = [("av1", 2), ("h264", 250), ("mpeg4", 12)]


def check_item(ds, item, episode, frame):
    assert int(item["episode_index"]) == episode and int(item["frame_index"]) == frame
    assert int(item["index"]) == ds.dataset_index(episode, frame)
    assert torch.equal(
        item["observation.state"], torch.from_numpy(expected_state(episode, frame, ds.state_dim))
    )
    assert torch.equal(
        item["action"], torch.from_numpy(expected_action(episode, frame, ds.action_dim))
    )
    assert item["task"] == ds.tasks[ds.episode_task_index(episode)]
    for c, cam in enumerate(ds.camera_keys):
        assert decode_frame_identity(item[cam]) == (episode, frame, c), (cam, episode, frame)


@pytest.mark.parametrize(("codec", "gop"), CODECS, ids=[c for c, _ in CODECS])
@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_every_frame_is_the_requested_one(factory, codec, gop, version):
    ds = factory(codec=codec, gop=gop, num_cameras=2, version=version)
    reader = LeRobotReader(ds.root)
    assert len(reader) == ds.total_frames
    for i in range(len(reader)):
        e, f = reader.locate(i)
        check_item(ds, reader[i], e, f)


@pytest.mark.parametrize(("codec", "gop"), CODECS, ids=[c for c, _ in CODECS])
def test_random_order_and_non_keyframe_starts(factory, codec, gop):
    ds = factory(codec=codec, gop=gop, num_cameras=1)
    reader = LeRobotReader(ds.root)
    order = np.random.default_rng(0).permutation(len(reader))[:60]
    for i in order.tolist():
        e, f = reader.locate(i)
        check_item(ds, reader[i], e, f)
    builder = ItemBuilder(reader.meta)
    for e, n in enumerate(ds.episode_lengths):
        for start in {1, n // 2, n - 1} - {0}:
            if start >= n:
                continue
            items = builder.build_range(e, start, n)
            for k, item in enumerate(items):
                check_item(ds, item, e, start + k)


def test_episode_edges_in_a_shared_mp4(factory):
    ds = factory(codec="h264", gop=250, num_cameras=1, episodes_per_file=3)
    meta = load_metadata(ds.root)
    cam = ds.camera_keys[0]
    e0, e1 = meta.episode(0), meta.episode(1)
    assert e0.videos[cam].path == e1.videos[cam].path  # two episodes in one mp4
    assert e1.videos[cam].from_timestamp == pytest.approx(ds.episode_lengths[0] / ds.fps)
    assert e1.data_path == e0.data_path and e1.data_row_start == ds.episode_lengths[0]
    builder = ItemBuilder(meta)
    last = builder.build_range(0, ds.episode_lengths[0] - 1, ds.episode_lengths[0])[0]
    first = builder.build_range(1, 0, 1)[0]
    check_item(ds, last, 0, ds.episode_lengths[0] - 1)
    check_item(ds, first, 1, 0)


def test_one_seek_per_camera_for_a_contiguous_range(factory):
    ds = factory(codec="h264", gop=250, num_cameras=2)
    builder = ItemBuilder(load_metadata(ds.root))
    with builder.episode_reader(1, 5, 40) as r:
        items = []
        for a in range(5, 40, 8):
            items += r.items(range(a, min(a + 8, 40)))
        assert [v.seeks for v in r.videos.values()] == [1, 1]
    for k, item in enumerate(items):
        check_item(ds, item, 1, 5 + k)


@pytest.mark.parametrize(
    "frames",
    [range(4, 9), range(36, 41), [5, 7, 6], [5, 5], range(9, 4, -1), np.array([6, 8, 40])],
    ids=["before-start", "past-stop", "decreasing", "repeated", "negative-step", "array-past"],
)
def test_a_range_reader_refuses_frames_outside_or_out_of_order(factory, frames):
    ds = factory(num_cameras=1)
    builder = ItemBuilder(load_metadata(ds.root))
    with builder.episode_reader(1, 5, 40) as r:
        with pytest.raises(IndexError, match=r"increasing and inside the reader's range"):
            r.raw(frames)
        check_item(ds, r.items(range(5, 40, 7))[1], 1, 12)  # a stepped range is read


def test_frames_at_refuses_decreasing_timestamps(factory):
    ds = factory(num_cameras=1)
    path = next(ds.root.glob("videos/**/*.mp4"))
    with VideoReader(path) as v:
        with pytest.raises(ValueError, match="non-decreasing timestamps"):
            v.frames_at([0.1, 0.2, 0.15])
        assert v.frames_at([0.1, 0.1, 0.2]).shape[0] == 3  # repeats are fine


def test_idle_decoders_keep_every_file_before_a_second_of_one(factory):
    # Beyond IDLE_DECODERS idle decoders, a file's extra one closes before another file's only
    # one: the next chunk of that other file starts without opening its mp4 again.
    from robo_resume.items import IDLE_DECODERS

    ds = factory(num_cameras=2)
    builder = ItemBuilder(load_metadata(ds.root))
    a, b = sorted(ds.root.glob("videos/**/*.mp4"))[:2]
    only_b = builder.video(b, episode=0, cache_frames=0)
    builder.release(only_b)  # the oldest idle decoder
    several_a = [builder.video(a, episode=0, cache_frames=0) for _ in range(IDLE_DECODERS)]
    for r in several_a:
        builder.release(r)  # one more than the limit: one closes
    assert len(builder._idle) == IDLE_DECODERS
    assert builder.video(b, episode=1, cache_frames=0) is only_b  # kept, reused
    assert several_a[0] not in builder._idle.values()  # a's oldest went instead
    assert all(r in builder._idle.values() for r in several_a[1:])
    builder.close()


@pytest.mark.parametrize(("n", "w"), [(1, 1), (1, 3), (8, 1), (8, 2), (5, 4), (3, 7)])
def test_window_run_places_frames_as_the_search_does(n, w):
    # windows of w consecutive offsets over n consecutive frames, as decode_windows_into
    # searches them
    from robo_resume.items.windows import window_run

    q = 100 + np.arange(n)[:, None] + np.arange(-w + 1, 1)  # e.g. [-1, 0] for w = 2
    uniq = np.unique(q)
    which = np.searchsorted(uniq, q).ravel()
    _, first = np.unique(which, return_index=True)
    others = np.setdiff1d(np.arange(n * w), first)
    got_first, copies, sources = window_run(n, w)
    np.testing.assert_array_equal(got_first, first)
    np.testing.assert_array_equal(copies, others)
    np.testing.assert_array_equal(sources, which[others])
    assert len(uniq) == n + w - 1


def test_delta_windows_clamp_and_pad(factory):
    ds = factory(num_cameras=1)
    cam = ds.camera_keys[0]
    reader = LeRobotReader(
        ds.root, delta_timestamps={"action": [-0.2, -0.1, 0.0, 0.1], cam: [-0.1, 0.0]}
    )
    item = reader[0]  # episode 0, frame 0
    assert item["action_is_pad"].tolist() == [True, True, False, False]
    assert torch.equal(item["action"][0], torch.from_numpy(expected_action(0, 0, 3)))
    assert torch.equal(item["action"][3], torch.from_numpy(expected_action(0, 1, 3)))
    assert item[cam].shape == (2, 3, 48, 64)
    assert decode_frame_identity(item[cam][0]) == (0, 0, 0)  # edge frame repeated
    last = reader[ds.episode_lengths[0] - 1]
    assert last["action_is_pad"].tolist() == [False, False, False, True]


def test_uint8_images_and_transforms(factory):
    ds = factory(num_cameras=1)
    cam = ds.camera_keys[0]
    r8 = LeRobotReader(ds.root, image_dtype="uint8")
    rf = LeRobotReader(ds.root, image_transforms=lambda x: x.flip(-1))
    a, b = r8[3][cam], rf[3][cam]
    assert a.dtype == torch.uint8 and b.dtype == torch.float32
    assert torch.equal((a.float() / 255).flip(-1), b)


def test_episode_selection_keeps_absolute_index(factory):
    ds = factory()
    reader = LeRobotReader(ds.root, episodes=[3, 1])
    assert reader.episodes == (1, 3)
    assert len(reader) == ds.episode_lengths[1] + ds.episode_lengths[3]
    assert int(reader[0]["index"]) == ds.dataset_index(1, 0)
    with pytest.raises(ValueError, match=r"episodes= names episodes the dataset does not have"):
        LeRobotReader(ds.root, episodes=[99])


def test_parquet_row_ranges_across_row_groups(factory):
    ds = factory()
    meta = load_metadata(ds.root)
    ep = meta.episode(1)
    table = ParquetTable(ds.root / ep.data_path)
    rows = table.read(ep.data_row_start + 10, ep.data_row_start + 37, ["index", "action"])
    assert rows["index"].tolist() == list(range(ds.dataset_index(1, 10), ds.dataset_index(1, 37)))
    assert rows["action"].shape == (27, 3)


HAMMER = """
import pickle, random, sys, threading
from robo_resume.format import ParquetTable
table = pickle.loads(pickle.dumps(ParquetTable(sys.argv[1])))  # as a DataLoader worker gets it
cols = ["index", "frame_index", "timestamp"]
table.check_rows(1, episode=0)
n = table.num_rows
want = ParquetTable(sys.argv[1]).read(0, n, cols)
bad = []
def run(seed):
    r = random.Random(seed)
    for _ in range(300):
        a = r.randrange(n - 1)
        b = min(n, a + r.randrange(1, 200))
        try:
            got = table.read(a, b, cols)
            bad.extend((a, b, c) for c in cols if not (got[c] == want[c][a:b]).all())
        except Exception as exc:
            bad.append((a, b, repr(exc)[:200]))
threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(bad), bad[:3])
"""


def test_one_parquet_table_read_from_eight_threads_at_once_gives_the_right_rows(open50):
    """A stream's decoding threads share the item builder's tables. pyarrow's ParquetFile
    read from two threads at once returned garbage ("ReadRangeCache did not find matching
    cache entry", a realloc of 140 TB), which the reader reported as a corrupt file to download
    again, or crashed the process (a segfault in CI): the table's reads take turns. Run in a
    subprocess, so that a crash is this test's failure, not its pytest worker's."""
    import subprocess
    import sys

    path = open50 / "data" / "chunk-000" / "file-000.parquet"
    proc = subprocess.run(
        [sys.executable, "-c", HAMMER, str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"the reading process died ({proc.returncode}): {proc.stderr}"
    assert proc.stdout.split()[0] == "0", f"wrong rows or errors: {proc.stdout}"


def test_v21_matches_v30(factory):
    a = LeRobotReader(factory(version="v3.0", num_cameras=1).root)
    b = LeRobotReader(factory(version="v2.1", num_cameras=1).root)
    assert b.meta.version == "v2.1" and len(a) == len(b)
    for i in range(0, len(a), 7):
        x, y = a[i], b[i]
        assert list(x) == list(y)
        for k in x:
            if k.startswith("observation.images"):
                assert decode_frame_identity(x[k]) == decode_frame_identity(y[k])
            elif isinstance(x[k], str):
                assert x[k] == y[k]
            else:
                assert torch.equal(x[k], y[k]), k


def test_container_is_trusted_not_info_json(open50):
    meta = load_metadata(open50)
    assert meta.features["image"]["info"]["video.codec"] == "h264"
    with VideoReader(open50 / meta.episode(0).videos["image"].path) as v:
        assert v.info().codec == "mpeg4"


def test_factory_pattern_roundtrip_and_errors(tmp_path):
    for h, w in ((48, 64), (96, 96), (224, 224), (480, 640)):
        assert decode_frame_identity(frame_image(300, 4000, 2, h, w)) == (300, 4000, 2)
    with pytest.raises(ValueError, match="checksum"):
        decode_frame_identity(np.zeros((48, 64, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"too small.*Fix: pass height>=48"):
        frame_image(0, 0, 0, 32, 32)
    with pytest.raises(ValueError, match=r"Unknown codec 'vp8'.*av1"):
        make_dataset(tmp_path / "x", codec="vp8")
    make_dataset(tmp_path / "y", num_cameras=0)
    with pytest.raises(ValueError, match=r"already exists.*overwrite=True"):
        make_dataset(tmp_path / "y", num_cameras=0)


def test_factory_layout(factory):
    ds = factory()
    files = sorted(p.relative_to(ds.root).as_posix() for p in ds.root.rglob("*.parquet"))
    assert "data/chunk-000/file-000.parquet" in files
    assert "data/chunk-000/file-001.parquet" in files
    assert "data/chunk-001/file-000.parquet" in files


@pytest.mark.parametrize(("codec", "gop"), CODECS, ids=[c for c, _ in CODECS])
def test_random_order_with_camera_window(factory, codec, gop):
    """Going backwards inside an episode with a look-back window (regression: stale cache)."""
    ds = factory(codec=codec, gop=gop, num_cameras=1)
    cam = ds.camera_keys[0]
    reader = LeRobotReader(ds.root, delta_timestamps={cam: [-0.2, -0.1, 0.0]})
    back_then_forward = []
    for e in range(len(ds.episode_lengths)):
        start = ds.dataset_index(e, 0)
        back_then_forward += [start + 4, start, start + 1, start + 6, start + 2]
    rand = np.random.default_rng(1).permutation(len(reader))[:40].tolist()
    for i in back_then_forward + rand:
        e, f = reader.locate(i)
        frames = reader[i][cam]
        for k, d in enumerate((-2, -1, 0)):
            assert decode_frame_identity(frames[k]) == (e, max(f + d, 0), 0), (i, k)


def _list_column(rows, value_type):
    import pyarrow as pa

    # two chunks, sliced: what a read of row groups gives before column_to_numpy
    table = pa.table({"x": pa.array(rows, type=pa.list_(value_type))})
    return pa.concat_tables([table.slice(0, 3), table.slice(3)]).slice(1).column("x")


@pytest.mark.parametrize("value_type", ["float32", "float64", "int64", "bool"])
def test_variable_list_columns_convert_like_their_python_lists(value_type):
    # lerobot's own datasets store vectors as list<float> (open50): converted in one numpy call,
    # the values and the element dtype of the column, row by row as the Python lists hold them
    import pyarrow as pa

    from robo_resume.format.tabular import column_to_numpy

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(7, 5)).astype(value_type).tolist()
    column = _list_column(rows, pa.from_numpy_dtype(np.dtype(value_type)))
    got = column_to_numpy(column, name="x", file=None)
    assert got.shape == (6, 5) and got.dtype == np.dtype(value_type)
    assert got.tolist() == rows[1:]


def test_ragged_list_columns_are_refused_with_their_lengths(tmp_path):
    import pyarrow as pa

    from robo_resume.errors import CorruptFileError
    from robo_resume.format.tabular import column_to_numpy

    column = _list_column([[1.0, 2.0]] * 4 + [[1.0, 2.0, 3.0]] + [[1.0, 2.0]], pa.float32())
    with pytest.raises(CorruptFileError) as info:
        column_to_numpy(column, name="action", file=tmp_path / "f.parquet", first_row=100)
    text = str(info.value)
    assert "Column 'action' holds lists of different lengths" in text
    assert "lengths [2, 3], the first other than 2 in row 103" in text and "f.parquet" in text


@pytest.mark.parametrize("fixed", [False, True])
def test_null_values_inside_lists_are_refused_not_read_as_nan(tmp_path, fixed):
    # arrow converts a null float to NaN: a NaN action fed to training, silently (lerobot's
    # own list columns are list<float>; a fixed-size list is what datasets' Sequence writes)
    import pyarrow as pa

    from robo_resume.errors import CorruptFileError
    from robo_resume.format.tabular import column_to_numpy

    rows = [[1.0, 2.0], [3.0, 4.0], [5.0, None], [7.0, 8.0]]
    column = _list_column(rows, pa.float32())
    if fixed:
        column = column.cast(pa.list_(pa.float32(), 2))
    with pytest.raises(CorruptFileError) as info:
        column_to_numpy(column, name="action", file=tmp_path / "f.parquet", first_row=10)
    text = str(info.value)
    assert "column 'action' holds null values inside its lists" in text
    assert "1 null elements, the first in row 11" in text and "f.parquet" in text


def test_row_group_cache_gives_the_plain_reads_values_within_its_budget(factory):
    # random row ranges across the factory's 16-row groups: the same values and dtypes as a
    # table without the cache, the kept groups within the budget, and read-only (a caller
    # writing into rows it was given would change what the next chunk reads)
    import pickle

    from robo_resume.format.tabular import RowGroupCache

    ds = factory(episode_lengths=(40, 70, 55), num_cameras=1)
    meta = load_metadata(ds.root)
    path = ds.root / meta.episode(0).data_path
    cols = ["timestamp", "frame_index", "episode_index", "index", "action", "observation.state"]
    cache = RowGroupCache(max_bytes=6000)
    cached, plain = ParquetTable(path, cache=cache), ParquetTable(path)
    plain.check_rows(1, episode=0)
    n = plain.num_rows
    rng = np.random.default_rng(1)
    for _ in range(60):
        a = int(rng.integers(0, n - 1))
        b = int(rng.integers(a + 1, n + 1))
        got, want = cached.read(a, b, cols), plain.read(a, b, cols)
        for c in cols:
            assert got[c].dtype == want[c].dtype and np.array_equal(got[c], want[c]), (a, b, c)
        assert 0 < cache.bytes <= 6000
    assert len(cached._rg_starts) > 4  # several groups, so ranges did cross them
    got = cached.read(0, 2, cols)  # inside the first group: a view of what the cache keeps
    with pytest.raises(ValueError, match="read-only"):
        got["action"][0, 0] = 1.0
    assert pickle.loads(pickle.dumps(cache)).bytes == 0  # each process fills its own


def test_row_group_cache_keeps_a_bad_row_to_the_reads_that_cover_it(factory, tmp_path):
    # a null in one row: reads of the other rows of its row group still succeed, and a read
    # covering it fails naming that row, as without the cache (a chunk is skipped only where
    # its own rows are bad)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from robo_resume.errors import CorruptFileError
    from robo_resume.format.tabular import RowGroupCache

    ds = factory(episode_lengths=(40,), num_cameras=1)
    path = ds.root / load_metadata(ds.root).episode(0).data_path
    table = pq.read_table(path)
    state = table.column("observation.state").to_pylist()
    state[20] = None
    i = table.schema.get_field_index("observation.state")
    bad = tmp_path / "bad.parquet"
    pq.write_table(
        table.set_column(i, "observation.state", pa.array(state, table.schema.field(i).type)),
        bad,
        row_group_size=16,
    )
    t = ParquetTable(bad, cache=RowGroupCache())
    assert t.read(16, 20, ["observation.state"])["observation.state"].shape == (4, 4)
    assert t.read(21, 32, ["observation.state"])["observation.state"].shape == (11, 4)
    with pytest.raises(CorruptFileError, match=r"holds nulls.*first at row 20"):
        t.read(18, 24, ["observation.state"])
