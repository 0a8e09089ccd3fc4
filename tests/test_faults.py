"""Fault injection: SIGKILLed training, failing and killed DataLoader workers, on_error="skip".

- A training process (``tests/fault_train.py``) is SIGKILLed at 20+ random points and resumed
  from its last checkpoint each time; over the whole run every epoch consumes its frames exactly
  once (counting each killed run's steps up to the checkpoint the next run resumed from) and in
  the uninterrupted order.
- A worker that raises on a broken mp4 surfaces in the main process as that error, naming file,
  episode and frames; a worker killed by the OS is reported promptly with a resume hint.
- ``on_error="skip"``: the chunks of broken files are skipped, reported (log, tracker, state),
  and crash/resume stays exactly-once over the readable frames.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_bad_input_corpus import truncate

from robo_resume import (
    CURSOR_KEY,
    ChunkedEpisodeDataset,
    CorruptFileError,
    MissingFileError,
)
from robo_resume.audit import epochs_started
from robo_resume.dataset import SKIPPED_KEY, WORKER_DIED_HINT
from robo_resume.errors import WorkerStartError

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# ----------------------------------------------------------------------------- (a) SIGKILL

KILL_LENGTHS = (37, 52, 29, 44, 61, 33, 48, 40)  # 344 frames: 43 batches of 8 per epoch
KILLS = 22


@pytest.fixture(scope="module")
def kill_root(factory):
    return factory(episode_lengths=KILL_LENGTHS, num_cameras=0).root


def _read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow(16)
@pytest.mark.timeout(90)
def test_sigkill_training_20_times_exactly_once(kill_root, tmp_path):
    work = tmp_path / "train"
    work.mkdir()
    every, epochs, seed = 3, 2, 5
    errfile = open(tmp_path / "zygote.err", "w")
    zygote = subprocess.Popen(
        [
            *(sys.executable, str(HERE / "fault_train.py"), "--root", str(kill_root)),
            *("--workdir", str(work), "--every", str(every), "--epochs", str(epochs)),
            *("--seed", str(seed), "--slow", "0.003"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errfile,
        text=True,
        cwd=REPO,
    )
    rng = random.Random(20240607)
    kills: list[tuple[int, str]] = []  # (run, where the kill landed)
    t0 = time.perf_counter()
    try:
        assert zygote.stdout.readline().strip() == "ready"
        # the uninterrupted run first, by the same code (one fork, a second or so)
        ref_dir = tmp_path / "reference"
        ref_dir.mkdir()
        zygote.stdin.write(f"run 0 {ref_dir}\n")
        zygote.stdin.flush()
        while not (line := zygote.stdout.readline()).startswith("exit"):
            assert line, f"the zygote died: {(tmp_path / 'zygote.err').read_text()[-3000:]}"
        assert line.split()[2] == "0", (tmp_path / "zygote.err").read_text()[-3000:]
        run = 0
        while True:
            zygote.stdin.write(f"run {run}\n")
            zygote.stdin.flush()
            first = zygote.stdout.readline().split()
            assert first[0] == "pid", first
            pid = int(first[1])
            kill = len(kills) < KILLS
            # 1 in 6 kills lands during start-up (checkpoint load, dataset, worker start),
            # the others after a random number of consumed steps (during a step, a checkpoint
            # save or the next batch's wait)
            early = kill and rng.random() < 1 / 6
            target = rng.randint(1, 9)
            if early:
                time.sleep(rng.uniform(0.0, 0.25))
                os.kill(pid, signal.SIGKILL)
                kills.append((run, "start-up"))
            seen, status = 0, None
            while status is None:
                line = zygote.stdout.readline()
                assert line, f"the zygote died: {(tmp_path / 'zygote.err').read_text()[-3000:]}"
                if line.startswith("step"):
                    seen += 1
                    if kill and not early and seen >= target:
                        os.kill(pid, signal.SIGKILL)
                        kills.append((run, line.strip()))
                        kill = False
                elif line.startswith("exit"):
                    status = int(line.split()[2])
            with _suppress_lookup():
                os.killpg(pid, signal.SIGKILL)  # the killed run's DataLoader workers
            if status == 0:
                break
            assert status == -signal.SIGKILL, (
                f"run {run} failed with {status}: {(tmp_path / 'zygote.err').read_text()[-3000:]}"
            )
            run += 1
    finally:
        if zygote.poll() is None:
            zygote.stdin.close()
            zygote.wait(timeout=30)
        errfile.close()
    wall = time.perf_counter() - t0

    events = _read_log(work / "log.jsonl")
    runs = sorted({e["run"] for e in events})
    start = {e["run"]: e["resumed_from"] for e in events if e["event"] == "start"}
    final = max(runs)
    assert any(e["event"] == "done" and e["run"] == final for e in events)
    assert len(kills) == KILLS and run == final
    got_steps = []
    for r in range(final + 1):
        steps = [e for e in events if e["run"] == r and e["event"] == "step"]
        if r not in start:  # killed before it logged its start: it consumed nothing
            assert not steps
            continue
        # the run continues its checkpoint: steps resumed_from + 1, + 2, ... in order
        assert [e["step"] for e in steps] == list(range(start[r] + 1, start[r] + len(steps) + 1))
        nxt = min((start[q] for q in start if q > r), default=None)
        if nxt is not None:
            # what the next run resumed from: a checkpoint this run (or an earlier one) saved
            assert nxt % every == 0 and start[r] <= nxt <= start[r] + len(steps)
            steps = [e for e in steps if e["step"] <= nxt]
        got_steps += steps
    assert [e["step"] for e in got_steps] == list(range(1, len(got_steps) + 1))

    ref = [e["index"] for e in _read_log(ref_dir / "log.jsonl") if e["event"] == "step"]
    assert len(ref) == epochs * ChunkedEpisodeDataset(
        kill_root, batch_size=8, seed=seed, chunk_frames=16
    ).batches_per_epoch(2)
    got = [e["index"] for e in got_steps]
    total = sum(KILL_LENGTHS)
    for epoch in range(epochs):
        frames = [i for e in got_steps if e["epoch"] == epoch for i in e["index"]]
        assert Counter(frames) == Counter(range(total)), f"epoch {epoch} not exactly once"
    assert got == ref, "the resumed order differs from the uninterrupted run"
    redone = sum(
        1
        for r in start
        for e in events
        if e["run"] == r and e["event"] == "step" and e not in got_steps
    )
    print(
        f"\nSIGKILL trials: {len(kills)} kills over {final + 1} runs in {wall:.1f}s; "
        f"{len(got)} steps kept, {redone} steps after a last checkpoint redone; kills at "
        + ", ".join(f"run {r}: {w}" for r, w in kills)
    )


class _suppress_lookup:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)


# ------------------------------------------------------------------ (b), (c) worker faults

FAULT_LENGTHS = (20, 17, 23, 14, 19, 21)  # one mp4 and one parquet per episode
CAM = "observation.images.cam0"


def _video(e: int) -> str:
    return f"videos/{CAM}/chunk-{e // 2:03d}/file-{e % 2:03d}.mp4"


def _data(e: int) -> str:
    return f"data/chunk-{e // 2:03d}/file-{e % 2:03d}.parquet"


@pytest.fixture(scope="module")
def fault_root(factory):
    return factory(episode_lengths=FAULT_LENGTHS, codec="h264", gop=4, episodes_per_file=1).root


def _broken_copy(src: Path, dst: Path, *corruptions) -> Path:
    shutil.copytree(src, dst)
    for fn in corruptions:
        fn(dst)
    return dst


@pytest.mark.timeout(60)
def test_worker_error_names_file_episode_and_frames(fault_root, tmp_path):
    """A worker that fails on a truncated mp4 raises that error in the main process."""
    root = _broken_copy(fault_root, tmp_path / "ds", lambda r: truncate(r / _video(3), 0.3))
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8, seed=1)
    t0 = time.perf_counter()
    it = iter(ds.dataloader(num_workers=2))
    try:
        with pytest.raises(CorruptFileError) as info:
            for _ in it:
                pass
        took = time.perf_counter() - t0
    finally:
        t1 = time.perf_counter()
        it._shutdown_workers()  # what the iterator's finaliser does, here and not later
        print(f"\nworkers shut down in {time.perf_counter() - t1:.2f}s")
    msg = str(info.value)
    assert "in DataLoader worker process" in msg  # torch's re-raise, same type
    pattern = (
        rf"At file \S*{re.escape(_video(3))}, episode 3\..*Raised while streaming frames "
        r"(\d+)\.\.(\d+) of episode 3 \(chunk \d+, epoch 0, stream position \d+\).*"
        r"on_error='skip'"
    )
    found = re.search(pattern, msg)
    assert found, msg[-1500:]
    assert int(found.group(1)) % 8 == 0  # a chunk's first frame: the file does not open
    assert took < 30
    print(f"\nworker error reported after {took:.2f}s: ...{msg.splitlines()[-1][-260:]}")


@pytest.mark.timeout(60)
def test_in_process_error_names_frames(fault_root, tmp_path):
    """The same context without workers (the error is raised directly)."""
    root = _broken_copy(fault_root, tmp_path / "ds", lambda r: (r / _data(4)).unlink())
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8, seed=1)
    with pytest.raises(
        MissingFileError,
        match=rf"{re.escape(_data(4))}, episode 4\..*Raised while streaming frames \d+\.\.\d+ "
        r"of episode 4 \(chunk",
    ) as info:
        for _ in ds.iter_batches():
            pass
    assert isinstance(info.value.__cause__, MissingFileError)  # the original, chained


def _kill_a_worker(loader, *, after: int) -> tuple[BaseException | None, float, int]:
    it = iter(loader)
    for _ in range(after):
        next(it)
    pid = it._workers[0].pid
    os.kill(pid, signal.SIGKILL)
    t0 = time.perf_counter()
    try:
        for _ in it:
            pass
    except RuntimeError as exc:
        return exc, time.perf_counter() - t0, pid
    finally:
        it._shutdown_workers()
    return None, time.perf_counter() - t0, pid


@pytest.mark.timeout(60)
def test_worker_killed_by_the_os_is_reported_with_a_hint(fault_root):
    ds = ChunkedEpisodeDataset(fault_root, batch_size=4, chunk_frames=8, seed=1)
    exc, took, pid = _kill_a_worker(ds.dataloader(num_workers=2), after=2)
    assert exc is not None, "the loader ended normally although a worker was killed"
    msg = str(exc)
    assert re.search(rf"DataLoader worker \(pid\(?s?\)? .*{pid}", msg), msg
    assert WORKER_DIED_HINT in msg and "resume_state=checkpoint['data']" in msg
    # torch's own error (or the EOFError of a batch the worker died sending) stays chained
    assert isinstance(exc.__cause__, RuntimeError | EOFError | ConnectionError)
    assert WORKER_DIED_HINT not in str(exc.__cause__)
    assert took < 15, f"reported after {took:.1f}s"
    print(f"\nworker SIGKILL (forkserver worker) reported after {took:.2f}s: {msg.splitlines()[0]}")


@pytest.mark.timeout(60)
def test_worker_killed_by_the_os_fork_workers(fault_root):
    """Forked workers (torch's default start method), in a fresh process: torch reports the
    dead worker ("is killed by signal" from its SIGCHLD handler, or "exited unexpectedly")."""
    code = f"""
import os, re, signal, sys, time
sys.path.insert(0, {str(HERE)!r})
from test_faults import _kill_a_worker
from robo_resume import ChunkedEpisodeDataset
ds = ChunkedEpisodeDataset({str(fault_root)!r}, batch_size=4, chunk_frames=8, seed=1)
exc, took, pid = _kill_a_worker(ds.dataloader(num_workers=2), after=2)
print(repr(str(exc)), took, pid, type(exc.__cause__).__name__)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-3000:]
    msg, took, pid, cause = out.stdout.strip().rsplit(" ", 3)
    assert "DataLoader worker" in msg and pid in msg
    hinted = "resume from your last checkpoint" in msg
    # torch's SIGCHLD handler may raise in the main thread outside the loader's next()
    assert hinted or "is killed by signal" in msg, msg
    chained = ("RuntimeError", "EOFError", "ConnectionResetError") if hinted else ("NoneType",)
    assert cause in chained
    assert float(took) < 15
    print(
        f"\nworker SIGKILL (fork worker) reported after {float(took):.2f}s, hint {hinted}: "
        + msg[:90]
    )


