"""MixedDataset at parity with ChunkedEpisodeDataset: on_error="skip", resume_step, elastic resume,
the StatefulDataLoader protocol, and skip records carried through an elastic resume.

Exact resume is checked on the sequence of (source, index batch), batch boundaries included,
nothing sorted; an elastic resume (another topology: a new order by design) is checked by counting
every frame of every source (Counter equality with what each source's interrupted epochs hold).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter

import pytest

from robo_resume import CURSOR_KEY, ChunkedEpisodeDataset, ResumeStateError
from robo_resume.index.schedule import Topology
from robo_resume.mix import MixedDataset, MixSource

A_LENGTHS = (23, 41, 17, 30, 9)  # v3.0, 120 frames
B_LENGTHS = (19, 27, 12, 33)  # one parquet per episode, 91 frames
BROKEN = 1  # the episode of source 1 whose parquet is cut in half


@pytest.fixture(scope="module")
def roots(factory):
    a = factory(episode_lengths=A_LENGTHS, num_cameras=0).root
    b = factory(episode_lengths=B_LENGTHS, num_cameras=0, episodes_per_file=1).root
    return a, b


@pytest.fixture(scope="module")
def broken(roots, tmp_path_factory):
    """Source 1 with episode 1's parquet truncated (unreadable: no footer)."""
    dst = tmp_path_factory.mktemp("broken") / "ds"
    shutil.copytree(roots[1], dst)
    path = dst / f"data/chunk-{BROKEN // 2:03d}/file-{BROKEN % 2:03d}.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return roots[0], dst


def make_mix(roots, **kw):
    a, b = roots
    kw.setdefault("batch_size", 4)
    kw.setdefault("chunk_frames", 8)
    kw.setdefault("seed", 5)
    return MixedDataset([MixSource(a, 1), MixSource(b, 3)], **kw)


def run(mix, *, num_workers, stop_after=None, epochs=1, loader=None):
    """Consume like a training loop: ``[(source, [index, ...])]``, the tracker, cursor epochs."""
    tracker = mix.tracker()
    loader = loader or mix.dataloader(num_workers=num_workers)
    out, epochs_of = [], []
    for _ in range(epochs):
        for batch in loader:
            epochs_of.append(batch[CURSOR_KEY][:, 3].tolist())
            clean = tracker.consume(batch)
            out.append((tracker.last_source, clean["index"].tolist()))
            if stop_after is not None and len(out) == stop_after:
                return out, tracker, epochs_of
    return out, tracker, epochs_of


def assert_exact(full, got, what):
    assert len(got) == len(full), f"{what}: {len(got)} batches, expected {len(full)}"
    for k, (a, b) in enumerate(zip(got, full, strict=True)):
        assert a == b, f"{what}: batch {k} is {a}, uninterrupted run had {b}"


def state_of(tracker):
    return json.loads(json.dumps(tracker.state_dict()))


def consumed(mix, state, source, num_workers):
    """Counter of the frames source ``source``'s streams emitted up to the state's cursors (the
    pure schedule of a run that started at epoch 0 with this topology)."""
    ds = mix.datasets[source]
    sched = ds.schedule(num_workers)
    out = Counter()
    for rank, role, epoch, position in state["sources"][source]["cursors"]:
        g = sched.topology.stream_id(rank, role)
        for e in range(epoch):
            out.update(sched.frame_indices(e, g).tolist())
        out.update(sched.frame_indices(epoch, g, 0, position).tolist())
    return out


def frames_of(batches, source):
    return Counter(i for s, b in batches if s == source for i in b)


def episode_indices(root, episode):
    ds = ChunkedEpisodeDataset(root, batch_size=1)
    ep = ds.meta.episode(episode)
    return set(range(ep.dataset_from_index, ep.dataset_from_index + ep.length))


def skip_keys(records):
    return [(r["source"], r["epoch"], r["chunk"], r["start"], r["frame"]) for r in records]


