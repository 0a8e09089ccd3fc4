"""Structure-aware fuzzer: hypothesis mutates a small factory dataset (info.json, episode
metadata, data parquet files, mp4 containers, links) and resume states, then reads it.

The property: every run ends, within the test's timeout, either with data equal to the pristine
dataset's (random access through ``LeRobotReader`` and the stream in the main process) or with a
:class:`~robo_resume.errors.RoboResumeError` whose message names the file (``At file ...``;
resume states have no file and name the field). Never a raw exception, a hang or other data,
except one case lerobot reads the same way: an mp4 replaced by a longer one of the dataset
reads by timestamp (other frames) with the warning that names the file.

Profiles: ``ROBO_RESUME_FUZZ=ci`` (the default: a few hundred examples in all, about a minute
here) or ``ROBO_RESUME_FUZZ=long`` (by hand: ``ROBO_RESUME_FUZZ=long pytest tests/test_fuzz.py``).
Every JSON and JSON-lines file of meta/ also gets numbers that JSON cannot hold but Python's
json writes and reads (NaN, Infinity) and bytes that are not UTF-8. For the metadata families
the columnar fast paths of ``load_metadata`` (pyarrow's ``episodes.jsonl`` reader, the printf
paths, the v3.0 columns and tasks without pandas) are also compared with the row-by-row paths
they replace: the same columns and tasks, or the same error.
Removing a feature from info.json is not a mutation here: the items then lack it, as
lerobot's do (both read the declared features only). Mutations stay within what the format can
detect: a flipped bit inside compressed frame data
decodes to other pixels without any error (mp4 and parquet pages have no checksums lerobot
writes), so the mp4 mutations are structural (truncation, codec tag, links, removal).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robo_resume import (
    ChunkedEpisodeDataset,
    LeRobotReader,
    ResumeStateError,
    RoboResumeError,
    load_metadata,
)
from robo_resume.format import meta_v21, meta_v30

PROFILE = os.environ.get("ROBO_RESUME_FUZZ", "ci")
EXAMPLES = {"ci": 40, "long": 1000}[PROFILE]
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
pytestmark = pytest.mark.timeout(240 if PROFILE == "ci" else 7200)

LENGTHS = (5, 7, 4)
CAM = "observation.images.cam0"
BASE = {"episode_lengths": LENGTHS, "codec": "h264", "gop": 4}

VALUES = st.sampled_from(
    [None, -1, 0, 1, 2, 3, 1.5, float("nan"), float("inf"), 10**12, 2**63 - 1, 2**64, "x", "3",
     True, [], [1], {}, {"a": 1}]
)  # fmt: skip


# --------------------------------------------------------------------------- pristine data


def _items(root: Path) -> dict[int, dict]:
    reader = LeRobotReader(root)
    out = {}
    for i in range(len(reader)):
        item = reader[i]
        out[int(item["index"])] = item
    reader.close()
    return out


def _streamed(root: Path) -> dict[int, dict]:
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=4)
    out = {}
    for batch in ds.dataloader(num_workers=0):
        batch = {k: v for k, v in batch.items() if not k.startswith("robo_resume")}
        for j, index in enumerate(batch["index"].tolist()):
            assert index not in out, f"index {index} twice in one epoch"
            out[index] = {k: v[j] for k, v in batch.items()}
    return out


def _equal(got: dict[int, dict], want: dict[int, dict], *, complete: bool) -> None:
    if complete:
        assert sorted(got) == sorted(want)
    else:  # the stream drops a tail that does not fill a stream's share
        assert set(got) <= set(want)
    for index, item in got.items():
        ref = want[index]
        assert set(item) == set(ref), index
        for k, v in ref.items():
            a = item[k]
            if isinstance(v, torch.Tensor):
                assert torch.equal(a, v), (index, k)
            else:
                assert a == v, (index, k)


@pytest.fixture(scope="module")
def pristine(factory) -> dict[str, tuple[Path, dict[int, dict]]]:
    out = {}
    for version in ("v3.0", "v2.1"):
        root = factory(**BASE, version=version).root
        out[version] = (root, _items(root))
    return out


class _Warnings(logging.Handler):
    """The WARNING messages of robo_resume's logger while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _check(root: Path, want: dict[int, dict], *, copied_video: Path | None = None) -> str:
    """Read ``root`` both ways; equal data or a RoboResumeError naming a file.

    ``copied_video``: an mp4 replaced by another of the dataset. When it has more frames than
    its episodes, it reads as lerobot reads it (by timestamp: other frames), which is accepted
    only with robo_resume's warning naming that file (from the file alone it is an episode
    trimmed in its parquet, see tests/test_video_meta_disagree.py)."""
    logger = logging.getLogger("robo_resume")
    warnings = _Warnings()
    logger.addHandler(warnings)
    try:
        _equal(_items(root), want, complete=True)
        _equal(_streamed(root), want, complete=False)
        return "equal"
    except RoboResumeError as exc:
        assert "At file " in str(exc), f"the message names no file: {exc}"
        return type(exc).__name__
    except AssertionError:
        named = [m for m in warnings.messages if f"video {copied_video} (" in m]
        if copied_video is None or not any("trailing frames" in m for m in named):
            raise
        return "other frames, warned"
    finally:
        logger.removeHandler(warnings)