# ------------------------------------------------------------------------ (d) on_error="skip"

BROKEN_EPISODES = (1, 4)


def _break_two(r: Path) -> None:
    (r / _video(1)).unlink()  # episode 1: its mp4 is missing
    truncate(r / _data(4), 0.5)  # episode 4: its parquet is cut in half


@pytest.fixture(scope="module")
def skip_root(fault_root, tmp_path_factory):
    return _broken_copy(fault_root, tmp_path_factory.mktemp("skip") / "ds", _break_two)


def _skip_make(root, **kw):
    def make(**extra):
        return ChunkedEpisodeDataset(
            root, batch_size=6, chunk_frames=8, seed=3, on_error="skip", **kw, **extra
        )

    return make


def _run(make, *, epochs, stop_after=None, num_workers=2, **ds_kw):
    """Consume like a training loop; returns (batches as (epoch, index list), tracker)."""
    ds = make(**ds_kw)
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=num_workers)
    out = []
    skip_at = tracker.skip_at = []  # batches (1-based) that carried new skip records
    for _ in range(
        epochs
        - (epochs_started(ds, ds_kw["resume_state"], num_workers) if "resume_state" in ds_kw else 0)
    ):
        for batch in loader:
            epoch = int(batch[CURSOR_KEY][-1, 3])
            assert batch[CURSOR_KEY].shape[0] in (6, 3)  # one cursor row per position
            before = len(tracker.skipped)
            batch = tracker.consume(batch)
            assert SKIPPED_KEY not in batch and CURSOR_KEY not in batch
            out.append((epoch, batch["index"].tolist()))
            if len(tracker.skipped) > before:
                skip_at.append(len(out))
            if stop_after is not None and len(out) == stop_after:
                return out, tracker
    return out, tracker


