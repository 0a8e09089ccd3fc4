"""``robo-resume train``'s ``--data.*`` flags, ``--mix.features`` and its reading of
``--dataset.episodes``: parsing, refusals and the library's advice turned into flags.

All of it runs before lerobot is imported (``main`` returns 2 with the message); the runs that
use the flags are in tests/test_lerobot_train.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import robo_resume
from robo_resume.lerobot_train import DataOptions, main, split_data_args
from robo_resume.lerobot_train.data_flags import PYTHON_ADVICE, cli_advice, parse_episodes
from robo_resume.lerobot_train.options import split_args


def test_data_flags_are_split_from_the_rest():
    argv = ["--policy.type=act", "--data.on_error=skip", "--dataset.root", "/d"]
    argv += ["--data.resume_strict", "false", '--data.features={"actions": "action", "x": null}']
    argv += ["--dataset.episodes=readable", "--batch_size=8"]
    data, rest = split_data_args(argv)
    assert data == DataOptions(
        on_error="skip",
        resume_strict=False,
        features={"actions": "action", "x": None},
        episodes="readable",
    )
    assert data.readable
    assert rest == ["--policy.type=act", "--dataset.root", "/d", "--batch_size=8"]
    assert split_data_args(["--batch_size=8"]) == (DataOptions(), ["--batch_size=8"])


@pytest.mark.parametrize(
    "text, selection, indices",
    [
        ("readable", "readable", None),
        ("[0,1,2]", None, [0, 1, 2]),  # lerobot's own form
        ("[ 3, 1 ]", None, [3, 1]),
        ("0-2,5", None, [0, 1, 2, 5]),
        ("7", None, [7]),
        ("train[:90%]", "train[:90%]", None),
    ],
)
def test_dataset_episodes_takes_lerobots_lists_ranges_slices_and_readable(text, selection, indices):
    assert parse_episodes(text) == (selection, indices)
    data, rest = split_data_args([f"--dataset.episodes={text}", "--steps=2"])
    assert data.episodes == selection
    # indices go on to lerobot's parser (train_config.json keeps them), in its list form
    expected = [] if indices is None else [f"--dataset.episodes=[{','.join(map(str, indices))}]"]
    assert rest == ["--steps=2", *expected]


@pytest.mark.parametrize(
    "flag, words",
    [
        ("--data.on_error=maybe", ["Unknown --data.on_error", "raise or skip", "maybe"]),
        ("--data.resume_strict=perhaps", ["takes true or false", "--data.resume_strict=false"]),
        ("--data.features={actions: action}", ["--data.features is not valid JSON", "Fix:"]),
        ('--data.features=["actions"]', ["maps feature keys to new names", '["actions"]']),
        ('--data.features={"a": 3}', ["maps feature keys to new names"]),
        ("--data.feature={}", ["Unknown flag --data.feature", "--data.features"]),
        ("--data.on_error", ["--data.on_error needs a value"]),
        ("--dataset.episodes=some", ["not an episode selection", "--dataset.episodes=readable"]),
        ("--dataset.episodes=[0,-1]", ["not an episode selection", "[0,-1]"]),
        ("--mix.roots=a,b", None),  # fine alone: the next one is the refusal
        ("--mix.features=[{}]", ["--mix.features needs one mapping per source", "2 objects"]),
    ],
)
def test_bad_data_flags_get_clear_errors(flag, words, capsys):
    """Refused before lerobot is imported, exit code 2, the message naming flag and fix."""
    argv = ["--policy.type=act", flag]
    if flag.startswith("--mix.features"):
        argv.append("--mix.roots=a,b")
    if words is None:
        mix, _ = split_args(argv)
        assert mix is not None and mix.features == ()
        return
    assert main(argv) == 2
    text = capsys.readouterr().err
    for w in words:
        assert w in text, text


def test_mix_features_one_mapping_per_source_kept_by_the_checkpoint_options():
    mix, rest = split_args(
        ["--mix.roots=a,b", '--mix.features=[{"actions": "action"}, null]', "--steps=1"]
    )
    assert rest == ["--steps=1"]
    assert mix.features == ({"actions": "action"}, {})
    assert [s["features"] for s in mix.sources()] == [{"actions": "action"}, {}]
    again = type(mix).from_dict(mix.to_dict())  # what options.json holds
    assert again == mix
    # options.json of a checkpoint written before --mix.features: no mapping
    old = type(mix).from_dict({"roots": ["a", "b"], "repo_ids": [], "weights": []})
    assert old.features == () and [s["features"] for s in old.sources()] == [{}, {}]


def _fix_texts() -> list[tuple[str, str]]:
    """(file, text) of every ``fix=`` given to a call in robo_resume's library code, and of the
    module-level fix tables (``FIX``, ``FIX_DEFAULT``, ``ESCAPE``), with f-string parts as
    written."""
    out = []
    package = Path(robo_resume.__file__).parent
    for path in sorted(package.rglob("*.py")):
        if path.parent.name in ("lerobot_train", "cli"):
            continue  # the command's own messages
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.keyword) and node.arg == "fix":
                values.append(node.value)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("FIX", "FIX_DEFAULT", "ESCAPE")
                for t in node.targets
            ):
                value = node.value
                values.extend(value.values if isinstance(value, ast.Dict) else [value])
            for v in values:
                parts = [c.value for c in ast.walk(v) if isinstance(c, ast.Constant)]
                text = "".join(p for p in parts if isinstance(p, str))
                if text:
                    out.append((str(path.relative_to(package)), text))
    return out


def test_python_advice_of_the_library_becomes_flags_under_train():
    """Every fix the library words in Python (``on_error='skip'``, ``episodes=[...]``,
    ``resume_strict=False``, ``MixSource(keys=...)``, ...) reads as a flag once
    :func:`cli_advice` rewrote it; a new message with Python advice fails here until the
    rewrite knows it."""
    texts = _fix_texts()
    assert len(texts) > 50  # the scan found the messages
    advised = [(f, t) for f, t in texts if any(p in t for p in PYTHON_ADVICE)]
    assert len(advised) >= 8, advised
    rewritten = [(f, cli_advice(t)) for f, t in advised]
    left = [(f, t) for f, t in rewritten if any(p in t for p in PYTHON_ADVICE)]
    assert not left, left
    # and a message of a worker that met a missing file (stream/blocks.py adds the fix)
    text = cli_advice(
        "A video file is missing. Fix: download the dataset's videos again, or select only "
        "episodes whose videos exist with episodes=[...]. Raised while streaming chunk 3. To "
        "train on without the chunks whose files fail, pass on_error='skip' (skips are logged "
        "and kept in the resume state)."
    )
    assert "--dataset.episodes=readable" in text and "--data.on_error=skip" in text, text
    assert "on_error='skip'" not in text and "episodes=[...]" not in text
    # the library keeps its Python advice for library users
    from robo_resume.state.fingerprint import ESCAPE

    assert "resume_strict=False" in ESCAPE
    assert "--data.resume_strict=false" in cli_advice(ESCAPE)


def test_a_resume_keeps_the_checkpoints_data_flags_unless_given():
    from robo_resume.lerobot_train.data_flags import DataOptions, split_data_args

    saved = {"on_error": "skip", "features": {"actions": "action"}}
    none, _ = split_data_args(["--steps=2"])
    kept, notes = none.resumed(saved)
    assert (kept.on_error, kept.features, notes) == ("skip", {"actions": "action"}, [])
    given, _ = split_data_args(["--data.on_error=raise"])
    kept, notes = given.resumed(saved)
    assert (kept.on_error, kept.features) == ("raise", {"actions": "action"})
    assert notes == ['--data.on_error="raise" overrides the checkpoint\'s "skip"']
    # a checkpoint written before the flags were kept: the flags as given
    assert DataOptions(on_error="skip").resumed(None) == (DataOptions(on_error="skip"), [])
    # resume_strict is never taken from a checkpoint
    assert "resume_strict" not in DataOptions().to_saved()


def test_other_library_errors_leaving_train_get_the_flags_as_a_note(tmp_path):
    """A library ValueError (not a RoboResumeError) keeps its traceback and gains a note with
    its Python advice as flags."""
    from robo_resume import ChunkedEpisodeDataset, make_dataset
    from robo_resume.lerobot_train import add_flag_advice

    root = make_dataset(tmp_path / "d", episode_lengths=(6,)).root
    ds = ChunkedEpisodeDataset(root, batch_size=2, on_error="skip")
    with pytest.raises(ValueError) as info:
        iter(ds)
    assert "on_error='skip'" in str(info.value)
    add_flag_advice(info.value)
    (note,) = info.value.__notes__
    assert note.startswith("robo-resume train: ") and "--data.on_error=skip" in note
    assert "on_error='skip'" not in note
    plain = ValueError("nothing to rewrite")
    add_flag_advice(plain)
    assert not getattr(plain, "__notes__", None)
