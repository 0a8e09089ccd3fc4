"""``robo-resume train --stream.*``: how its streams order frames, new runs and resumes.

A new run gets the library's default, the shuffle order; a checkpoint resumes with the order it
was saved with (one written before the flags existed: ``interleave=4``, random; one written
before ``--stream.order`` existed: the interleave order of its flags), recorded in
``training_state/robo_resume/options.json``. The whole command with the new default (kill,
resume, bit-identical weights) is tests/test_lerobot_train.py; here ``build_dataset`` (what the
command builds its data from) runs in this process with lerobot's own delta-timestamp logic.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from robo_resume.errors import ResumeStateError
from robo_resume.lerobot_train import StreamOptions, TrainSetupError, main, split_stream_args
from robo_resume.lerobot_train.options import (
    LEGACY_STREAM,
    resolve_stream,
    split_args,
    stream_line,
)
from robo_resume.testing import make_dataset


def test_stream_flags_are_split_from_the_rest():
    argv = ["--policy.type=act", "--stream.interleave=16", "--mix.roots=a,b"]
    argv += ["--stream.interleave_order", "rounds", "--batch_size=8"]
    stream, rest = split_stream_args(argv)
    assert stream == StreamOptions(16, "rounds")
    assert rest == ["--policy.type=act", "--mix.roots=a,b", "--batch_size=8"]
    mix, lerobot = split_args(rest)  # then the --mix.* flags, as main() does
    assert mix is not None and mix.roots == ("a", "b")
    assert lerobot == ["--policy.type=act", "--batch_size=8"]
    assert split_stream_args(["--batch_size=8"]) == (None, ["--batch_size=8"])


@pytest.mark.parametrize(
    "flag, words",
    [
        ("--stream.interleve=8", ["Unknown flag --stream.interleve", "--stream.interleave or"]),
        ("--stream.interleave=many", ["must be a whole number", "many", "--stream.interleave=32"]),
        ("--stream.interleave=0", ["at least 1", "Found 0"]),
        ("--stream.interleave_order=shuffled", ["Unknown --stream.interleave_order", "spread"]),
        ("--stream.interleave", ["--stream.interleave needs a value"]),
        ("--stream.order=uniform", ["Unknown --stream.order", "--stream.order=shuffle"]),
        ("--stream.shuffle_frames=0", ["--stream.shuffle_frames must be at least 1"]),
        ("--stream.shuffle_frames=lots", ["must be a whole number", "=1024"]),
    ],
)
def test_bad_stream_flags_get_clear_errors(flag, words, capsys):
    """Refused before lerobot is imported, exit code 2, the message naming flag and fix."""
    assert main(["--policy.type=act", flag]) == 2
    text = capsys.readouterr().err
    for w in words:
        assert w in text, text


def test_resolve_stream_new_runs_resumes_and_flags():
    # a new run (or a plain lerobot checkpoint, whose data starts anew): the shuffle order
    assert resolve_stream(None, None, 8) == {"order": "shuffle", "shuffle_frames": 1024}
    assert "shuffle windows of 1024 frames" in stream_line(resolve_stream(None, None, 8))
    # flags replace what they name; an interleave flag alone chooses the interleave order
    assert resolve_stream(StreamOptions(shuffle_frames=256), None, 8) == {
        "order": "shuffle",
        "shuffle_frames": 256,
    }
    assert resolve_stream(StreamOptions(interleave=4), None, 8) == {
        "order": "interleave",
        "interleave": 4,
    }
    assert resolve_stream(StreamOptions(4, "random"), None, 8) == LEGACY_STREAM
    assert "measurably worse" in stream_line(LEGACY_STREAM)
    # a checkpoint keeps its run's values, whatever the batch size now (elastic resume)
    saved = {"mix": None, "stream": {"order": "shuffle", "shuffle_frames": 512}}
    assert resolve_stream(None, saved, 64) == {"order": "shuffle", "shuffle_frames": 512}
    # one written before --stream.order: the interleave order of its flags
    saved = {"mix": None, "stream": {"interleave": 8, "interleave_order": "spread"}}
    assert resolve_stream(None, saved, 64) == {
        "interleave": 8,
        "interleave_order": "spread",
        "order": "interleave",
    }
    # a checkpoint written before --stream.* existed: the library's defaults it was saved with
    assert resolve_stream(None, {"mix": None, "library": "0.1.0"}, 8) == LEGACY_STREAM
    assert LEGACY_STREAM == {"order": "interleave", "interleave": 4, "interleave_order": "random"}


@pytest.fixture(scope="module")
def lerobot_parts(tmp_path_factory):
    """A factory dataset, its lerobot metadata and a minimal training config for it (ACT)."""
    from lerobot.datasets import LeRobotDatasetMetadata
    from lerobot.policies.act.configuration_act import ACTConfig

    root = make_dataset(
        tmp_path_factory.mktemp("stream") / "a",
        episode_lengths=(40, 25, 33, 30, 36, 28, 31, 35),
        num_cameras=1,
        height=48,
        width=64,
    ).root
    meta = LeRobotDatasetMetadata("local/a", root=root)
    policy = ACTConfig(
        pretrained_backbone_weights=None, device="cpu", chunk_size=5, n_action_steps=5
    )

    def cfg(batch_size: int):
        dataset = SimpleNamespace(
            root=str(root),
            repo_id="local/a",
            revision=None,
            episodes=None,
            image_transforms=SimpleNamespace(enable=False),
        )
        return SimpleNamespace(
            trainable_config=policy, batch_size=batch_size, seed=3, dataset=dataset
        )

    return cfg, meta


def _distinct_episodes(ds, batches: int) -> float:
    it = iter(ds.dataloader(num_workers=0))
    return float(np.mean([len(set(next(it)["episode_index"].tolist())) for _ in range(batches)]))


def test_a_new_run_streams_the_shuffle_order_and_a_legacy_checkpoint_its_own(lerobot_parts):
    """build_dataset with the resolved options: a new run's batches mix about as many
    episodes as the batch has frames allow; the interleave order gives fewer. A state saved
    with one order resumes with it and is refused with the other, naming the order and where
    the run's values are."""
    from robo_resume.lerobot_train.setup import build_dataset

    cfg, meta = lerobot_parts
    new = resolve_stream(None, None, 8)
    ds, note = build_dataset(cfg(8), None, meta, None, None, None, new)
    assert note is None
    assert ds.tuning.resolved_order == "shuffle" and ds.chunk_frames == 2
    legacy, _ = build_dataset(cfg(8), None, meta, None, None, None, LEGACY_STREAM)
    assert (legacy.tuning.interleave, legacy.tuning.interleave_order) == (4, "random")
    assert legacy.tuning.resolved_order == "interleave" and legacy.chunk_frames == 64
    shuffled, random_ = _distinct_episodes(ds, 12), _distinct_episodes(legacy, 12)
    assert shuffled > random_ + 1, (shuffled, random_)  # 8 episodes, batches of 8 frames

    # a checkpoint of a legacy run: its options have no "stream"; it resumes as it was saved
    tracker = legacy.tracker()
    it = iter(legacy.dataloader(num_workers=0))
    for _ in range(3):
        tracker.consume(next(it))
    state = tracker.state_dict()
    old_options = {"mix": None, "library": "0.1.0"}
    again, _ = build_dataset(
        cfg(8), None, meta, state, None, None, resolve_stream(None, old_options, 8)
    )
    assert again.tuning.interleave_order == "random"
    assert again.tuning.resolved_order == "interleave"
    # the same state with the new run's order: refused, saying what differs and where to look
    with pytest.raises(ResumeStateError) as err:
        build_dataset(cfg(8), None, meta, state, None, None, new)
    text = str(err.value)
    assert "order shuffle (1024 frames a window) vs interleave (4 open chunks)" in text, text
    assert "a run on the same dataset with another --stream.order" in text, text
    assert "StreamTuning(" not in text, text  # robo-resume train's words: its flags
    assert "options.json" in text and "used when no --stream.* flag is given" in text, text


def test_stream_options_validate_their_values():
    with pytest.raises(TrainSetupError, match="at least 1"):
        StreamOptions(interleave=0)
    with pytest.raises(TrainSetupError, match=r"Unknown --stream\.interleave_order"):
        StreamOptions(interleave_order="zigzag")
    assert StreamOptions(interleave=16).given() == {"interleave": 16}
    with pytest.raises(TrainSetupError, match=r"Unknown --stream\.order"):
        StreamOptions(order="zigzag")