def _chunks_of(ds, episodes):
    return {(c.episode_index, c.start, c.stop) for c in ds.chunks if c.episode_index in episodes}


def _skip_keys(records, epoch):
    """(episode, start, stop) of the skipped frames of each chunk in ``epoch`` (a chunk that
    the schedule split between two streams has one record per piece)."""
    frames: dict[tuple[int, int], set[int]] = {}
    for r in records:
        if r["epoch"] == epoch:
            frames.setdefault((r["episode"], r["chunk"]), set()).update(
                range(r["frame"], r["stop"])
            )
    out = set()
    for (episode, _), fs in frames.items():
        assert fs == set(range(min(fs), max(fs) + 1))  # contiguous
        out.add((episode, min(fs), max(fs) + 1))
    return out


@pytest.mark.timeout(90)
def test_skip_broken_files_completes_and_reports(skip_root, caplog):
    make = _skip_make(skip_root)
    ds = make()
    total = sum(FAULT_LENGTHS)
    good = [
        i
        for e in range(len(FAULT_LENGTHS))
        if e not in BROKEN_EPISODES
        for i in range(sum(FAULT_LENGTHS[:e]), sum(FAULT_LENGTHS[: e + 1]))
    ]
    assert total % 2 == 0  # two streams, nothing dropped: every good frame once per epoch
    with caplog.at_level(logging.WARNING, logger="robo_resume"):
        batches, tracker = _run(make, epochs=2)
    per_epoch = ds.batches_per_epoch(2)
    assert len(batches) == 2 * per_epoch  # skipping keeps every batch: counts stay exact
    for epoch in (0, 1):
        frames = [i for e, b in batches if e == epoch for i in b]
        assert Counter(frames) == Counter(good), f"epoch {epoch}"
        # exactly the chunks of the broken episodes, each whole, once per epoch
        assert _skip_keys(tracker.skipped, epoch) == _chunks_of(ds, BROKEN_EPISODES)
    for r in tracker.skipped:
        want = _video(1) if r["episode"] == 1 else _data(4)
        err = "MissingFileError" if r["episode"] == 1 else "CorruptFileError"
        assert r["file"].endswith(want) and r["error"].startswith(err), r
    # one WARNING per broken file and one summary per pass (issue 17), not one per chunk
    warnings = [m for m in caplog.messages if m.startswith("robo_resume: skipping the frames")]
    assert len(warnings) == 2 * len(BROKEN_EPISODES) < len(tracker.skipped)
    assert all(
        re.search(r"of \S+ \(episode [14]; (MissingFile|CorruptFile)Error: A ", w) for w in warnings
    )
    summaries = [m for m in caplog.messages if m.startswith("robo_resume: this pass skipped")]
    assert len(summaries) == 2 and all("episode(s) 1,4, in 2 missing" in m for m in summaries)
    report = tracker.skip_report()
    assert report.splitlines()[0].startswith(
        f"robo_resume: {len(tracker.skipped)} chunk(s) skipped ({2 * (total - len(good))} frames)"
        " in episodes [1, 4]"
    )
    state = tracker.state_dict()
    assert [tuple(sorted(r.items())) for r in state["skipped"]] == [
        tuple(sorted(r.items())) for r in tracker.skipped
    ]
    assert json.loads(json.dumps(state)) == state
    empty = sum(1 for _, b in batches if not b)
    short = sum(1 for _, b in batches if 0 < len(b) < 6)
    print(f"\n{report.splitlines()[0]}; {empty} empty and {short} short batches of {len(batches)}")


