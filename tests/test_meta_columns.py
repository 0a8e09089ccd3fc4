"""The columnar metadata (``DatasetMeta.columns``) equals the per-episode result it replaced.

Random small ``meta/`` folders (v3.0: several episode files, rows out of order, shared data and
video files, ragged task lists with nulls; v2.1: shuffled JSON lines) are loaded with
``load_metadata``, and every episode is compared with values computed here independently, the
way the per-episode loader did it: pandas over the same parquet files (or ``json`` over the
lines), one dict per episode, Python ``str.format`` for the paths and a running sum per data
file for the row offsets. The fingerprint is recomputed the same way, from Python lists.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robo_resume import load_metadata
from robo_resume.format import EpisodeInfo, VideoRef
from robo_resume.index.plan import plan_digest, plan_fingerprint

CAMS = ("observation.images.cam0", "observation.images.cam1")
TASK_WORDS = ("pick the cube", "place the cube", "open the drawer", "wipe")


def _template(factory, version: str) -> Path:
    return factory(num_cameras=2, version=version, episode_lengths=(3, 4)).root


def _meta_only(template: Path, root: Path) -> dict:
    """Copy the template's info.json, stats.json and tasks files (no episodes) to ``root``."""
    (root / "meta").mkdir(parents=True)
    for name in ("info.json", "stats.json", "tasks.parquet", "tasks.jsonl"):
        if (template / "meta" / name).is_file():
            shutil.copy(template / "meta" / name, root / "meta" / name)
    return json.loads((root / "meta" / "info.json").read_text())


