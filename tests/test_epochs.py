"""Epoch counting after any resume: ``for epoch in loader.epochs(n): for batch in loader``.

The loop of every example trains exactly ``n`` epochs whatever the checkpoint: 0-3 workers
before and after (elastic resume when they differ), a checkpoint inside an epoch, at its last
batch, just after the boundary, or at the end of the run. Frames are counted per epoch exactly
(a multiset per epoch label, and the label the loop was given must be the batches' epoch).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import run_script

from robo_resume import CURSOR_KEY, ChunkedEpisodeDataset
from robo_resume.audit import epochs_started
from robo_resume.mix import MixedDataset, MixSource

LENGTHS = (37, 29, 41, 21)  # 128 frames, the size of the issue's synthetic dataset
B = 8
EPOCHS = 2
WORKERS = (0, 1, 2, 3)
POSITIONS = ("inside", "last_batch", "after_boundary", "run_end")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def root(factory):
    return factory(episode_lengths=LENGTHS, num_cameras=0).root


def make(root, **kw):
    return ChunkedEpisodeDataset(root, batch_size=B, chunk_frames=16, **kw)


def train(ds, num_workers, epochs=EPOCHS, save_at=()):
    """The examples' loop. Returns [(epoch given, batch's epoch, index list)], {step: state}."""
    loader = ds.dataloader(num_workers=num_workers, persistent_workers=num_workers > 0)
    tracker = ds.tracker()
    out, states = [], {}
    for epoch in loader.epochs(epochs):
        for batch in loader:
            got = int(batch[CURSOR_KEY][0, 3])
            batch = tracker.consume(batch)
            out.append((epoch, got, batch["index"].tolist()))
            if len(out) in save_at:
                states[len(out)] = tracker.state_dict()
    return out, states


def epoch_frames(root, num_workers, epoch):
    sched = make(root).schedule(num_workers)
    return Counter(
        i for s in range(sched.topology.num_streams) for i in sched.frame_indices(epoch, s)
    )


def checkpoint_step(root, num_workers, where):
    per_epoch = make(root).batches_per_epoch(num_workers)
    return {
        "inside": round(0.7 * per_epoch),
        "last_batch": per_epoch,
        "after_boundary": per_epoch + 1,
        "run_end": EPOCHS * per_epoch,
    }[where]


_BEFORE: dict[tuple, tuple] = {}


def before_run(root, num_workers):
    """One uninterrupted run per topology, with the state saved at every checkpoint step."""
    key = (str(root), num_workers)
    if key not in _BEFORE:
        steps = {checkpoint_step(root, num_workers, w) for w in POSITIONS}
        _BEFORE[key] = train(make(root), num_workers, save_at=steps)
    return _BEFORE[key]


@pytest.mark.parametrize("where", POSITIONS)
@pytest.mark.parametrize("before", WORKERS)
def test_every_resume_trains_exactly_the_requested_epochs(root, before, where):
    full, states = before_run(root, before)
    for e in range(EPOCHS):  # the uninterrupted run itself: epochs 0 and 1, each whole
        assert Counter(i for g, _, b in full if g == e for i in b) == epoch_frames(root, before, e)
    assert all(given == got for given, got, _ in full)
    step = checkpoint_step(root, before, where)
    state = states[step]
    done = full[:step]
    last = done[-1][0]  # the epoch of the checkpoint's last batch: its frames follow `before`
    for after in WORKERS:
        what = f"{before} -> {after} workers, checkpoint {where} (step {step})"
        ds = make(root, resume_state=state)
        first = ds.next_epoch(after)
        assert epochs_started(make(root), state, after) == first, what
        rest, _ = train(ds, after)
        assert all(given == got for given, got, _ in rest), what  # the label is the batches'
        assert [g for g, _, _ in rest] == sorted(g for g, _, _ in rest), what
        for e in range(EPOCHS):
            consumed = Counter(i for g, _, b in done + rest if g == e for i in b)
            want = epoch_frames(root, before if e <= last else after, e)
            assert consumed == want, f"{what}: epoch {e}, {sum(consumed.values())} frames"
        assert {g for g, _, _ in done + rest} == set(range(EPOCHS)), what
        if after == before:  # same topology: the uninterrupted order, batch for batch
            assert done + rest == full, what


def test_the_issue_cases(root):
    """The two cases of issue 13 (128 frames, batch 8, 2 epochs): 256 frames, not 384 or 128."""
    _, states2 = before_run(root, 2)
    state = states2[checkpoint_step(root, 2, "last_batch")]  # end of epoch 0, 2 workers
    assert epochs_started(make(root), state, 0) == 1
    rest, _ = train(make(root, resume_state=state), 0)
    assert 128 + sum(len(b) for _, _, b in rest) == 256

    _, states0 = before_run(root, 0)
    step = checkpoint_step(root, 0, "inside")  # 70% of epoch 0, no workers
    assert step == 11
    assert epochs_started(make(root), states0[step], 2) == 0
    rest, _ = train(make(root, resume_state=states0[step]), 2)
    assert step * B + sum(len(b) for _, _, b in rest) == 256


def test_two_resumes_in_one_epoch(root):
    """3 workers -> 1 (checkpoint inside the remainder epoch) -> 2: still two epochs, once each."""
    full, states = before_run(root, 3)
    step = checkpoint_step(root, 3, "inside")
    done = full[:step]
    mid, mid_states = train(make(root, resume_state=states[step]), 1, save_at=(2,))
    assert [g for g, _, _ in mid[:3]] == [0, 0, 0] and mid[3][0] == 1  # a 3-batch remainder
    done += mid[:2]
    rest, _ = train(make(root, resume_state=mid_states[2]), 2)
    assert rest[0][0] == 0
    for e in range(EPOCHS):
        consumed = Counter(i for g, _, b in done + rest if g == e for i in b)
        assert consumed == epoch_frames(root, 3 if e == 0 else 2, e), f"epoch {e}"


def test_the_body_must_iterate_the_loader(root):
    ds = make(root)
    loader = ds.dataloader(num_workers=0)
    with pytest.raises(RuntimeError, match=r"did not iterate the loader.*epoch 0 ended without"):
        for _ in loader.epochs(2):
            pass
    other = ds.dataloader(num_workers=0)
    with pytest.raises(RuntimeError, match=r"iterate the same loader that epochs\(\) was"):
        for _ in loader.epochs(2):
            for _ in other:
                pass


def test_an_epoch_cut_short_still_counts_as_one(root):
    """As with range(n): breaking out of an epoch ends it; the next one is the next epoch."""
    ds = make(root)
    loader = ds.dataloader(num_workers=0)
    seen = []
    for epoch in loader.epochs(3):
        for k, batch in enumerate(loader):
            seen.append((epoch, int(batch[CURSOR_KEY][0, 3])))
            if k == 1:
                break
    assert seen == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]


def test_no_epochs_where_there_are_none(root):
    infinite = make(root, infinite=True).dataloader(num_workers=0)
    with pytest.raises(TypeError, match=r"infinite ChunkedEpisodeDataset has no epochs"):
        next(iter(infinite.epochs(2)))
    with pytest.raises(ValueError, match=r"epochs\(n\) needs an int n >= 0"):
        next(iter(make(root).dataloader().epochs(-1)))


def test_mix_epochs(root):
    src = [MixSource(root, weight=1), MixSource(root, weight=2)]

    def mix(**kw):
        return MixedDataset(src, batch_size=B, exhausted="stop", chunk_frames=16, **kw)

    def run(m, save_at=()):
        loader, tracker = m.dataloader(num_workers=2), m.tracker()
        out, states = [], {}
        for epoch in loader.epochs(EPOCHS):
            for batch in loader:
                got = int(batch["robo_resume_mix"][3])
                batch = tracker.consume(batch)
                out.append((epoch, got, batch["index"].tolist()))
                if len(out) in save_at:
                    states[len(out)] = tracker.state_dict()
        return out, states

    per_epoch = mix().batches_per_epoch(2)
    steps = (per_epoch // 2, per_epoch, per_epoch + 1)
    full, states = run(mix(), steps)
    assert [g for g, _, _ in full] == [0] * per_epoch + [1] * per_epoch
    for step in steps:
        rest, _ = run(mix(resume_state=states[step]))
        assert all(a == b for a, b, _ in rest)
        assert full[:step] + rest == full, f"checkpoint at {step}"
    with pytest.raises(TypeError, match=r"cycling mix has no epochs"):
        next(iter(MixedDataset(src, batch_size=B).dataloader().epochs(1)))


def _run(zygote, *args, ok=True):
    """``python ARGS`` (examples/train_policy.py ...) forked from ``zygote``: (code, stdout)."""
    code, out, err = run_script(zygote, *args)
    if ok:
        assert code == 0, out[-2000:] + err[-3000:]
    return code, out


def _steps(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        step, *idx = map(int, line.split())
        out[step] = idx  # a step run twice (after the checkpoint, then resumed): the last wins
    return out


@pytest.mark.slow(8)
def test_train_policy_example_trains_two_epochs(tmp_path, factory, script_zygote):
    """examples/train_policy.py (140 frames, batch 8: 18 batches per epoch with 0 or 2 workers).

    One run crashed twice and resumed with another worker count each time: 0 workers crash at
    step 12 (checkpoint at 2/3 of epoch 0), 2 workers resume and crash at step 18 (checkpoint at
    the end of epoch 0), 0 workers resume and finish epoch 1. Both resumes are elastic: 0 -> 2
    inside an epoch, 2 -> 0 at an epoch's end.
    """
    data = factory(episode_lengths=(31, 44, 27, 38), num_cameras=1).root  # the example's own
    args = (EXAMPLES / "train_policy.py", "--workdir", tmp_path, "--root", data)
    z = script_zygote  # each run forked from it (conftest.run_script), as `python ARGS` would
    code, out = _run(z, *args, "--num-workers", 0, "--checkpoint-every", 6, "--stop-at-step", 12,
                     ok=False)  # fmt: skip
    assert code == 1 and "crashing after step 12 (last checkpoint: step 12)" in out
    code, out = _run(z, *args, "--num-workers", 2, "--checkpoint-every", 9, "--stop-at-step", 18,
                     "--resume", ok=False)  # fmt: skip
    assert code == 1 and "crashing after step 18 (last checkpoint: step 18)" in out
    assert sorted(_steps(tmp_path / "consumed.txt")) == list(range(1, 19))
    _, out = _run(z, *args, "--num-workers", 0, "--checkpoint-every", 9, "--resume")
    assert "finished at step 36" in out
    steps = _steps(tmp_path / "consumed.txt")
    assert sorted(steps) == list(range(1, 37))
    for epoch in range(2):
        frames = [i for s in range(18 * epoch + 1, 18 * epoch + 19) for i in steps[s]]
        assert Counter(frames) == Counter(range(140)), f"epoch {epoch}"
