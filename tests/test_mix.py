"""MixedDataset: weighted, seeded mixing of several datasets with exact per-source resume.

Resume checks compare the exact sequence of (source, index batch) of an interrupted-and-resumed
run with an uninterrupted one, batch boundaries included. Nothing is sorted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_example, run_script

from robo_resume import DatasetFormatError, ResumeStateError
from robo_resume.mix import MixedDataset, MixSource

A_LENGTHS = (23, 41, 17, 30, 9)  # v3.0, 120 frames
B_LENGTHS = (19, 27, 12, 33)  # v2.1, 91 frames
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def roots(factory):
    a = factory(episode_lengths=A_LENGTHS, num_cameras=0).root
    b = factory(version="v2.1", episode_lengths=B_LENGTHS, num_cameras=0).root
    return a, b


def make_mix(roots, weights=(1, 3), **kw):
    a, b = roots
    kw.setdefault("batch_size", 4)
    kw.setdefault("chunk_frames", 8)
    return MixedDataset([MixSource(a, weights[0]), MixSource(b, weights[1])], **kw)


def consume(make, *, num_workers, epochs=1, stop_after=None, loader_kwargs=None, **kw):
    """Run a loop; return [(source, indices)] and the tracker state at ``stop_after``.

    ``stop_after`` may be several batch counts (ascending): the loop stops after the last one
    and returns ``{count: state after that batch}`` (one interrupted run for several crash
    points; the state depends on the batches consumed up to then only, so a run stopped there
    saves the same).
    """
    mix = make(**kw)
    tracker = mix.tracker()
    loader = mix.dataloader(num_workers=num_workers, **(loader_kwargs or {}))
    points = [stop_after] if isinstance(stop_after, int) else list(stop_after or [])
    assert points == sorted(set(points)), points
    out, states = [], {}
    for _ in range(epochs):
        for batch in loader:
            batch = tracker.consume(batch)
            out.append((tracker.last_source, batch["index"].tolist()))
            if len(out) in points:
                states[len(out)] = json.loads(json.dumps(tracker.state_dict()))
            if points and len(out) == points[-1]:
                return out, states[len(out)] if isinstance(stop_after, int) else states
    return out, None


def assert_exact(full, before, after, what):
    got = before + after
    assert len(got) == len(full), f"{what}: {len(got)} batches, expected {len(full)}"
    for k, (a, b) in enumerate(zip(got, full, strict=True)):
        assert a == b, f"{what}: batch {k} is {a}, uninterrupted run had {b}"


def test_order_is_pure_deterministic_and_weighted(roots):
    mix = make_mix(roots, weights=(1, 3), seed=3)
    assert mix.period == 4 and mix.counts.tolist() == [1, 3]
    n = 400
    run1, _ = consume(lambda **k: make_mix(roots, seed=3, **k), num_workers=0, stop_after=n)
    run2, _ = consume(lambda **k: make_mix(roots, seed=3, **k), num_workers=0, stop_after=n)
    assert run1 == run2
    sources = [s for s, _ in run1]
    assert Counter(sources) == {0: 100, 1: 300}  # exact per round of 4 batches
    assert sources == [mix.source_at(0, 0, j) for j in range(n)]
    for j in (0, 1, 7, 250, 399):  # prefix counts are arithmetic
        assert mix.counts_before(0, 0, j).tolist() == [sources[:j].count(i) for i in (0, 1)]
    other, _ = consume(lambda **k: make_mix(roots, seed=4, **k), num_workers=0, stop_after=n)
    assert [s for s, _ in other] != sources
    # Non-integral weights: rounds of 100 batches, 30/70 in each; within 1% over any window.
    mix = make_mix(roots, weights=(0.3, 0.7), seed=1)
    assert mix.period == 100 and mix.counts.tolist() == [30, 70]
    seq = [mix.source_at(0, 1, j) for j in range(1000)]
    assert seq.count(0) == 300
    assert abs(seq[:550].count(0) / 550 - 0.3) < 0.01
    # Same order in another process (no hidden state, no hash randomisation).
    a, b = roots
    code = (
        "from robo_resume.mix import MixedDataset as M, MixSource as S;"
        f"m = M([S({str(a)!r}, 0.3), S({str(b)!r}, 0.7)], batch_size=4, seed=1);"
        "print([m.source_at(0, 1, j) for j in range(1000)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(seq)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_cycle_exact(roots, num_workers):
    kw = dict(seed=5, exhausted="cycle")

    def make(**extra):
        return make_mix(roots, **kw, **extra)

    total = 90  # source 1 (91 frames, 3/4 of the batches) cycles through ~2.5 epochs
    full, _ = consume(make, num_workers=num_workers, stop_after=total)
    run, states = consume(make, num_workers=num_workers, stop_after=(1, 7, 61))
    for s in (1, 7, 61):
        before, state = run[:s], states[s]
        assert sum(c[3] for c in state["mix"]) == s  # batches each mix stream gave
        after, _ = consume(make, num_workers=num_workers, stop_after=total - s, resume_state=state)
        assert_exact(full, before, after, f"cycle W={num_workers} s={s}")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_stop_exact_over_epochs(roots, num_workers):
    kw = dict(seed=2, exhausted="stop", drop_last=num_workers == 2)

    def make(**extra):
        return make_mix(roots, **kw, **extra)

    per_epoch = make().batches_per_epoch(num_workers)
    # persistent workers: each iter() is still the next mix epoch (and it saves worker starts)
    run = dict(num_workers=num_workers, loader_kwargs=dict(persistent_workers=num_workers > 0))
    full, _ = consume(make, epochs=2, **run)
    assert len(full) == 2 * per_epoch
    crashes = (per_epoch // 2 + 1, per_epoch, per_epoch + 3)
    interrupted, states = consume(make, epochs=2, stop_after=crashes, **run)
    for s in crashes:
        before, state = interrupted[:s], states[s]
        left = 2 - make().epochs_started(state, num_workers)
        after, _ = consume(make, epochs=left, resume_state=state, **run)
        assert_exact(full, before, after, f"stop W={num_workers} s={s}")


def test_state_records_each_source_position(roots):
    run, state = consume(lambda **k: make_mix(roots, seed=0, **k), num_workers=0, stop_after=9)
    frames = [sum(len(b) for s, b in run if s == i) for i in (0, 1)]
    assert (state["format"], state["kind"], state["version"]) == ("robo_resume.state", "mix", 4)
    assert state["mix"] == [[0, 0, 0, 9]]
    mix = make_mix(roots, seed=0)
    for i, src in enumerate(state["sources"]):
        assert src["format"] == "robo_resume.state"
        ((_, _, epoch, position),) = src["cursors"]
        q = mix.datasets[i].schedule(0).frames_per_stream
        assert epoch * q + position == frames[i]  # where this source stands, not a global count
        assert src["batches"] == sum(1 for s, _ in run if s == i)


def test_exhausted_stop_and_cycle(roots):
    # "stop": one mix epoch ends when the first source runs out; nothing repeats in it.
    mix = make_mix(roots, weights=(1, 3), seed=0, exhausted="stop")
    run, _ = consume(lambda **k: make_mix(roots, seed=0, exhausted="stop", **k), num_workers=0)
    per_source = {i: [x for s, b in run if s == i for x in b] for i in (0, 1)}
    assert sorted(per_source[1]) == list(range(sum(B_LENGTHS)))  # source 1 ran out: all of it
    assert len(set(per_source[0])) == len(per_source[0]) < sum(A_LENGTHS)
    assert len(run) == mix.batches_per_epoch(0)
    # the next iter() is the next mix epoch: every source starts its next epoch
    two, _ = consume(
        lambda **k: make_mix(roots, seed=0, exhausted="stop", **k), num_workers=0, epochs=2
    )
    assert two[: len(run)] == run and two[len(run) :] != run
    # "cycle": the exhausted source starts its next epoch (a new order), the mix goes on.
    run, _ = consume(lambda **k: make_mix(roots, seed=0, **k), num_workers=0, stop_after=80)
    b = [x for s, bt in run if s == 1 for x in bt]
    n = sum(B_LENGTHS)
    assert len(b) > 2 * n
    assert sorted(b[:n]) == sorted(b[n : 2 * n]) == list(range(n))
    assert b[:n] != b[n : 2 * n]
    with pytest.raises(ValueError, match=r"Unknown exhausted mode.*Expected cycle or stop"):
        make_mix(roots, exhausted="repeat")


def test_changed_weight_on_resume_is_refused(roots):
    _, state = consume(lambda **k: make_mix(roots, seed=0, **k), num_workers=0, stop_after=5)
    with pytest.raises(
        ResumeStateError,
        match=r"different 'weights'.*Expected weights=\[1\.0, 2\.0\] \(this mix\)"
        r".*Found weights=\[1\.0, 3\.0\] \(the state\).*Fix: resume with the weights",
    ):
        make_mix(roots, weights=(1, 2), seed=0, resume_state=state)
    with pytest.raises(ResumeStateError, match=r"different 'seed'"):
        make_mix(roots, seed=1, resume_state=state)
    with pytest.raises(ResumeStateError, match=r"made for a different 'plan'"):
        make_mix(roots, seed=0, chunk_frames=9, resume_state=state)  # a source's own check
    # another num_workers is an elastic resume (tests/test_mix_parity.py): a new mix epoch
    mix = make_mix(roots, seed=0, resume_state=state)
    assert [e for e, _, _ in mix.start_point(2)[1]] == [1, 1]
    with pytest.raises(ResumeStateError, match=r"state of one dataset, not of a MixedDataset"):
        make_mix(roots, resume_state=state["sources"][0])
    with pytest.raises(ResumeStateError, match=r"not a robo_resume mix state"):
        make_mix(roots, resume_state={"format": "x"})


def test_feature_mismatch_errors(roots, factory):
    a, b = roots
    wide = factory(episode_lengths=(9, 12), num_cameras=0, state_dim=6).root
    fast = factory(episode_lengths=(9, 12), num_cameras=0, fps=15).root
    cam = factory(episode_lengths=(9, 12), num_cameras=1, codec="h264", gop=250).root
    bs = dict(batch_size=4)
    with pytest.raises(
        DatasetFormatError,
        match=r"Feature 'observation.state' of source 1 .* has another shape.*"
        r"Expected shape \[4\] \(source 0\).*Found shape \[6\].*Fix: ",
    ):
        MixedDataset([MixSource(a), MixSource(wide)], batch_size=4)
    with pytest.raises(
        DatasetFormatError,
        match=r"source 1 .* has another fps.*Expected fps=10 \(source 0\).*Found fps=15.*Fix: ",
    ):
        MixedDataset([MixSource(a), MixSource(fast)], batch_size=4)
    with pytest.raises(
        DatasetFormatError,
        match=r"source 1 .* does not have the mix's features.*"
        r"Found extra \['observation.images.cam0'\].*Fix: map this source's names",
    ):
        MixedDataset([MixSource(a), MixSource(cam)], batch_size=4)
    with pytest.raises(
        DatasetFormatError,
        match=r"source 1 .* does not have the mix.s features.*"
        r"Found missing \['observation.images.cam0'\]",
    ):
        MixedDataset([MixSource(cam), MixSource(a)], batch_size=4)
    with pytest.raises(
        DatasetFormatError, match=r"names features it does not have.*Found \['observation.top'\]"
    ):
        MixedDataset([MixSource(a), MixSource(b, keys={"observation.top": "x"})], batch_size=4)
    with pytest.raises(DatasetFormatError, match=r"gives two features one name.*\['action'\]"):
        MixedDataset([MixSource(a), MixSource(b, keys={"observation.state": "action"})], **bs)
    # dropping the extra camera makes the layouts fit
    mix = MixedDataset(
        [MixSource(a), MixSource(cam, keys={"observation.images.cam0": None})], batch_size=4
    )
    assert mix.camera_keys == ()


def test_key_mapping_renames_cameras_v30_and_v21(factory):
    from robo_resume.testing import decode_frame_identity

    one = factory(episode_lengths=(9, 7), num_cameras=1, codec="h264", gop=250)
    two = factory(version="v2.1", episode_lengths=(8, 6), num_cameras=2, codec="h264", gop=250)
    top = "observation.images.top"
    mix = MixedDataset(
        [
            MixSource(one.root, keys={"observation.images.cam0": top}),
            MixSource(
                two.root,
                keys={"observation.images.cam1": top, "observation.images.cam0": None},
            ),
        ],
        batch_size=3,
        seed=1,
        delta_timestamps={top: [-0.1, 0.0]},
        image_dtype="uint8",
    )
    assert mix.camera_keys == (top,)
    tracker = mix.tracker()
    seen = set()
    for step, batch in enumerate(mix.dataloader(num_workers=0)):
        batch = tracker.consume(batch)
        assert sorted(batch) == sorted(
            ["observation.state", "action", top, f"{top}_is_pad", "timestamp", "frame_index",
             "episode_index", "index", "task_index", "task"]
        )  # fmt: skip
        ep, fr = batch["episode_index"][0].item(), batch["frame_index"][0].item()
        img = batch[top][0, 1]  # the current frame of the window
        assert decode_frame_identity(img) == (ep, fr, tracker.last_source)  # cam1 of source 1
        seen.add(tracker.last_source)
        if step == 12:
            break
    assert seen == {0, 1}


def _run(zygote, *args, ok=True):
    """``python ARGS`` forked from ``zygote`` (conftest.run_script): (code, stdout)."""
    code, out, err = run_script(zygote, *args, timeout=300)
    if ok:
        assert code == 0, out[-2000:] + err[-3000:]
    return code, out


def _steps(path):
    """{step: [(source, [index, ...]), ...]} from a consumed log (one entry per run of a step)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        step, source, *idx = map(int, line.split())
        out.setdefault(step, []).append((source, idx))
    return out