@pytest.mark.timeout(90)
def monkeypatch_flip() -> pytest.MonkeyPatch:
    """``Overlap`` switched on and off at every batch (reading ahead, then not, ...)."""
    from robo_resume.stream.group_read import Overlap

    def flip(self, consumer_s, period_s):
        self.on = not self.on

    mp = pytest.MonkeyPatch()
    mp.setattr(Overlap, "batch", flip)
    return mp


def test_skip_is_the_same_with_decoding_threads(skip_root):
    """With num_workers=0 the chunks of a batch decode on several threads; a broken file is
    skipped at the same frames, with the same records, as when they decode one by one."""
    from robo_resume import StreamTuning

    make = _skip_make(skip_root)
    runs = [
        _run(make, epochs=2, num_workers=0, tuning=StreamTuning(camera_threads=t, interleave=3))
        for t in (1, 2)
    ]
    (one, t1), (two, t2) = runs
    assert one == two
    assert t1.skipped == t2.skipped and t1.skip_at == t2.skip_at
    # one thread, reading ahead and not by turns (what the adaptive overlap may do mid-group)
    flip = monkeypatch_flip()
    try:
        three, t3 = _run(make, epochs=2, num_workers=0, tuning=StreamTuning(interleave=3))
    finally:
        flip.undo()
    assert three == one and t3.skipped == t1.skipped and t3.skip_at == t1.skip_at
    assert {r["episode"] for r in t1.skipped} == set(BROKEN_EPISODES)
    # and as a worker does (which reads one block at a time, not the next one ahead)
    worker = _run(make, epochs=2, num_workers=1, tuning=StreamTuning(interleave=3))
    assert worker[0] == one and worker[1].skipped == t1.skipped


