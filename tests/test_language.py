"""lerobot 0.6's language columns (language_persistent, language_events) read as lerobot reads them.

The datasets are written by lerobot 0.6.1's own code: ``LeRobotDataset.create`` with the two
language features declared (``language_feature_info()``), ``add_frame`` / ``save_episode`` /
``finalize``, then the annotation writer of ``lerobot-annotate``
(``lerobot.annotations.steerable_pipeline``: rows staged per episode, ``LanguageColumnsWriter``
rewrites the data parquet). Items are compared with ``LeRobotDataset(..., return_uint8=True,
video_backend="pyav")`` item for item, exactly: the same keys in the same order, equal tensors,
and language values of the same Python types, dict key order and values (floats compared with
``==``). Through the reader, streamed batches (0 and 2 workers, with delta windows on the
other features), a plain DataLoader's collate, and the mix.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from robo_resume import ChunkedEpisodeDataset, CorruptFileError, LeRobotReader
from robo_resume.items import unbind
from robo_resume.mix import MixedDataset, MixSource

DOC = Path(__file__).resolve().parents[1] / "docs" / "language.md"
LANGUAGE = ("language_persistent", "language_events")
H, W = 48, 64
FPS = 10
CAMERA = "observation.images.top"
DELTA = {"action": [0.0, 0.1, 0.2], CAMERA: [-0.1, 0.0], "observation.state": [-0.2, 0.0]}


def write_with_lerobot(root, lengths, seed=0):
    """A v3.0 dataset with a camera and the two language columns declared (not filled)."""
    from lerobot.datasets.language import language_feature_info
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        CAMERA: {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        **language_feature_info(),
    }
    ds = LeRobotDataset.create("local/language", fps=FPS, features=features, root=root)
    rng = np.random.default_rng(seed)
    for ep, n in enumerate(lengths):
        for f in range(n):
            base = rng.integers(0, 255, size=(6, 8, 3), dtype=np.uint8)
            ds.add_frame(
                {
                    "observation.state": np.array([ep, f], dtype=np.float32),
                    "action": rng.normal(size=2).astype(np.float32),
                    CAMERA: np.kron(base, np.ones((8, 8, 1), dtype=np.uint8)),
                    "task": ("pick the cube", "open the drawer")[ep % 2],
                    "language_persistent": None,  # filled by the annotation pipeline
                    "language_events": None,
                }
            )
        ds.save_episode()
    ds.finalize()
    return root


def annotate_with_lerobot(root, stage):
    """lerobot-annotate's writer: staged module outputs -> the two language columns.

    Episode 0: a plan (at a time float32 cannot hold exactly), two subtasks, a user
    interjection answered by a ``say`` tool call, and a camera-grounded VQA pair whose answer
    is a tool call with a float argument (HF's JSON storage keeps 10 decimals of it).
    Episode 2: a memory row with non-ASCII text. Episode 1 and any later episode: nothing
    (empty lists).
    """
    from lerobot.annotations.steerable_pipeline.reader import iter_episodes
    from lerobot.annotations.steerable_pipeline.staging import EpisodeStaging
    from lerobot.annotations.steerable_pipeline.writer import LanguageColumnsWriter, speech_atom

    records = list(iter_episodes(root))
    t = records[0].frame_timestamps  # events sit on frames whose timestamp they carry
    EpisodeStaging(stage, 0).write(
        "plan",
        [
            {
                "role": "assistant",
                "content": "1. grasp 2. lift",
                "style": "plan",
                "timestamp": 0.05,
            },
            {"role": "assistant", "content": "grasp", "style": "subtask", "timestamp": t[0]},
            {"role": "assistant", "content": "lift", "style": "subtask", "timestamp": t[3]},
        ],
    )
    EpisodeStaging(stage, 0).write(
        "interjections",
        [
            {"role": "user", "content": "slower!", "style": "interjection", "timestamp": t[1]},
            speech_atom(t[1], "slowing down"),
        ],
    )
    point = {"name": "point", "arguments": {"x": 0.123456789012345, "y": 2}}
    cam = CAMERA
    EpisodeStaging(stage, 0).write(
        "vqa",
        [
            {
                "role": "user",
                "content": "where?",
                "style": "vqa",
                "timestamp": t[4],
                "camera": CAMERA,
            },
            {
                "role": "assistant",
                "content": None,
                "style": "vqa",
                "timestamp": t[4],
                "camera": cam,
                "tool_calls": [{"type": "function", "function": point}],
            },
        ],
    )
    t2 = records[2].frame_timestamps
    EpisodeStaging(stage, 2).write(
        "plan",
        [
            {
                "role": "assistant",
                "content": "tiroir ouvert ✓",
                "style": "memory",
                "timestamp": t2[2],
            }
        ],
    )
    LanguageColumnsWriter().write_all(records, stage, root)
    return root


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    base = tmp_path_factory.mktemp("language")
    root = write_with_lerobot(base / "ds", (9, 6, 8))
    return annotate_with_lerobot(root, base / "stage")


@pytest.fixture(scope="module")
def unannotated(tmp_path_factory):
    """The columns as LeRobotDataset.create writes them: declared, null in every row."""
    return write_with_lerobot(tmp_path_factory.mktemp("language_null") / "ds", (5, 4), seed=1)


def lerobot_dataset(root, uint8=True, **kw):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/oracle", root=root, return_uint8=uint8, video_backend="pyav", **kw)


def assert_same_value(a, b, where):
    """Equal with the same types all the way down, and dict keys in the same order."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__} ({a!r}, {b!r})"
    if isinstance(b, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in b:
            assert_same_value(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, list):
        assert len(a) == len(b), f"{where}: {len(a)} values != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_value(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_item(ours, theirs, where):
    assert list(ours) == list(theirs), f"{where}: keys {list(ours)} != {list(theirs)}"
    for k, b in theirs.items():
        a = ours[k]
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{where}: {k} is {type(a)}"
            assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {k}"
            assert torch.equal(a, b), f"{where}: {k} {a} != {b}"
        else:
            assert_same_value(a, b, f"{where}: {k}")


def assert_one_epoch(seen, frames, num_workers, batch_size=4):
    """Each frame at most once; all of them, but for the tail streams drop (equal batches)."""
    assert len(seen) == len(set(seen)), sorted(seen)
    assert frames - len(seen) < max(num_workers, 1) * batch_size * 2, (frames, len(seen))


def test_annotations_are_what_lerobot_wrote(annotated):
    """The fixture holds what the comparisons need: rows of every kind, and empty lists."""
    theirs = lerobot_dataset(annotated)
    assert theirs.meta.has_language_columns
    persistent = theirs[0]["language_persistent"]
    assert [r["style"] for r in persistent] == ["subtask", "plan", "subtask"]
    assert persistent[1]["timestamp"] == float(np.float32(0.05)) != 0.05  # HF's float32 cast
    assert [r["role"] for r in theirs[1]["language_events"]] == ["assistant", "user"]
    say = theirs[1]["language_events"][0]["tool_calls"][0]
    assert say["function"]["name"] == "say" and say["function"]["arguments"]["text"]
    point = theirs[4]["language_events"][0]["tool_calls"][0]["function"]["arguments"]
    assert point["x"] != 0.123456789012345 and abs(point["x"] - 0.123456789) < 1e-12
    assert theirs[9]["language_persistent"] == [] and theirs[9]["language_events"] == []
    assert theirs[15]["language_persistent"][0]["content"] == "tiroir ouvert ✓"


@pytest.mark.parametrize("uint8", [True, False], ids=["uint8", "float32"])
def test_reader_items_equal_lerobot(annotated, uint8):
    ours = LeRobotReader(annotated, image_dtype="uint8" if uint8 else "float32")
    theirs = lerobot_dataset(annotated, uint8=uint8)
    assert len(ours) == len(theirs) == 23
    for i in range(len(theirs)):
        assert_same_item(ours[i], theirs[i], f"item {i}")


def test_items_own_their_lists(annotated):
    """Two items never share a list or dict: changing one item's rows changes no other."""
    ours = LeRobotReader(annotated)
    a, b = ours[0], ours[1]
    assert a["language_persistent"] == b["language_persistent"]
    assert a["language_persistent"] is not b["language_persistent"]
    a["language_persistent"][0]["content"] = "changed"
    assert b["language_persistent"][0]["content"] == "grasp"
    assert ours[1]["language_persistent"][0]["content"] == "grasp"


def test_unannotated_columns_are_none_as_in_lerobot(unannotated):
    ours, theirs = LeRobotReader(unannotated, image_dtype="uint8"), lerobot_dataset(unannotated)
    assert theirs[0]["language_persistent"] is None
    for i in range(len(theirs)):
        assert_same_item(ours[i], theirs[i], f"item {i}")


def test_episode_selection(annotated):
    ours = LeRobotReader(annotated, episodes=[2, 0], image_dtype="uint8")
    theirs = lerobot_dataset(annotated, episodes=[0, 2])
    assert len(ours) == len(theirs) == 17
    for i in range(len(theirs)):
        assert_same_item(ours[i], theirs[i], f"item {i}")


def test_windows_on_other_features(annotated):
    """Windows on state, action and the camera: the language values are the frame's own."""
    ours = LeRobotReader(annotated, delta_timestamps=DELTA, image_dtype="uint8")
    theirs = lerobot_dataset(annotated, delta_timestamps=DELTA)
    for i in range(len(theirs)):
        assert_same_item(ours[i], theirs[i], f"item {i}")


@pytest.mark.parametrize("key", LANGUAGE)
def test_windows_on_language_columns_are_refused(annotated, key):
    """lerobot fails with a raw TypeError from torch.stack; robo_resume says why and the fix."""
    theirs = lerobot_dataset(annotated, delta_timestamps={key: [0.0, 0.1]})
    with pytest.raises(TypeError):
        theirs[0]
    message = (
        rf"delta_timestamps names the language feature '{key}'\. Expected numeric, video or "
        rf"image features .*Found '{key}' of dtype 'language' \(lerobot's LeRobotDataset fails "
        r"on it too, with a TypeError from torch\.stack\)\. At file .*info\.json\. Fix: leave "
        rf"'{key}' out of delta_timestamps; items still hold its list of messages"
    )
    with pytest.raises(ValueError, match=message):
        LeRobotReader(annotated, delta_timestamps={key: [0.0, 0.1]})
    with pytest.raises(ValueError, match=message):
        ChunkedEpisodeDataset(annotated, batch_size=4, delta_timestamps={key: [0.0]})


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streamed_batches(annotated, num_workers):
    """Every row of every batch equals lerobot's item; a batch holds each language column as a
    list with one value per row (cameras in shared memory with 2 workers, lists pickled)."""
    theirs = lerobot_dataset(annotated, delta_timestamps=DELTA)
    ds = ChunkedEpisodeDataset(
        annotated,
        batch_size=4,
        seed=5,
        chunk_frames=4,
        delta_timestamps=DELTA,
        image_dtype="uint8",
    )
    tracker = ds.tracker()
    seen = []
    for batch in ds.dataloader(num_workers=num_workers):
        batch = tracker.consume(batch)
        for key in LANGUAGE:
            assert type(batch[key]) is list and len(batch[key]) == len(batch["index"])
        for row in unbind(batch):
            i = int(row["index"])
            assert_same_item(row, theirs[i], f"batch row index={i}")
            seen.append(i)
    assert_one_epoch(seen, len(theirs), num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_plain_dataloader_collate(annotated, num_workers):
    """A plain DataLoader (torch's default_collate, as lerobot-train without language) gets
    language columns as lists, one value per item, like tasks; lerobot_collate_fn (what
    lerobot-train passes for a language dataset) collates our items as it collates lerobot's."""
    from lerobot.utils.collate import lerobot_collate_fn

    theirs = lerobot_dataset(annotated)
    ds = ChunkedEpisodeDataset(annotated, batch_size=4, seed=2, chunk_frames=4, image_dtype="uint8")
    loaders = {
        "whole batches": torch.utils.data.DataLoader(ds, batch_size=4, num_workers=num_workers),
        "other batch size": torch.utils.data.DataLoader(ds, batch_size=3, num_workers=num_workers),
    }
    for what, loader in loaders.items():
        seen = []
        for batch in loader:
            assert list(batch)[:3] == [CAMERA, "observation.state", "action"]
            for key in LANGUAGE:
                assert type(batch[key]) is list and len(batch[key]) == len(batch["index"])
            rows = unbind({k: v for k, v in batch.items() if k != "robo_resume_cursor"})
            for row in rows:
                i = int(row["index"])
                assert_same_item(row, theirs[i], f"{what}: row index={i}")
                seen.append(i)
        assert_one_epoch(seen, len(theirs), num_workers)

    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=num_workers, collate_fn=lerobot_collate_fn
    )
    batch = next(iter(loader))
    assert not set(LANGUAGE) & set(batch)  # lerobot_collate_fn drops them, for theirs too
    reference = lerobot_collate_fn([theirs[int(i)] for i in batch["index"]])
    assert list(reference) == [k for k in batch if k != "robo_resume_cursor"]
    for k, v in reference.items():
        assert torch.equal(batch[k], v) if isinstance(v, torch.Tensor) else batch[k] == v, k


def test_mix(annotated, tmp_path_factory):
    """Two language datasets mixed: every row equals lerobot's item of its source."""
    base = tmp_path_factory.mktemp("language_mix")
    other = annotate_with_lerobot(write_with_lerobot(base / "ds", (7, 5, 6), seed=4), base / "s")
    sources = [annotated, other]
    theirs = [lerobot_dataset(root) for root in sources]
    for num_workers in (0, 2):
        mix = MixedDataset(
            [MixSource(annotated, 1), MixSource(other, 1)],
            batch_size=4,
            chunk_frames=4,
            image_dtype="uint8",
            exhausted="stop",
        )
        tracker = mix.tracker()
        seen: list[set[int]] = [set(), set()]
        for batch in mix.dataloader(num_workers=num_workers):
            batch = tracker.consume(batch)
            src = tracker.last_source
            for key in LANGUAGE:
                assert type(batch[key]) is list and len(batch[key]) == len(batch["index"])
            for row in unbind(batch):
                i = int(row["index"])
                assert_same_item(row, theirs[src][i], f"source {src} index={i}")
                seen[src].add(i)
        assert seen[0] and seen[1], seen


def rewrite_column(root, tmp_path, key, values, type_=None):
    """A copy of ``root`` whose data file has ``key`` replaced by ``values(rows)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    path = next(copy.glob("data/*/*.parquet"))
    table = pq.read_table(path)
    at = table.column_names.index(key)
    column = pa.array(values(table.num_rows), type=type_)
    pq.write_table(table.set_column(at, key, column), path)
    return copy


def test_a_row_field_outside_the_schema_is_refused(annotated, tmp_path):
    rows = [{"role": "user", "content": "hi", "style": "vqa", "camera": CAMERA, "mood": "ok"}]
    copy = rewrite_column(annotated, tmp_path, "language_events", lambda n: [rows] * n)
    with pytest.raises(
        CorruptFileError,
        match=r"A data file's language column 'language_events' does not have lerobot's "
        r"schema\. Expected row fields \['role', 'content', 'style', 'camera', 'tool_calls'\] "
        r"\(lerobot\.datasets\.language\)\. Found row fields .*'mood'.*\(not in the schema: "
        r"\['mood'\], first at row 0\)\. At file .*file-000\.parquet.*Fix: write the column "
        r"with lerobot-annotate, or remove it",
    ):
        LeRobotReader(copy)[0]


def test_a_language_column_of_another_type_is_refused(annotated, tmp_path):
    copy = rewrite_column(annotated, tmp_path, "language_persistent", lambda n: ["x"] * n)
    with pytest.raises(
        CorruptFileError,
        match=r"A data file's language column 'language_persistent' has the wrong type\. "
        r"Expected a list of message structs per row \(lerobot\.datasets\.language\)\. Found "
        r"arrow type string\. At file .*file-000\.parquet",
    ):
        LeRobotReader(copy)[0]


def test_missing_fields_are_none_as_hf_fills_them(annotated, tmp_path):
    """A row struct without ``camera`` and ``tool_calls``: lerobot (HF's cast) gives None."""
    rows = [{"role": "user", "content": "hi", "style": "interjection"}]
    copy = rewrite_column(annotated, tmp_path, "language_events", lambda n: [rows] * n)
    ours, theirs = LeRobotReader(copy, image_dtype="uint8"), lerobot_dataset(copy)
    assert theirs[0]["language_events"][0]["camera"] is None
    for i in (0, 5, len(theirs) - 1):
        assert_same_item(ours[i], theirs[i], f"item {i}")


def test_the_docs_example_runs(tmp_path, monkeypatch, capsys):
    """docs/language.md's example, run as written."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/language.md[python block 0]", "exec"), {})
    out = capsys.readouterr().out
    assert "['pick up the red cup', 'put it on the blue cup']" in out
    assert "'content': 'careful!'" in out


def test_lerobot_renders_our_items_as_its_own(annotated):
    """lerobot's message rendering (RenderMessagesStep's render_sample, the processor step that
    consumes these columns) gives the same messages from our items as from lerobot's."""
    from lerobot.configs.recipe import MessageTurn, TrainingRecipe
    from lerobot.datasets.language_render import render_sample

    recipe = TrainingRecipe(
        messages=[
            MessageTurn(role="user", content="${task} (plan: ${plan})", stream="high_level"),
            MessageTurn(
                role="user",
                content="${interjection}",
                stream="high_level",
                if_present="interjection",
            ),
            MessageTurn(role="assistant", content="${subtask}", stream="low_level", target=True),
        ]
    )

    def render(item):
        return render_sample(
            recipe=recipe,
            persistent=item["language_persistent"],
            events=item["language_events"],
            t=float(item["timestamp"]),
            sample_idx=int(item["index"]),
            task=item["task"],
        )

    ours, theirs = LeRobotReader(annotated), lerobot_dataset(annotated)
    rendered = [render(theirs[i]) for i in range(9)]  # episode 0, the annotated one
    assert rendered[1]["messages"][1]["content"] == "slower!"
    assert rendered[4]["messages"][-1]["content"] == "lift"
    for i in range(len(theirs)):
        assert_same_value(render(ours[i]), render(theirs[i]), f"item {i}")


def test_a_dataset_rewritten_by_lerobot_edit_dataset(annotated, tmp_path):
    """lerobot-edit-dataset's delete_episodes rewrites the data with lerobot's own schema
    (float32 timestamps, tool calls as arrow.json strings): read as lerobot reads it."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lerobot.datasets.dataset_tools import delete_episodes
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    out = tmp_path / "deleted"
    delete_episodes(LeRobotDataset("l/src", root=annotated), [1], output_dir=out, repo_id="l/o")
    schema = pq.read_schema(next(out.glob("data/*/*.parquet")))
    row = schema.field("language_events").type.value_type
    assert isinstance(row.field("tool_calls").type.value_type, pa.BaseExtensionType)
    ours, theirs = LeRobotReader(out, image_dtype="uint8"), lerobot_dataset(out)
    assert len(theirs) == 17 and theirs[4]["language_events"][0]["tool_calls"]
    for i in range(len(theirs)):
        assert_same_item(ours[i], theirs[i], f"item {i}")