@contextlib.contextmanager
def _row_by_row_paths() -> Iterator[None]:
    """load_metadata with every columnar fast path replaced by the path it replaced."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(meta_v21, "jsonl_episode_columns", lambda path: None)
        m.setattr(meta_v21, "_printf_paths", lambda *a: None)
        m.setattr(meta_v30, "_arrow_task_pairs", lambda *a: None)
        m.setattr(meta_v30, "_arrow_task_lists", lambda col: None)
        m.setattr(meta_v30, "plain_numpy", lambda col: None)  # numbers through pandas
        yield


def _metadata(root: Path) -> tuple:
    try:
        meta = load_metadata(root)
    except RoboResumeError as exc:
        return type(exc).__name__, str(exc)
    return "loaded", meta.columns, meta.tasks, meta.fps


def _check_fast_paths(root: Path) -> None:
    """The fast paths load what the row-by-row paths load, or raise the same error."""
    fast = _metadata(root)
    with _row_by_row_paths():
        slow = _metadata(root)
    assert fast == slow, (fast, slow)


# --------------------------------------------------------------------------- mutations


def _copy(src: Path) -> Path:
    dst = Path(tempfile.mkdtemp(prefix="fuzz-")) / "ds"
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _files(root: Path, pattern: str) -> list[Path]:
    return sorted(root.glob(pattern))


def _set_cell(table: pa.Table, name: str, row: int, value) -> pa.Table:
    values = table.column(name).to_pylist()
    values[row % len(values)] = value
    try:
        column = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        column = pa.array([json.dumps(v) for v in values])  # mixed: the column becomes text
    return table.set_column(table.schema.get_field_index(name), name, column)


@st.composite
def info_mutation(draw):
    key = draw(
        st.sampled_from(
            ["fps", "features", "data_path", "video_path", "codebase_version", "total_frames",
             "chunks_size", "feature.shape", "feature.dtype"]
        )
    )  # fmt: skip
    value = draw(
        VALUES
        | st.sampled_from(
            ["data/{chunk_index.x}.parquet", "../{chunk_index}/{file_index}", "{nope}",
             "videos/{video_key}/{episode_index:06d}.mp4", "v2.0", "v9"]
        )
    )  # fmt: skip
    feature = draw(st.sampled_from(["observation.state", "action", "index", CAM, "timestamp"]))
    return key, value, feature


def apply_info(root: Path, mutation) -> None:
    key, value, feature = mutation
    p = root / "meta" / "info.json"
    info = json.loads(p.read_text())
    if key.startswith("feature."):
        what = key.split(".", 1)[1]
        if what == "remove":
            info["features"].pop(feature, None)
        else:
            info["features"][feature][what] = value
    elif value is None:
        info.pop(key, None)
    else:
        info[key] = value
    p.write_text(json.dumps(info))


@st.composite
def episodes_mutation(draw):
    column = draw(
        st.sampled_from(
            ["episode_index", "length", "dataset_from_index", "dataset_to_index",
             "data/chunk_index", "data/file_index", f"videos/{CAM}/chunk_index",
             f"videos/{CAM}/file_index", f"videos/{CAM}/from_timestamp",
             f"videos/{CAM}/to_timestamp", "tasks"]
        )
    )  # fmt: skip
    return column, draw(st.integers(0, 2)), draw(VALUES)


def apply_episodes(root: Path, mutation) -> None:
    column, row, value = mutation
    jsonl = root / "meta" / "episodes.jsonl"
    if jsonl.is_file():  # v2.1: the same mutation on the jsonl keys that exist there
        rows = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
        key = column if column in ("episode_index", "length", "tasks") else "length"
        rows[row][key] = value
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return
    path = _files(root, "meta/episodes/chunk-*/file-*.parquet")[0]
    pq.write_table(_set_cell(pq.read_table(path), column, row, value), path)


@st.composite
def data_mutation(draw):
    op = draw(st.sampled_from(["cell", "drop", "rows", "truncate", "shuffle", "episode"]))
    column = draw(
        st.sampled_from(
            ["observation.state", "action", "timestamp", "frame_index", "episode_index", "index",
             "task_index"]
        )
    )  # fmt: skip
    return op, column, draw(st.integers(0, 20)), draw(VALUES), draw(st.integers(0, 10))


def apply_data(root: Path, mutation) -> None:
    op, column, row, value, which = mutation
    files = _files(root, "data/**/*.parquet")
    path = files[which % len(files)]
    table = pq.read_table(path)
    if op == "cell":
        table = _set_cell(table, column, row, value)
    elif op == "drop":
        table = table.drop_columns([column])
    elif op == "rows":
        table = table.slice(0, max(table.num_rows - 1 - row % 3, 0))
    elif op == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: (row * len(data)) // 21])
        return
    elif op == "shuffle":
        order = np.random.default_rng(row).permutation(table.num_rows)
        table = table.take(pa.array(order))
    elif op == "episode":
        table = _set_cell(table, "episode_index", row, which % 5)
    pq.write_table(table, path)


@st.composite
def video_mutation(draw):
    op = draw(st.sampled_from(["truncate", "codec_tag", "remove", "empty", "swap", "link"]))
    return op, draw(st.integers(0, 10)), draw(st.floats(0.0, 0.99))


def apply_video(root: Path, mutation) -> Path | None:
    op, which, fraction = mutation
    files = _files(root, "videos/**/*.mp4")
    path = files[which % len(files)]
    if op == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * fraction)])
    elif op == "codec_tag":
        data = path.read_bytes()
        path.write_bytes(data.replace(b"avc1", b"zzz9").replace(b"avcC", b"zzzC"))
    elif op == "remove":
        path.unlink()
    elif op == "empty":
        path.write_bytes(b"")
    elif op == "swap":  # another file of the same dataset in its place (other frames)
        other = files[(which + 1) % len(files)]
        if other != path:
            data = other.read_bytes()
            path.write_bytes(data)
        return path
    elif op == "link":
        path.unlink()
        path.symlink_to("/etc/passwd" if which % 2 else os.path.relpath("/etc/hosts", path.parent))
    return None


NOT_JSON_NUMBERS = [float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308]


def _number_leaves(value, path=()) -> list[tuple]:
    """The paths of the numbers (not booleans) inside a JSON value, in document order."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _number_leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _number_leaves(v, (*path, i))]
    return [path] if isinstance(value, int | float) and not isinstance(value, bool) else []