@pytest.mark.timeout(90)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_failed_read_is_not_followed_by_reads_of_its_chunk(partial_root, threads, monkeypatch):
    """num_workers=0 reads a block ahead of the batch: the next block may hold more frames of a
    chunk whose read fails. Those are not read (the failed reader is closed, not read again),
    and the batches equal a worker's, which reads no block ahead."""
    from robo_resume import StreamTuning
    from robo_resume.stream.group_read import GroupRead, Overlap

    groups: list[GroupRead] = []  # kept alive: an id is not reused by another group
    failed: set[tuple[int, int]] = set()  # (group, segment) whose read failed
    after: list[tuple[int, int]] = []  # (episode, first frame) read after its chunk failed
    orig = GroupRead._read

    def read(self, job):
        # late, as a slow decode would be: the next block is planned while this read runs
        time.sleep(0.005)
        if not any(self is g for g in groups):
            groups.append(self)
        key = (id(self), job[0])
        if key in failed:
            after.append((self.segs[job[0]].episode_index, job[2].start))
        try:
            return orig(self, job)
        except Exception:
            failed.add(key)
            raise

    monkeypatch.setattr(GroupRead, "_read", read)
    # always read ahead (one decoding thread otherwise stops when the loop does nothing else)
    monkeypatch.setattr(Overlap, "SHARE", 0.0)
    make = _skip_make(partial_root)
    tuning = StreamTuning(camera_threads=threads, interleave=2, block_frames=2)
    full, tracker = _run(make, epochs=1, num_workers=0, tuning=tuning)
    assert tracker.skipped and {r["episode"] for r in tracker.skipped} == {2}
    assert failed, "expected a read to fail"
    assert after == [], f"reads of a chunk after its read failed: {after}"
    worker, wt = _run(make, epochs=1, num_workers=1, tuning=tuning)
    assert worker == full and wt.skipped == tracker.skipped


def _compare_resume(make, crash_points, epochs=2):
    full, tracker_full = _run(make, epochs=epochs)
    for crash in crash_points:
        before, t_before = _run(make, epochs=epochs, stop_after=crash)
        state = t_before.state_dict()
        after, t_after = _run(make, epochs=epochs, resume_state=state)
        assert before + after == full, f"crash after {crash} batches: order differs"
        key = lambda r: (r["epoch"], r["chunk"], r["start"], r["frame"])  # noqa: E731
        assert sorted(map(key, t_after.skipped)) == sorted(map(key, tracker_full.skipped)), crash
    return full, tracker_full


