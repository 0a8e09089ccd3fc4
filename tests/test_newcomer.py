"""Issue 17: missing files handled the same way everywhere, plots, inspect, refusals, len, mixes."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections import Counter

import numpy as np
import pytest

from robo_resume import ChunkedEpisodeDataset, load_metadata
from robo_resume.cli import main
from robo_resume.files import check_files, readable_episodes
from robo_resume.splits import Split

LENGTHS = (12, 9, 14, 10, 11, 13)
MISSING_VIDEO, CUT_DATA = 1, 3  # episode whose mp4 is deleted, episode whose parquet is cut


@pytest.fixture(scope="module")
def clean_root(factory):
    return factory(
        episode_lengths=LENGTHS, num_cameras=1, codec="mpeg4", gop=4, episodes_per_file=1
    ).root


@pytest.fixture(scope="module")
def broken(clean_root, tmp_path_factory):
    """A copy of ``clean_root`` with one mp4 deleted and one parquet cut in half."""
    root = tmp_path_factory.mktemp("broken") / "ds"
    shutil.copytree(clean_root, root)
    meta = load_metadata(root)
    video = root / next(iter(meta.episode(MISSING_VIDEO).videos.values())).path
    video.unlink()
    data = root / meta.episode(CUT_DATA).data_path
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return root


def test_check_files_names_missing_and_unreadable_files(broken):
    result = check_files(broken)
    assert result.files_checked == 2 * len(LENGTHS)  # one parquet and one mp4 per episode
    by_kind = {(p.kind, p.problem): p for p in result.problems}
    assert set(by_kind) == {("video", "missing"), ("data", "unreadable")}
    assert by_kind["video", "missing"].episodes == (MISSING_VIDEO,)
    assert by_kind["video", "missing"].error.startswith("MissingFileError: A video file is missing")
    assert by_kind["data", "unreadable"].episodes == (CUT_DATA,)
    assert "CorruptFileError" in by_kind["data", "unreadable"].error
    good = tuple(e for e in range(len(LENGTHS)) if e not in (MISSING_VIDEO, CUT_DATA))
    assert result.readable == readable_episodes(broken) == good
    assert result.unreadable_episodes == (MISSING_VIDEO, CUT_DATA)
    assert result.summary() == (
        "4 of 6 episodes readable; 1 missing and 1 unreadable file(s) of 12 checked"
    )
    assert readable_episodes(broken, episodes=[0, 1, 2]) == (0, 2)


def test_readable_episodes_as_selection_and_inside_split(broken, clean_root):
    readable = readable_episodes(broken)
    ds = ChunkedEpisodeDataset(broken, batch_size=4, episodes=readable)
    assert ds.episodes == readable
    parts = [
        ChunkedEpisodeDataset(
            broken, batch_size=4, episodes=Split((0.5, 0.5), index=i, seed=3, among=readable)
        ).episodes
        for i in (0, 1)
    ]
    assert sorted(parts[0] + parts[1]) == list(readable) and not set(parts[0]) & set(parts[1])
    # without among=, a seeded split of all episodes holds an unreadable one (seed 3)
    plain = Split((0.5, 0.5), index=0, seed=3).select(range(len(LENGTHS)))
    assert set(plain) & {MISSING_VIDEO, CUT_DATA}
    with pytest.raises(
        ValueError,
        match=r"among= names episodes the dataset does not have.*"
        r"Found 40-41",
    ):
        ChunkedEpisodeDataset(broken, batch_size=4, episodes=Split((0.5, 0.5), among=[0, 40, 41]))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "DataLoader worker" not in err, err
    return err


@pytest.mark.timeout(400)
def test_cli_missing_file_is_one_line_error_then_episodes_or_on_error(broken, capsys):
    args = ["bench", str(broken), "--batches", "50", "--batch-size", "4", "--num-workers", "1"]
    assert main(args) == 2
    err = _one_line_error(capsys)
    assert re.match(r"error: (A video file is missing|A data file is not a readable parquet)", err)
    assert "--on-error skip (or --episodes readable)" in err
    args[-1] = "0"  # the rest in the main process (the machine is shared)
    assert main([*args, "--episodes", "readable", "--json"]) == 0
    good = sum(n for e, n in enumerate(LENGTHS) if e not in (MISSING_VIDEO, CUT_DATA))
    assert json.loads(capsys.readouterr().out)["frames"] == good
    assert main([*args, "--on-error", "skip", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == good
    assert main([*args, "--episodes", "0,2-3"]) == 2  # episode 3's parquet is cut
    assert "episode 3" in _one_line_error(capsys)
    assert main([*args, "--episodes", "0-x"]) == 2
    assert "--episodes is not an episode selection" in _one_line_error(capsys)


@pytest.mark.timeout(400)
def test_cli_verify_and_plan_take_episodes_and_on_error(broken, capsys):
    base = ["--batch-size", "4", "--chunk-frames", "8", "--num-workers", "0"]
    assert main(["verify", str(broken), "--crash-at", "2", *base]) == 2
    _one_line_error(capsys)
    assert main(["verify", str(broken), "--crash-at", "2", "--on-error", "skip", *base]) == 0
    assert "robo_resume: exactly once" in capsys.readouterr().out
    plan_args = ["plan", str(broken), "--step", "1", "--episodes", "readable", "--json", *base]
    assert main(plan_args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {s["episode"] for s in plan["streams"]} <= {0, 2, 4, 5}


@pytest.mark.parametrize("command", ["demo", "verify", "bench"])
def test_data_commands_have_episodes_and_on_error(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "--episodes" in out and "--on-error {raise,skip}" in out and "readable" in out


@pytest.mark.timeout(400)
def test_skip_warnings_one_line_per_file_and_a_summary_per_pass(broken, caplog):
    ds = ChunkedEpisodeDataset(broken, batch_size=4, chunk_frames=4, seed=1, on_error="skip")
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=1)
    caplog.set_level(logging.WARNING, logger="robo_resume")
    for _ in range(2):
        for batch in loader:
            tracker.consume(batch)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    per_file = [m for m in lines if m.startswith("robo_resume: skipping the frames of")]
    summaries = [m for m in lines if m.startswith("robo_resume: this pass skipped")]
    assert len(lines) == len(per_file) + len(summaries)
    assert len(per_file) == 2 * 2  # two broken files, two passes
    assert all(len(m) < 300 for m in per_file), per_file
    assert sorted(re.search(r"of \S+\.(\w+) \(", m).group(1) for m in per_file) == [
        "mp4",
        "mp4",
        "parquet",
        "parquet",
    ]
    chunks_per_pass = len(tracker.skipped) // 2
    assert chunks_per_pass > 2  # several chunks per broken file, yet one line per file
    frames = LENGTHS[MISSING_VIDEO] + LENGTHS[CUT_DATA]
    assert (
        summaries
        == [
            f"robo_resume: this pass skipped {chunks_per_pass} chunk(s), {frames} frames of "
            "episode(s) 1,3, in 2 missing or unreadable file(s) (on_error='skip'); "
            "CursorTracker.skip_report() lists them, robo_resume.files.readable_episodes(root) "
            "selects the episodes without them"
        ]
        * 2
    )
    assert Counter(r["episode"] for r in tracker.skipped).keys() == {1, 3}


@pytest.mark.slow(17)
@pytest.mark.timeout(400)
def test_cli_demo_on_a_dataset_with_missing_files(broken, tmp_path, capsys):
    args = ["demo", "--root", str(broken), "--out", str(tmp_path), "--epochs", "1"]
    args += ["--batch-size", "4", "--checkpoint-every", "3", "--kill-seed", "1", "--num-workers"]
    assert main([*args, "1", "--episodes", "readable", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == [0, 2, 4, 5] and report["ok"] is True
    assert (report["frames_replayed"], report["frames_lost"]) == (0, 0)


@pytest.mark.timeout(300)
def test_loader_len_is_this_iterations_batches(factory):
    root = factory(episode_lengths=(23, 41, 17, 30, 9), num_cameras=0).root

    def make(**kw):
        return ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8, seed=2, **kw)

    ds = make()
    loader = ds.dataloader(num_workers=2, persistent_workers=True)
    tracker = ds.tracker()
    per_epoch = ds.batches_per_epoch(2)
    assert len(loader) == per_epoch
    seen = 0
    for batch in loader:
        assert len(loader) == per_epoch  # stable during the iteration
        tracker.consume(batch)
        seen += 1
        if seen == 5:  # 5 % 2 workers != 0: the resume rotates roles
            state = tracker.state_dict()
    assert seen == per_epoch and len(loader) == per_epoch  # the next epoch is whole too
    assert sum(1 for _ in loader) == per_epoch
    resumed = make(resume_state=state).dataloader(num_workers=2)
    assert len(resumed) == per_epoch - 5 == sum(1 for _ in resumed)
    elastic = make(resume_state=state).dataloader(num_workers=1)  # remainder epoch
    assert len(elastic) == sum(1 for _ in elastic) > 0
    stepped = make(resume_step=3 * 4).dataloader(num_workers=0)
    assert len(stepped) == per_epoch - 3 == sum(1 for _ in stepped)
    endless = make(infinite=True)
    with pytest.raises(
        TypeError,
        match=r"infinite ChunkedEpisodeDataset's loader has no len.*"
        rf"batches_per_epoch\(num_workers\) \({per_epoch} here\)",
    ):
        len(endless.dataloader(num_workers=2))


def test_inspect_compares_codecs_not_decoders_and_lists_missing_data(factory, tmp_path, capsys):
    src = factory(episode_lengths=(8, 6, 7), codec="av1", episodes_per_file=1).root
    assert main(["inspect", str(src), "--json"]) == 0
    cam = json.loads(capsys.readouterr().out)["cameras"]["observation.images.cam0"]
    assert cam["declared_codec"] == "av1" and cam["agrees"] is True
    assert cam["container"]["codec"] == "av1" and cam["container"]["decoder"] == "libdav1d"
    assert main(["inspect", str(src)]) == 0
    out = capsys.readouterr().out
    assert "camera observation.images.cam0: av1 64x48, keyframe every 2 frames; decoder " in out
    assert "info.json says" not in out
    # published without data/ (meta/ and videos/ only): every missing parquet is reported
    root = tmp_path / "ds"
    shutil.copytree(src, root)
    shutil.rmtree(root / "data")
    assert main(["inspect", str(root), "--json"]) == 1
    info = json.loads(capsys.readouterr().out)
    assert len(info["missing_files"]) == 3 and info["readable_episodes"] == 0
    assert all(p.startswith("data/") and p.endswith(".parquet") for p in info["missing_files"])
    assert main(["inspect", str(root)]) == 1
    assert "missing files: 3 (3 data): data/" in capsys.readouterr().out


def test_plot_marks_every_lost_frame_and_labels_excluded_episodes(tmp_path):
    from matplotlib.image import imread

    from robo_resume.plot import (
        EXCLUDED,
        LOST,
        ONCE,
        REPLAYED,
        TAIL,
        Panel,
        consumption_grid,
        plot_consumption,
    )

    n = 5700
    full = Counter(range(100, n))  # frames 0..99: an excluded episode
    cursor = Counter(range(100, n))
    naive = Counter(range(100, n))
    for i in (200, 3000, 3001, 5600):  # 4 lost frames among 5,700
        del naive[i]
    naive[4000] += 1
    panel = Panel("crash at step 40", full, {"cursor": cursor, "naive": naive})
    grid = consumption_grid(panel, n, excluded=[(0, 100)])
    assert (grid[0] == ONCE).sum() == n - 100 and (grid[:, :100] == EXCLUDED).all()
    assert np.flatnonzero(grid[1] == LOST).tolist() == [200, 3000, 3001, 5600]
    assert np.flatnonzero(grid[1] == REPLAYED).tolist() == [4000]
    assert (consumption_grid(panel, n) == TAIL)[:, :100].all()  # not excluded: the tail

    def red_pixels(path):
        img = imread(path)[..., :3]
        return int((np.abs(img - np.array([0xD6, 0x27, 0x28]) / 255).max(axis=2) < 0.05).sum())

    lost = Panel("crash at step 150", full, {"cursor": cursor, "naive": naive})
    fig = plot_consumption(tmp_path / "two.png", [panel, lost], num_frames=n, excluded=[(0, 100)])
    assert [ax.get_title() for ax in fig.axes] == ["crash at step 40", "crash at step 150"]
    ok = Panel("crash at step 40", full, {"cursor": cursor, "naive": cursor})
    plot_consumption(tmp_path / "ok.png", [ok], num_frames=n)
    plot_consumption(tmp_path / "lost.png", [Panel("x", full, {"naive": naive})], num_frames=n)
    # the legend patch is red in both; only the lost frames' markers add red pixels
    assert red_pixels(tmp_path / "lost.png") > red_pixels(tmp_path / "ok.png") + 4 * 20


@pytest.mark.timeout(300)
def test_cli_verify_plot_has_a_panel_per_crash_step(factory, tmp_path, capsys):
    root = factory(episode_lengths=(23, 41, 17, 30, 9), num_cameras=0).root
    png = tmp_path / "overlap.png"
    args = ["verify", str(root), "--crash-at", "2,5", "--batch-size", "4", "--num-workers", "0"]
    assert main([*args, "--episodes", "0-3", "--plot", str(png), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plot_panels"] == ["crash at step 2", "crash at step 5"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mix_reports_every_feature_mismatch_in_one_error(factory):
    from robo_resume.errors import DatasetFormatError
    from robo_resume.mix import MixedDataset, MixSource

    a = factory(episode_lengths=(9, 12), num_cameras=0).root
    odd = factory(episode_lengths=(9, 12), num_cameras=0, fps=15, state_dim=6, action_dim=5).root
    with pytest.raises(DatasetFormatError) as e:
        MixedDataset([MixSource(a), MixSource(odd)], batch_size=4)
    msg = str(e.value)
    assert msg.startswith("The mix's sources differ from source 0 in 3 ways.")
    assert re.search(
        r"\(1\) source 1 .* has another fps.*Found fps=15.*"
        r"\(2\) Feature 'observation\.state' of source 1 .*Found shape \[6\].*"
        r"\(3\) Feature 'action' of source 1 .*Expected shape \[3\] \(source 0\)\. Found shape "
        r"\[5\].*Fix: fix each of them",
        msg,
    ), msg


def test_refused_resume_says_what_differs_in_words_and_the_option(factory, caplog):
    from robo_resume.errors import ResumeStateError

    root = factory(episode_lengths=(10, 12, 9, 11, 8, 7, 13, 10, 9, 12), num_cameras=0).root
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=0, episodes=range(10))
    tracker = ds.tracker()
    tracker.consume(next(iter(ds.dataloader())))
    state = tracker.state_dict()
    with pytest.raises(
        ResumeStateError,
        match=r"different 'episodes' \(this dataset vs the state: episodes 0-7 vs 0-9; plan "
        r"\(chunk_frames 1 in both; it follows from the other differences\); seed 3 vs 0; "
        r"total_frames 80 vs 101\).*pass resume_strict=False to ChunkedEpisodeDataset",
    ):
        ChunkedEpisodeDataset(root, batch_size=4, seed=3, episodes=range(8), resume_state=state)
    with pytest.raises(
        ResumeStateError,
        match=r"\(this dataset vs the state: plan chunk_frames"
        r" 5 vs chunk_frames 1\)",
    ):
        ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=5, resume_state=state)
    caplog.set_level(logging.WARNING, logger="robo_resume")
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=3, resume_state=state, resume_strict=False)
    assert "seed 3 vs 0" in caplog.text and ds.seed == 3
    old = {**state, "fingerprint": {k: v for k, v in state["fingerprint"].items() if k != "about"}}
    with pytest.raises(ResumeStateError, match=r"episodes 0-7 vs \(not recorded\)"):  # older states
        ChunkedEpisodeDataset(root, batch_size=4, episodes=range(8), resume_state=old)