@st.composite
def number_mutation(draw):
    """A number of info.json (fps, or any other) becomes NaN, an infinity or an extreme."""
    which = draw(st.one_of(st.just("fps"), st.integers(0, 300)))
    return which, draw(st.sampled_from(NOT_JSON_NUMBERS))


def apply_number(root: Path, mutation) -> None:
    which, value = mutation
    p = root / "meta" / "info.json"
    info = json.loads(p.read_text())
    leaves = _number_leaves(info)
    path = ("fps",) if which == "fps" else leaves[which % len(leaves)]
    node = info
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    p.write_text(json.dumps(info))  # allow_nan: written as NaN, Infinity, -Infinity


NOT_UTF8 = [b"\xff", b"\x80", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]


@st.composite
def text_mutation(draw):
    """Bytes that are not UTF-8 in a JSON or JSON-lines file of meta/: inside a string (after
    its opening quote, where pyarrow's reader does not look) or over any bytes."""
    where = draw(st.sampled_from(["string", "anywhere"]))
    return (
        draw(st.integers(0, 10)),
        where,
        draw(st.integers(0, 10**6)),
        draw(st.sampled_from(NOT_UTF8)),
    )


def apply_text(root: Path, mutation) -> None:
    which, where, at, bad = mutation
    files = _files(root, "meta/**/*.json") + _files(root, "meta/**/*.jsonl")
    path = files[which % len(files)]
    data = path.read_bytes()
    if where == "string":
        quotes = [i for i, b in enumerate(data) if b == ord('"')]
        i = quotes[at % len(quotes)] + 1
        path.write_bytes(data[:i] + bad + data[i:])
    else:
        i = at % len(data)
        path.write_bytes(data[:i] + bad + data[i + len(bad) :])