@pytest.mark.timeout(120)
def test_skip_crash_resume_exactly_once(skip_root):
    make = _skip_make(skip_root)
    per_epoch = make().batches_per_epoch(2)
    _, tracker = _compare_resume(make, [1, per_epoch // 2 + 1, per_epoch + 3])
    assert tracker.skipped


def shorten_mp4(path: Path, packets: int) -> None:
    """Keep only the first ``packets`` video packets: a valid mp4 that ends early."""
    import av

    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(path)) as src, av.open(str(tmp), "w") as out:
        stream = out.add_stream_from_template(src.streams.video[0])
        kept = 0
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is None:
                continue
            if kept == packets:
                break
            packet.stream = stream
            out.mux(packet)
            kept += 1
    tmp.replace(path)


@pytest.fixture(scope="module")
def partial_root(fault_root, tmp_path_factory):
    """Episode 2's mp4 ends after 12 of its 23 frames: early reads work, later ones fail."""
    return _broken_copy(
        fault_root,
        tmp_path_factory.mktemp("partial") / "ds",
        lambda r: shorten_mp4(r / _video(2), 12),
    )


@pytest.mark.timeout(120)
def test_skip_partial_file_resume_is_deterministic(partial_root):
    """A file that fails in its middle: the frames before the failing read are kept, the rest
    of the chunk skipped, and a resume just before, at and after the batch that skipped (the
    last one from the state, without a retry) does exactly the same."""
    make = _skip_make(partial_root)
    full, tracker = _run(make, epochs=1)
    first = tracker.skip_at[0]  # 1-based number of the batch that carried the first skip
    _compare_resume(make, [first - 1, first, first + 1], epochs=1)
    assert tracker.skipped and {r["episode"] for r in tracker.skipped} == {2}
    ep2 = range(sum(FAULT_LENGTHS[:2]), sum(FAULT_LENGTHS[:3]))
    kept = {i for _, b in full for i in b if i in ep2}
    assert 0 < len(kept) < len(ep2), "expected a partial failure"
    assert kept == set(ep2[: len(kept)])  # a prefix of the episode
    print(
        f"\npartial mp4: {len(kept)} of {len(ep2)} frames of episode 2 kept; skipped "
        + ", ".join(f"{r['frame']}..{r['stop'] - 1}" for r in tracker.skipped)
        + f" (first skip in batch {first}; resumed at {first - 1}, {first}, {first + 1})"
    )


def test_on_error_is_checked_and_skip_needs_the_batch_path(fault_root):
    with pytest.raises(ValueError, match=r"Unknown on_error.*'raise' or 'skip'.*Found ignore"):
        ChunkedEpisodeDataset(fault_root, batch_size=4, on_error="ignore")
    ds = ChunkedEpisodeDataset(fault_root, batch_size=4, on_error="skip")
    with pytest.raises(ValueError, match=r"on_error='skip' needs the batch path.*Fix: use"):
        iter(ds)


def test_skip_records_in_state_are_validated(skip_root):
    make = _skip_make(skip_root)
    _, tracker = _run(make, epochs=1, stop_after=12, num_workers=0)
    state = tracker.state_dict()
    assert state["skipped"], "the first 12 batches should skip something"
    bad = json.loads(json.dumps(state))
    del bad["skipped"][0]["frame"]
    with pytest.raises(Exception, match=r"Invalid skipped-chunk record.*Fix"):
        make(resume_state=bad)
    old = {k: v for k, v in state.items() if k != "skipped"}  # a state from before the field
    assert make(resume_state=old).tracker().skipped == ()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unpicklable_transform_is_named_before_any_worker_starts(fault_root, method):
    ds = ChunkedEpisodeDataset(
        fault_root, batch_size=4, chunk_frames=8, image_transforms=lambda t: t * 2
    )
    loader = ds.dataloader(num_workers=2, multiprocessing_context=method)
    match = rf"start with '{method}'.*image_transforms = <function"
    with pytest.raises(WorkerStartError, match=match):
        iter(loader)
    assert loader._iterator is None  # no worker was started
    plain = ChunkedEpisodeDataset(fault_root, batch_size=4, chunk_frames=8)
    match = r"worker_init_fn = .*multiprocessing_context='fork'"
    with pytest.raises(WorkerStartError, match=match):
        iter(plain.dataloader(num_workers=1, multiprocessing_context=method,
                              worker_init_fn=lambda w: None))  # fmt: skip


def test_picklable_transform_still_starts_spawn_workers(fault_root):
    ds = ChunkedEpisodeDataset(fault_root, batch_size=4, chunk_frames=8, image_transforms=abs)
    batch = next(iter(ds.dataloader(num_workers=1, multiprocessing_context="spawn")))
    assert len(batch["index"]) == 4