# --------------------------------------------------------------------- (1) on_error="skip"
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_in_a_mix_crash_and_resume_exact(broken, num_workers):
    """Exactly once per source with skips: every position of a source's streams is consumed
    once, its frames delivered or (the broken episode's) listed once in the skip records; the
    mix's batch count does not change, and a crash/resume gives the same batches and skips."""

    def make(**kw):
        return make_mix(broken, on_error="skip", **kw)

    total = 70  # source 1 (91 frames, 3/4 of the batches) goes round more than twice
    full, tracker, _ = run(make(), num_workers=num_workers, stop_after=total)
    assert len(full) == total
    state = state_of(tracker)
    bad = episode_indices(broken[1], BROKEN)
    mix = make()
    want1 = consumed(mix, state, 1, num_workers)
    assert frames_of(full, 1) == Counter({i: n for i, n in want1.items() if i not in bad})
    assert frames_of(full, 0) == consumed(mix, state, 0, num_workers)
    skipped = tracker.skipped
    assert skipped and {(r["source"], r["episode"]) for r in skipped} == {(1, BROKEN)}
    assert state["sources"][1]["skipped"] and not state["sources"][0]["skipped"]
    assert "source 1" in tracker.skip_report() and "CorruptFileError" in tracker.skip_report()
    # the 1-based number of the first batch with skipped frames: crash at it and after it
    first = 1 + next(k for k, (s, b) in enumerate(full) if s == 1 and len(b) < 4)
    for crash in (first, first + 1, 41):
        before, t_before, _ = run(make(), num_workers=num_workers, stop_after=crash)
        resumed = make(resume_state=state_of(t_before))
        after, t_after, _ = run(resumed, num_workers=num_workers, stop_after=total - crash)
        assert_exact(full, before + after, f"skip W={num_workers} crash={crash}")
        assert skip_keys(t_after.skipped) == skip_keys(skipped), crash  # none twice, none lost


def test_on_error_is_checked_for_a_mix(roots):
    with pytest.raises(ValueError, match=r"Unknown on_error.*'raise' or 'skip'.*Found ignore"):
        make_mix(roots, on_error="ignore")


# ------------------------------------------------------------------------- (2) resume_step
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("num_workers", "exhausted"), [(0, "cycle"), (2, "cycle"), (0, "stop"), (2, "stop")]
)
def test_resume_step_equals_the_tracker_state(roots, num_workers, exhausted):
    kw = dict(exhausted=exhausted, drop_last=num_workers == 2)
    epochs = 2 if exhausted == "stop" else 1
    stop = None if exhausted == "stop" else 50
    full, _, _ = run(make_mix(roots, **kw), num_workers=num_workers, epochs=epochs, stop_after=stop)
    per_epoch = make_mix(roots, **kw).batches_per_epoch(num_workers) or 10**9
    for s in (3, per_epoch + 1 if exhausted == "stop" else 33):
        _, t, _ = run(make_mix(roots, **kw), num_workers=num_workers, epochs=2, stop_after=s)
        by_step = make_mix(roots, resume_step=s * 4, **kw)
        by_state = make_mix(roots, resume_state=state_of(t), **kw)
        assert by_step.start_point(num_workers) == by_state.start_point(num_workers)
        left = epochs - (s >= per_epoch)
        rest = None if stop is None else stop - s
        after, _, _ = run(by_step, num_workers=num_workers, epochs=left, stop_after=rest)
        assert_exact(full, full[:s] + after, f"resume_step W={num_workers} {exhausted} s={s}")


def test_resume_step_refusals(roots, broken):
    with pytest.raises(
        ValueError,
        match=r"resume_step must be a non-negative multiple of batch_size.*Expected step \* "
        r"batch_size \(a multiple of 4\).*Found 6.*Fix: pass resume_step=step \* batch_size",
    ):
        make_mix(roots, resume_step=6)
    with pytest.raises(
        ValueError, match=r"cannot be exact with on_error='skip'.*Fix: resume from the tracker"
    ):
        make_mix(broken, resume_step=8, on_error="skip")
    _, t, _ = run(make_mix(roots), num_workers=0, stop_after=2)
    with pytest.raises(ValueError, match=r"Pass resume_step or resume_state, not both"):
        make_mix(roots, resume_step=8, resume_state=state_of(t))


# -------------------------------------------------------------------------- (3) elastic
def epochs_through(mix, state, source, through):
    """Counter of every frame source ``source``'s old streams emit in epochs ``0..through``."""
    ds = mix.datasets[source]
    st = state["sources"][source]
    sched = ds.schedule(state["num_workers"])
    sched = type(sched)(
        sched.chunks,
        dataclasses.replace(sched.config, batch_size=state["fingerprint"]["batch_size"]),
        Topology(state["world_size"], state["num_workers"]),
    )
    out = Counter()
    for g in range(sched.topology.num_streams):
        for e in range(through + 1):
            out.update(sched.frame_indices(e, g).tolist())
    assert len(st["cursors"]) == sched.topology.num_streams
    return out


def rows(batches, epochs_of, source, keep):
    """Counter of the frames of ``source`` whose cursor epoch satisfies ``keep``."""
    out = Counter()
    for (s, b), es in zip(batches, epochs_of, strict=True):
        if s == source:
            out.update(i for i, e in zip(b, es, strict=True) if keep(e))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("w0", "b0", "w1", "b1"), [(2, 4, 0, 4), (0, 4, 3, 4), (2, 4, 1, 6)])