@pytest.mark.slow(8)
def test_mix_train_val_example_crash_and_resume(tmp_path, capsys, script_zygote):
    """The uninterrupted run in this process (the example's main), the crashed and the resumed
    run as ``python examples/mix_train_val.py`` (each forked from a zygote that imported torch
    and robo_resume, conftest.run_script): the resume starts from the files alone."""
    full, crash = tmp_path / "full", tmp_path / "crash"
    script = EXAMPLES / "mix_train_val.py"
    want_out = run_example("mix_train_val.py", "--workdir", full, capsys=capsys)
    code, out = _run(script_zygote, script, "--workdir", crash, "--stop-at-step", "10", ok=False)
    assert code == 1 and "crashing after step 10 (last checkpoint: step 8)" in out
    _, got_out = _run(script_zygote, script, "--workdir", crash, "--resume")
    want = {s: v[0] for s, v in _steps(full / "consumed.txt").items()}
    got = _steps(crash / "consumed.txt")
    assert {s: v[-1] for s, v in got.items()} == want  # what was trained equals the full run
    assert [len(got[s]) for s in (8, 9, 10, 11)] == [1, 2, 2, 1]  # steps 9, 10 ran twice
    assert {src for src, _ in want.values()} == {0, 1}  # both datasets in the mix

    # the same model after the resume: the same validation losses. To float32 rounding only:
    # once in a few dozen runs under load the last printed digit differed (102.80956 against
    # 102.80953) though the frames trained on were equal (checked above); another frame or
    # another order moves these losses by whole units.
    def losses(out):
        return [
            (line.split(":")[0], [float(v) for v in line.split("val loss ")[1].split(", ")])
            for line in out.splitlines()
            if "val loss" in line
        ]

    want_val, got_val = losses(want_out), losses(got_out)
    assert len(want_val) == 3 and [s for s, _ in got_val] == [s for s, _ in want_val[1:]]
    for (step, w), (_, g) in zip(want_val[1:], got_val, strict=True):
        assert g == pytest.approx(w, rel=1e-6), f"{step}: val loss {g} after resume, {w} in full"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mix_loader_len_counts_this_iterations_batches(roots, num_workers):
    kw = dict(seed=2, exhausted="stop", drop_last=num_workers == 2)
    mix = make_mix(roots, **kw)
    loader = mix.dataloader(num_workers=num_workers, persistent_workers=num_workers > 0)
    tracker = mix.tracker()
    per_epoch = mix.batches_per_epoch(num_workers)
    assert len(loader) == per_epoch
    seen = 0
    for batch in loader:
        tracker.consume(batch)
        seen += 1
        if seen == 3:  # 3 % 2 workers != 0: the resume rotates roles
            state = json.loads(json.dumps(tracker.state_dict()))
    assert seen == per_epoch and len(loader) == per_epoch == sum(1 for _ in loader)
    resumed = make_mix(roots, **kw, resume_state=state).dataloader(num_workers=num_workers)
    assert len(resumed) == per_epoch - 3 == sum(1 for _ in resumed)
    with pytest.raises(TypeError, match=r"cycling mix's loader has no len\(\)"):
        len(make_mix(roots, seed=2).dataloader(num_workers=num_workers))
