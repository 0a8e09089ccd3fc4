"""The columnar fast paths of load_metadata give what the row-by-row paths give.

v2.1: ``episodes.jsonl`` read by pyarrow (``format.arrow_columns.jsonl_episode_columns``) and
the per-episode paths filled by printf (``meta_v21._printf_paths``); v3.0: ``tasks.parquet`` and
the numeric columns read without pandas. Each is compared with its slow path (forced by
monkeypatching the fast one away) on files with the awkward cases: episodes out of order,
several tasks per episode, missing or null ``tasks``, non-ASCII text, other path templates.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from robo_resume import load_metadata
from robo_resume.format import meta_v21, meta_v30
from robo_resume.testing import make_dataset


@pytest.fixture(scope="module")
def v21(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("v21") / "ds",
        version="v2.1",
        episode_lengths=(5, 4, 6, 3, 7, 2),
        num_cameras=2,
    ).root


def _slow(monkeypatch):
    monkeypatch.setattr(meta_v21, "jsonl_episode_columns", lambda path: None)
    monkeypatch.setattr(meta_v21, "_printf_paths", lambda *a: None)


def _rewrite(root, rows):
    (root / "meta" / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


ROWS = [  # episode_index, tasks, length: out of order, several, missing, null, non-ASCII
    {"episode_index": 3, "tasks": ["b", "a"], "length": 3},
    {"episode_index": 0, "tasks": ["c"], "length": 5},
    {"episode_index": 5, "length": 2},
    {"episode_index": 1, "tasks": [], "length": 4},
    {"episode_index": 4, "tasks": ["é \\u2192 x", "a"], "length": 7},
    {"episode_index": 2, "tasks": ["a", "c", "b"], "length": 6},
]


@pytest.mark.parametrize("rows", [ROWS, sorted(ROWS, key=lambda r: r["episode_index"])])
def test_v21_episode_columns_equal_the_row_by_row_reader(v21, monkeypatch, rows):
    _rewrite(v21, rows)
    assert meta_v21.jsonl_episode_columns(v21 / "meta" / "episodes.jsonl") is not None
    fast = load_metadata(v21)
    with monkeypatch.context() as m:
        _slow(m)
        slow = load_metadata(v21)
    assert fast.columns == slow.columns
    assert fast.columns.task_names == slow.columns.task_names  # same numbering
    assert fast.tasks == slow.tasks


def test_v21_null_tasks_read_as_none_and_bad_rows_raise_the_same_error(v21, monkeypatch):
    rows = [dict(r) for r in ROWS]
    rows[1]["tasks"] = None
    _rewrite(v21, rows)
    assert meta_v21.jsonl_episode_columns(v21 / "meta" / "episodes.jsonl") is not None
    got = load_metadata(v21)
    with monkeypatch.context() as m:
        _slow(m)
        assert got.columns == load_metadata(v21).columns
    rows[2]["length"] = "seven"
    _rewrite(v21, rows)
    assert meta_v21.jsonl_episode_columns(v21 / "meta" / "episodes.jsonl") is None
    with pytest.raises(Exception, match="length") as fast_error:
        load_metadata(v21)
    with monkeypatch.context() as m:
        _slow(m)
        with pytest.raises(type(fast_error.value)) as slow_error:
            load_metadata(v21)
    assert str(fast_error.value) == str(slow_error.value)


@pytest.mark.parametrize(
    "data_tpl, video_tpl",
    [
        (
            "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        ),
        ("d/{episode_chunk}/e{episode_index:d}.parquet", "v%/{video_key}/{episode_index:4d}.mp4"),
        ("d/{episode_index}/{episode_chunk}.parquet", "v/{video_key!s}/{episode_index}.mp4"),
    ],
)
def test_v21_printf_paths_equal_format_map(data_tpl, video_tpl):
    import numpy as np

    ep = np.array([0, 1, 7, 999, 1000, 123456])
    cams = ("observation.images.top", "cam%d")
    fast = meta_v21._printf_paths(data_tpl, video_tpl, cams, ep, 1000)
    slow = meta_v21._episode_paths(None, data_tpl, video_tpl, cams, ep, 1000)
    assert fast is None or fast == slow
    if "{episode_chunk" in data_tpl.split("{episode_index")[0] and "!" not in video_tpl:
        assert fast is not None  # the usual kind takes the fast path


def test_v30_tasks_without_pandas_equal_pandas(tmp_path):
    root = make_dataset(tmp_path / "v30", episode_lengths=(3, 4, 2), tasks=("é a", "b")).root
    path = root / "meta" / "tasks.parquet"
    assert list(meta_v30._task_pairs(path)) == list(meta_v30._pandas_task_pairs(path))


def test_v30_load_metadata_does_not_import_pandas(tmp_path):
    root = make_dataset(tmp_path / "v30", episode_lengths=(3, 4), num_cameras=1).root
    code = (
        "import sys, robo_resume; robo_resume.load_metadata(sys.argv[1]); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_reading_batches_does_not_import_pandas(tmp_path):
    # pyarrow's to_numpy imports pandas (0.3-0.5 s): it was paid by every fresh DataLoader
    # worker on its first batch; data columns (scalars, fixed and variable lists) are read
    # from their buffers instead, with the same values (the other tests of the columns).
    # One fresh process reads a v3.0 and a v2.1 dataset, with a window.
    roots = [
        make_dataset(
            tmp_path / version, version=version, episode_lengths=(9, 7), num_cameras=1
        ).root
        for version in ("v3.0", "v2.1")
    ]
    code = (
        "import sys, robo_resume\n"
        "for root in sys.argv[1:]:\n"
        "    ds = robo_resume.ChunkedEpisodeDataset(root, batch_size=4, "
        "delta_timestamps={'action': [0.0, 0.1]})\n"
        "    n = sum(len(b['index']) for b in ds.dataloader(num_workers=0))\n"
        "    print(n, 'pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, roots)], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["16", "False", "16", "False"], out.stdout + out.stderr


@pytest.mark.parametrize("key", ["data_path", "video_path"])
@pytest.mark.parametrize("value", [-1, 7.5, ["data/{episode_index}.parquet"]])
def test_v21_template_that_is_not_text_is_named(tmp_path, key, value):
    """A data_path or video_path in info.json that is no string gets the template error of the
    row-by-row path (the printf fast path raised a bare TypeError on -1; found by test_fuzz)."""
    root = make_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(3, 2), num_cameras=1).root
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info[key] = value
    info_path.write_text(json.dumps(info))
    from robo_resume.errors import DatasetFormatError

    what = "data" if key == "data_path" else "video"
    with pytest.raises(DatasetFormatError, match=rf"{what} template cannot be filled.*info\.json"):
        load_metadata(root)


def test_v21_chunks_size_beyond_int64_loads_as_the_row_by_row_path(tmp_path, monkeypatch):
    """chunks_size = 2**64 (valid: every episode in chunk 0) loads as the row-by-row path loads
    it (the printf fast path divided in int64 and raised OverflowError; found by test_fuzz)."""
    root = make_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(3, 2), num_cameras=1).root
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["chunks_size"] = 2**64
    info_path.write_text(json.dumps(info))
    fast = load_metadata(root)
    with monkeypatch.context() as m:
        _slow(m)
        slow = load_metadata(root)
    assert fast.columns == slow.columns


def test_forked_workers_inherit_the_decoder_library(tmp_path):
    # a loader whose dataset has video imports PyAV before its workers fork, so that they do
    # not each import it on their first batch (0.12 s of CPU per worker and epoch); without
    # video it does not import it at all. In a fresh process, where nothing imported av yet.
    video = make_dataset(tmp_path / "video", episode_lengths=(9, 7), num_cameras=1).root
    plain = make_dataset(tmp_path / "plain", episode_lengths=(9, 7), num_cameras=0).root
    code = (
        "import os, sys, robo_resume\n"
        "def seen(_):\n"
        # one write per line (atomic on a pipe): two workers' prints could interleave
        "    os.write(1, f\"worker {'av' in sys.modules}\\n\".encode())\n"
        "for root in sys.argv[1:]:\n"
        "    ds = robo_resume.ChunkedEpisodeDataset(root, batch_size=4)\n"
        "    loader = ds.dataloader(num_workers=2, multiprocessing_context='fork', "
        "worker_init_fn=seen)\n"
        "    n = sum(len(b['index']) for b in loader)\n"
        "    print('main', n, 'av' in sys.modules, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(plain), str(video)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.stdout.split("\n")
    assert lines[:3] == ["worker False", "worker False", "main 16 False"], out.stdout + out.stderr
    assert lines[3:6] == ["worker True", "worker True", "main 16 True"], out.stdout + out.stderr