def test_elastic_cycle_completes_every_source_once(roots, w0, b0, w1, b1):
    """Another num_workers (and batch size): each source's interrupted epochs (its streams
    stand in different epochs) are completed exactly once by its remainder epoch, then normal
    epochs of the new topology follow; a crash inside the remainder resumes in order."""
    before, t0, _ = run(make_mix(roots, batch_size=b0), num_workers=w0, stop_after=37)
    state = state_of(t0)
    mix = make_mix(roots, batch_size=b1, resume_state=state)
    starts = mix.level(w1).starts
    assert mix.start_point(w1)[1][0][0] == 1  # a new mix epoch: the mix order starts over
    after, _, epochs_of = run(mix, num_workers=w1, stop_after=200)
    for i in (0, 1):
        x = max(c[2] for c in state["sources"][i]["cursors"])
        assert starts[i] == x  # the remainder epoch is labelled with the newest old epoch
        want = epochs_through(mix, state, i, x)
        got = frames_of(before, i) + rows(after, epochs_of, i, lambda e, x=x: e <= x)
        assert got == want, f"source {i}: the interrupted epochs are not completed once"
        assert rows(after, epochs_of, i, lambda e, x=x: e > x)  # then normal epochs
    # a crash inside the remainder epoch, resumed with the same topology: the same batches
    mid, t2, _ = run(
        make_mix(roots, batch_size=b1, resume_state=state), num_workers=w1, stop_after=9
    )
    s2 = state_of(t2)
    assert s2["sources"][1]["elastic"] is not None
    rest, _, _ = run(
        make_mix(roots, batch_size=b1, resume_state=s2), num_workers=w1, stop_after=191
    )
    assert_exact(after, mid + rest, f"remainder crash {w0}->{w1}")


@pytest.mark.timeout(60)
def test_elastic_stop_finishes_the_mix_epoch_once(roots):
    """ "stop": the remainder mix epoch runs on what each source has left until the first
    source runs out (no frame twice); the next iteration is the new topology's next epoch."""
    kw = dict(exhausted="stop")
    before, t0, _ = run(make_mix(roots, **kw), num_workers=2, stop_after=13)
    state = state_of(t0)
    assert {c[2] for c in state["mix"]} == {0}
    mix = make_mix(roots, resume_state=state, **kw)
    loader = mix.dataloader(num_workers=1, persistent_workers=True)
    n = len(loader)
    after, _, ep1 = run(mix, num_workers=1, epochs=2, loader=loader)
    for i in (0, 1):
        got = frames_of(before, i) + rows(after[:n], ep1[:n], i, lambda e: e == 0)
        assert max(got.values()) == 1, f"source {i}: a frame twice in the interrupted epoch"
        assert not got - epochs_through(mix, state, i, 0)
        assert not rows(after[:n], ep1[:n], i, lambda e: e != 0)
    fresh, _, _ = run(make_mix(roots, **kw), num_workers=1, epochs=2)
    per = make_mix(roots, **kw).batches_per_epoch(1)
    assert after[n:] == fresh[per:], "the next epoch differs from the new topology's epoch 1"


def test_elastic_mix_refusals(roots):
    """A state of one rank alone cannot be re-partitioned (the other rank's leftover is
    unknown): the sources' elastic machinery refuses it, naming the fix."""
    mix = make_mix(roots, rank=0, world_size=2)
    _, t, _ = run(mix, num_workers=0, stop_after=3)
    state = state_of(t)
    with pytest.raises(ResumeStateError, match=r"lacks cursors of some ranks.*\[1\]"):
        make_mix(roots, resume_state=state).start_point(0)