# --------------------------------------------------------------------------- properties

FAMILIES = {
    "info": (info_mutation(), apply_info),
    "episodes": (episodes_mutation(), apply_episodes),
    "data": (data_mutation(), apply_data),
    "video": (video_mutation(), apply_video),
    "numbers": (number_mutation(), apply_number),
    "text": (text_mutation(), apply_text),
}
METADATA_FAMILIES = {"info", "episodes", "numbers", "text"}  # the fast paths are compared too
# fewer examples where the cases are few (a handful of values, files and byte sequences): the
# run stays about as long as before these families
EXAMPLES_OF = {"numbers": EXAMPLES * 3 // 8, "text": EXAMPLES // 2}
OUTCOMES: dict[str, dict[str, int]] = {}


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_mutated_dataset_gives_pristine_data_or_a_clear_error(pristine, family, version):
    strategy, apply = FAMILIES[family]
    src, want = pristine[version]
    seen = OUTCOMES.setdefault(f"{family}/{version}", {})

    @settings(FUZZ, max_examples=EXAMPLES_OF.get(family, EXAMPLES))
    @given(strategy)
    def run(mutation):
        root = _copy(src)
        try:
            copied = apply(root, mutation)  # the swapped mp4, if one was
            if family in METADATA_FAMILIES:
                _check_fast_paths(root)
            outcome = _check(root, want, copied_video=copied)
        finally:
            shutil.rmtree(root.parent, ignore_errors=True)
        seen[outcome] = seen.get(outcome, 0) + 1

    run()
    print(f"fuzz {family}/{version}: {sum(seen.values())} examples, outcomes {seen}")


@st.composite
def state_mutation(draw):
    field = draw(
        st.sampled_from(
            ["epoch", "position", "rank", "role", "batches", "num_workers", "world_size",
             "version", "fingerprint", "cursors", "elastic", "skipped"]
        )
    )  # fmt: skip
    return field, draw(VALUES | st.integers(-5, 60) | st.sampled_from([10**18, 2**63 - 2]))


def test_mutated_resume_state_resumes_exactly_or_is_refused(pristine):
    root, _ = pristine["v3.0"]
    ds = ChunkedEpisodeDataset(root, batch_size=2, chunk_frames=4)
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=0)
    batches = [tracker.consume(b) for b in loader]
    tracker = ds.tracker()
    for b in ChunkedEpisodeDataset(root, batch_size=2, chunk_frames=4).dataloader():
        tracker.consume(b)
        break
    saved = json.loads(json.dumps(tracker.state_dict()))
    rest = [b["index"].tolist() for b in batches[1:]]
    seen: dict[str, int] = {}

    @FUZZ
    @given(state_mutation())
    def run(mutation):
        field, value = mutation
        state = json.loads(json.dumps(saved))
        if field in ("epoch", "position", "rank", "role"):
            state["cursors"][0][("rank", "role", "epoch", "position").index(field)] = value
        else:
            state[field] = value
        try:
            resumed = ChunkedEpisodeDataset(root, batch_size=2, chunk_frames=4, resume_state=state)
            got = [b["index"].tolist() for b in resumed.dataloader()]
        except ResumeStateError as exc:
            assert "Fix:" in str(exc) or "Expected" in str(exc), str(exc)
            seen["ResumeStateError"] = seen.get("ResumeStateError", 0) + 1
            return
        # Accepted: the unchanged state, or another consistent point (epoch, position) of the
        # same run: the rest of that epoch, in the schedule's order (read from the files).
        e, p = state["cursors"][0][2], state["cursors"][0][3]
        if p == ds.schedule(0).frames_per_stream:  # a finished epoch: the next one, whole
            e, p = e + 1, 0
        want = ds.schedule(0).frame_indices(e, 0, p).tolist()
        flat = [i for b in got for i in b]
        if field in ("num_workers", "world_size"):  # elastic: the leftover, re-shuffled
            assert sorted(flat) == sorted(want), (mutation, got)
            seen["resumed elastic"] = seen.get("resumed elastic", 0) + 1
            return
        assert flat == want, (mutation, got)
        if field not in ("epoch", "position"):
            assert got == rest, (mutation, got)
        seen["resumed"] = seen.get("resumed", 0) + 1

    run()
    print(f"fuzz resume states: {sum(seen.values())} examples, outcomes {seen}")