def _random_v30(rng: np.random.Generator, template: Path, root: Path) -> None:
    info = _meta_only(template, root)
    n = int(rng.integers(1, 40))
    lengths = rng.integers(1, 30, size=n)
    ids = np.sort(rng.choice(10 * n, size=n, replace=False))  # gaps in episode_index
    start = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    data_file = np.sort(rng.integers(0, max(1, n // 3), size=n))  # shared, in order
    rows = []
    for k in range(n):
        tasks = [str(t) for t in rng.choice(TASK_WORDS, size=int(rng.integers(0, 3)))]
        row = {
            "episode_index": int(ids[k]),
            "tasks": None if rng.random() < 0.1 else tasks,
            "length": int(lengths[k]),
            "data/chunk_index": int(data_file[k] // 3),
            "data/file_index": int(data_file[k] % 3),
            "dataset_from_index": int(start[k]),
            "dataset_to_index": int(start[k] + lengths[k]),
        }
        for c, cam in enumerate(CAMS):
            v = (data_file[k] + c) % 4  # another grouping than the data files
            offset = float(rng.random() * 100)
            row[f"videos/{cam}/chunk_index"] = int(v // 2)
            row[f"videos/{cam}/file_index"] = int(v % 2)
            row[f"videos/{cam}/from_timestamp"] = offset
            row[f"videos/{cam}/to_timestamp"] = offset + lengths[k] / info["fps"]
        rows.append(row)
    order = rng.permutation(n)  # rows out of episode order, split over several files
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, 2), replace=False)) if n > 1 else []
    for f, part in enumerate(np.split(order, cuts)):
        table = pa.Table.from_pylist([rows[k] for k in part])
        path = root / "meta" / "episodes" / f"chunk-00{f % 2}" / f"file-00{f}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    info.update(total_episodes=n, total_frames=int(lengths.sum()))
    (root / "meta" / "info.json").write_text(json.dumps(info))


def _expected_v30(root: Path) -> list[EpisodeInfo]:
    """Per-episode, as the loader before the columns did it (pandas, dicts, str.format)."""
    info = json.loads((root / "meta" / "info.json").read_text())
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    df = df.sort_values("episode_index", kind="stable")
    rows = df.to_dict("records")
    by_file: dict[str, list[dict]] = {}
    for r in rows:
        r["path"] = info["data_path"].format(
            chunk_index=r["data/chunk_index"], file_index=r["data/file_index"]
        )
        by_file.setdefault(r["path"], []).append(r)
    for members in by_file.values():
        offset = 0
        for r in sorted(members, key=lambda r: r["dataset_from_index"]):
            r["row"] = offset
            offset += r["length"]
    out = []
    for r in rows:
        videos = {
            cam: VideoRef(
                path=info["video_path"].format(
                    video_key=cam,
                    chunk_index=r[f"videos/{cam}/chunk_index"],
                    file_index=r[f"videos/{cam}/file_index"],
                ),
                from_timestamp=float(r[f"videos/{cam}/from_timestamp"]),
                to_timestamp=float(r[f"videos/{cam}/to_timestamp"]),
            )
            for cam in CAMS
        }
        tasks = r["tasks"]
        out.append(
            EpisodeInfo(
                episode_index=int(r["episode_index"]),
                length=int(r["length"]),
                dataset_from_index=int(r["dataset_from_index"]),
                data_path=r["path"],
                data_row_start=int(r["row"]),
                tasks=() if tasks is None else tuple(str(t) for t in tasks),
                videos=videos,
            )
        )
    return out


def _random_v21(rng: np.random.Generator, template: Path, root: Path) -> None:
    info = _meta_only(template, root)
    n = int(rng.integers(1, 40))
    ids = rng.choice(5 * n, size=n, replace=False)  # shuffled lines, gaps
    lines = []
    for e in ids.tolist():
        tasks = [str(t) for t in rng.choice(TASK_WORDS, size=int(rng.integers(0, 3)))]
        lines.append({"episode_index": e, "tasks": tasks, "length": int(rng.integers(1, 30))})
    (root / "meta" / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    info.update(total_episodes=n, total_frames=sum(x["length"] for x in lines))
    info["chunks_size"] = int(rng.integers(1, 8))
    (root / "meta" / "info.json").write_text(json.dumps(info))


def _expected_v21(root: Path) -> list[EpisodeInfo]:
    info = json.loads((root / "meta" / "info.json").read_text())
    lines = (root / "meta" / "episodes.jsonl").read_text().splitlines()
    rows = sorted((json.loads(x) for x in lines), key=lambda r: r["episode_index"])
    out, start = [], 0
    for r in rows:
        e, n, chunk = r["episode_index"], r["length"], r["episode_index"] // info["chunks_size"]
        videos = {
            cam: VideoRef(
                path=info["video_path"].format(episode_chunk=chunk, video_key=cam, episode_index=e),
                from_timestamp=0.0,
                to_timestamp=n / info["fps"],
            )
            for cam in CAMS
        }
        path = info["data_path"].format(episode_chunk=chunk, episode_index=e)
        out.append(EpisodeInfo(e, n, start, path, 0, tuple(r["tasks"]), videos))
        start += n
    return out


def _fingerprint_sha(episodes: list[EpisodeInfo], features) -> str:
    h = hashlib.sha256()
    h.update(np.array([e.length for e in episodes], dtype=np.int64).tobytes())
    h.update(np.array([e.dataset_from_index for e in episodes], dtype=np.int64).tobytes())
    h.update(json.dumps(sorted(features), sort_keys=True).encode())
    return h.hexdigest()[:16]


def _check_equal(meta, expected: list[EpisodeInfo]) -> None:
    assert meta.num_episodes == len(expected)
    assert list(meta.episodes) == expected
    assert meta.episodes[-1] == expected[-1] and meta.episodes[1:3] == tuple(expected[1:3])
    for e in expected:
        assert meta.episode(e.episode_index) == e
    ids = [e.episode_index for e in expected]
    assert meta.episode_indices.tolist() == ids
    want = ids[::-1][: max(1, len(ids) // 2)]  # any order, any subset
    got = [a.tolist() for a in meta.spans(want)]
    by_id = {e.episode_index: e for e in expected}
    assert got == [
        want,
        [by_id[e].dataset_from_index for e in want],
        [by_id[e].length for e in want],
    ]
    assert meta.total_frames == sum(e.length for e in expected)
    fp = meta.fingerprint()
    assert fp["episodes_sha256"] == _fingerprint_sha(expected, meta.features)
    assert (fp["num_episodes"], fp["total_frames"]) == (len(expected), meta.total_frames)
    one = meta.select({CAMS[1]: None})  # a dropped camera leaves every episode's videos
    assert list(one.episodes) == [
        EpisodeInfo(**{**e.__dict__, "videos": {CAMS[0]: e.videos[CAMS[0]]}}) for e in expected
    ]
    assert one.fingerprint() == fp


@pytest.mark.parametrize("seed", range(12))
def test_v30_columns_equal_the_per_episode_result(factory, tmp_path, seed):
    root = tmp_path / "ds"
    _random_v30(np.random.default_rng(seed), _template(factory, "v3.0"), root)
    _check_equal(load_metadata(root), _expected_v30(root))


@pytest.mark.parametrize("seed", range(12))
def test_v21_columns_equal_the_per_episode_result(factory, tmp_path, seed):
    root = tmp_path / "ds"
    _random_v21(np.random.default_rng(seed), _template(factory, "v2.1"), root)
    _check_equal(load_metadata(root), _expected_v21(root))


def test_episodes_behave_like_the_tuple_they_replace(factory):
    meta = load_metadata(factory(num_cameras=1).root)
    eps = meta.episodes
    items = tuple(eps)
    assert len(eps) == len(items) and eps[-1] == items[-1] and eps[:] == items
    assert eps[::-2] == items[::-2] and eps == items and eps == meta.episodes
    with pytest.raises(IndexError, match="out of range"):
        eps[len(items)]
    with pytest.raises(KeyError, match=r"Unknown episode.*among the 5 episodes \(0\.\.4\)"):
        meta.episode(99)
    with pytest.raises(KeyError, match="Unknown episode"):
        meta.spans([0, 99])
    assert meta.episode(np.int64(2)) == items[2] == meta.episode(2.0)
    with pytest.raises(ValueError, match="read-only"):
        meta.columns.length[0] = 7


def test_first_bad_episode_is_named_after_sorting(factory, tmp_path):
    """Two files, rows out of order, two episodes whose dataset_to_index disagrees: the error
    names the one with the smaller episode_index, whatever file or row it sits in."""
    root = tmp_path / "ds"
    _random_v30(np.random.default_rng(3), _template(factory, "v3.0"), root)
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    ids = sorted((int(e), f) for f in files for e in pq.read_table(f)["episode_index"].to_pylist())
    assert len(files) > 1 and len(ids) > 4
    for e, f in (ids[4], ids[2]):  # the later one written first
        t = pq.read_table(f).to_pandas()
        t.loc[t["episode_index"] == e, "dataset_to_index"] += 1
        pq.write_table(pa.Table.from_pandas(t, preserve_index=False), f)
    with pytest.raises(Exception, match=rf"disagrees with itself.*episode {ids[2][0]}\b"):
        load_metadata(root)


def _ranges_reference(values, limit=None):
    """format_ranges as it was, one Python int at a time."""
    vals = sorted({int(v) for v in values})
    out, i = [], 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    text = ",".join(out) or "none"
    if limit is not None and len(text) > limit:
        text = text[: text.rfind(",", 0, limit) + 1] + f"... ({len(vals)} in all)"
    return text


@pytest.mark.parametrize("seed", range(30))
def test_format_ranges_of_arrays_equals_the_per_int_text(seed):
    from robo_resume.errors import format_ranges

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    vals = rng.choice(int(rng.integers(max(n, 1), 3 * n + 2)), size=n, replace=bool(seed % 2))
    for limit in (None, 5, 20, 120):
        want = _ranges_reference(vals.tolist(), limit)
        assert format_ranges(vals, limit) == want
        assert format_ranges(tuple(vals.tolist()), limit) == want
        assert format_ranges(iter(vals.tolist()), limit) == want


# Golden values: the bodies of the two tests below run against main at ff53b37 (the
# per-episode loader, before the columns) with the writers above. Never regenerate them from
# this code: they are what old resume states were fingerprinted with.
GOLDEN_META = {
    "v3.0-0": "2f36db1ae3cfc4b9",
    "v3.0-1": "51953c147cc84618",
    "v3.0-2": "bf054a189e2160cd",
    "v3.0-3": "b4efcd9e292ce80f",
    "v3.0-4": "3b464b0c00703c7e",
    "v3.0-5": "d661fec1ffce1d9c",
    "v2.1-0": "7403ca67dd46a4e1",
    "v2.1-1": "875299371faec769",
    "v2.1-2": "264eabab6e3bd8ff",
    "v2.1-3": "8fdfb2e85da3178f",
    "v2.1-4": "38de0957ef620e74",
    "v2.1-5": "08c26869e16118b7",
}
GOLDEN_DATASET = {
    "v2.1 ['episodes']": [
        "752a82f2a28bb3a5",
        "1ed0359613272b1b",
        "1dee229982f9e457",
        70,
        "0,2-3",
        "(5 episodes, 120 frames)",
    ],
    "v2.1 ['features']": [
        "752a82f2a28bb3a5",
        "86c1b3261036a829",
        "6891d1ae5828f6d5",
        120,
        "0-4",
        "(5 episodes, 120 frames)",
    ],
    "v2.1 []": [
        "752a82f2a28bb3a5",
        "86c1b3261036a829",
        "6891d1ae5828f6d5",
        120,
        "0-4",
        "(5 episodes, 120 frames)",
    ],
    "v3.0 ['episodes']": [
        "752a82f2a28bb3a5",
        "1ed0359613272b1b",
        "1dee229982f9e457",
        70,
        "0,2-3",
        "(5 episodes, 120 frames)",
    ],
    "v3.0 ['features']": [
        "752a82f2a28bb3a5",
        "86c1b3261036a829",
        "6891d1ae5828f6d5",
        120,
        "0-4",
        "(5 episodes, 120 frames)",
    ],
    "v3.0 []": [
        "752a82f2a28bb3a5",
        "86c1b3261036a829",
        "6891d1ae5828f6d5",
        120,
        "0-4",
        "(5 episodes, 120 frames)",
    ],
}


def _digest(meta) -> str:
    rows = [
        [
            e.episode_index,
            e.length,
            e.dataset_from_index,
            e.data_path,
            e.data_row_start,
            list(e.tasks),
            {c: [r.path, r.from_timestamp, r.to_timestamp] for c, r in e.videos.items()},
        ]
        for e in meta.episodes
    ]
    blob = json.dumps([rows, meta.fingerprint()], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(GOLDEN_META))
def test_metadata_equals_what_the_per_episode_loader_gave(factory, tmp_path, name):
    version, seed = name.split("-")
    write = _random_v30 if version == "v3.0" else _random_v21
    write(np.random.default_rng(int(seed)), _template(factory, version), tmp_path / "ds")
    assert _digest(load_metadata(tmp_path / "ds")) == GOLDEN_META[name]


@pytest.mark.parametrize("name", sorted(GOLDEN_DATASET))
def test_dataset_fingerprint_equals_the_per_episode_one(factory, name):
    from robo_resume import ChunkedEpisodeDataset

    version, kind = name.split(" ", 1)
    kw = {
        "[]": {},
        "['episodes']": {"episodes": [0, 2, 3]},
        "['features']": {"features": {"observation.images.cam1": None}},
    }[kind]
    root = factory(version=version, num_cameras=2).root
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8, seed=3, **kw)
    fp = ds.fingerprint
    # the plan's golden value is the older text digest (what states carried before plan_digest)
    assert fp["plan"] == plan_digest(ds.chunks)
    got = [fp["dataset"], fp["episodes"], plan_fingerprint(ds.chunks)[:16], fp["total_frames"]]
    got += [fp["about"]["episodes"], fp["about"]["dataset"].split(" ", 1)[1]]
    assert got == GOLDEN_DATASET[name]