# ----------------------------------------------------------- (4) StatefulDataLoader protocol
@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_crash_and_resume_exact(roots, num_workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from robo_resume import worker_context
    from robo_resume.mix import MIX_KEY

    def loader(**kw):
        ctx = dict(multiprocessing_context=worker_context()) if num_workers else {}
        mix = make_mix(roots, exhausted="stop", **kw)  # whole batches: batch_size=None
        return StatefulDataLoader(mix, batch_size=None, num_workers=num_workers, **ctx)

    def key(b):
        return int(b[MIX_KEY][5]), b["index"].tolist()

    full = [key(b) for b in loader()]
    for s in (1, 6, 7):
        first = loader()
        before = []
        for b in first:
            before.append(key(b))
            if len(before) == s:
                sd = first.state_dict()
                break
        sd = json.loads(json.dumps(sd, default=lambda o: o.tolist()))
        second = loader()
        second.load_state_dict(sd)
        after = [key(b) for b in second]
        assert_exact(full, before + after, f"StatefulDataLoader W={num_workers} s={s}")


def test_mix_load_state_dict_refuses_a_state_that_does_not_fit(roots):
    mix = make_mix(roots)
    it = mix.iter_batches()
    for _ in range(5):
        next(it)
    sd = mix.state_dict()
    assert sd["j"] == 5 and len(sd["sources"]) == 2
    bad = {**sd, "sources": [[0, 0], [0, 0]]}
    with pytest.raises(
        ResumeStateError, match=r"does not fit this mix.*Fix: load the state into the same mix"
    ):
        make_mix(roots).load_state_dict(bad)
    with pytest.raises(ResumeStateError, match=r"Invalid mix dataset state.*keys"):
        make_mix(roots).load_state_dict({"rank": 0})


# ------------------------------------------- (6) skip records through an elastic resume
def skipped_once(records, epoch, first, want):
    """The skip records of ``epoch`` cover ``want`` (the broken episode's frames the epoch
    emits; ``first`` = its first index), each frame exactly once: a chunk retried after the
    hop would be recorded a second time (overlapping ranges)."""
    frames = Counter()
    for r in records:
        if r["epoch"] == epoch:
            assert r["episode"] == BROKEN, r
            frames.update(first + f for f in range(r["frame"], r["stop"]))
    assert frames and max(frames.values()) == 1, f"epoch {epoch}: a frame recorded twice"
    assert set(frames) == want, f"epoch {epoch}: skipped frames differ"


def epoch_counter(ds, world_size, num_workers, batch_size, epoch):
    """Counter of the frames every stream of a topology emits in ``epoch`` (pure schedule)."""
    sched = ds.schedule(0)
    config = dataclasses.replace(sched.config, batch_size=batch_size)
    sched = type(sched)(sched.chunks, config, Topology(world_size, num_workers))
    return Counter(
        i for g in range(sched.topology.num_streams) for i in sched.frame_indices(epoch, g).tolist()
    )


@pytest.mark.timeout(60)
def test_skip_records_survive_an_elastic_resume_single_dataset(broken):
    """2 workers -> 0: chunks skipped before the hop are neither retried nor recorded again
    after it, and every readable frame of the interrupted epoch is delivered exactly once."""
    root = broken[1]

    def make(**kw):
        kw = dict(batch_size=4, chunk_frames=8, seed=2, on_error="skip", **kw)
        return ChunkedEpisodeDataset(root, **kw)

    ds = make()
    tracker, before = ds.tracker(), []
    for batch in ds.dataloader(num_workers=2):
        before.extend(tracker.consume(batch)["index"].tolist())
        if tracker.skipped and len(before) >= 12:
            break
    state = json.loads(json.dumps(tracker.state_dict()))
    carried = [dict(r) for r in state["skipped"]]
    assert carried, "the crash should come after a skip"
    resumed = make(resume_state=state)
    t2, after = resumed.tracker(), []
    for batch in resumed.dataloader(num_workers=0):
        after.extend(t2.consume(batch)["index"].tolist())
    assert resumed.layout(0).remainder is not None  # an elastic hop, not a plain resume
    bad = episode_indices(root, BROKEN)
    epoch0 = epoch_counter(ds, 1, 2, 4, 0)
    assert Counter(before + after) == Counter({i: n for i, n in epoch0.items() if i not in bad})
    assert [dict(r) for r in t2.skipped[: len(carried)]] == carried  # known after the hop
    skipped_once(t2.skipped, 0, min(bad), bad & set(epoch0))


@pytest.mark.timeout(60)
def test_skip_records_survive_an_elastic_resume_mix(broken):
    """The same in a mix ("cycle", 2 workers -> 0): the broken source's remainder completes its
    interrupted epochs once, its carried skips are neither retried nor recorded again."""
    before, t0, _ = run(make_mix(broken, on_error="skip"), num_workers=2, stop_after=37)
    state = state_of(t0)
    carried = state["sources"][1]["skipped"]
    assert carried
    mix = make_mix(broken, on_error="skip", resume_state=state)
    after, t1, _ = run(mix, num_workers=0, stop_after=200)
    x = max(c[2] for c in state["sources"][1]["cursors"])
    bad = episode_indices(broken[1], BROKEN)
    want = epochs_through(mix, state, 1, x)
    want = Counter({i: n for i, n in want.items() if i not in bad})
    # the source's first frames after the hop are its remainder's (then epoch x + 1 follows)
    flat = [i for s, b in after if s == 1 for i in b]
    prefix = flat[: want.total() - frames_of(before, 1).total()]
    assert frames_of(before, 1) + Counter(prefix) == want
    records = [{k: v for k, v in r.items() if k != "source"} for r in t1.skipped]
    assert records[: len(carried)] == carried  # known after the hop
    assert all(r["source"] == 1 for r in t1.skipped)
    for e in range(x + 1):
        emitted = epoch_counter(mix.datasets[1], 1, 2, 4, e)
        skipped_once(records, e, min(bad), bad & set(emitted))
