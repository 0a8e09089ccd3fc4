"""Resume state validation (versions, fingerprints, escape hatch) and crash-safe saves."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import robo_resume
from robo_resume import (
    ChunkedEpisodeDataset,
    CorruptFileError,
    MissingFileError,
    ResumeState,
    ResumeStateError,
)
from robo_resume.checkpoint import (
    atomic_write,
    load_checkpoint,
    load_state,
    save_checkpoint,
    save_state,
)
from robo_resume.state import STATE_VERSION, StreamCursor

LENGTHS = (23, 41, 17, 30, 9, 26)
KW = {"batch_size": 4, "seed": 0, "chunk_frames": 8}


@pytest.fixture(scope="module")
def tab_root(factory):
    return factory(episode_lengths=LENGTHS, num_cameras=0).root


@pytest.fixture(scope="module")
def saved(tab_root):
    """The state after 3 batches of a 0-worker run (a plain JSON dict)."""
    ds = ChunkedEpisodeDataset(tab_root, **KW)
    tracker = ds.tracker()
    for step, batch in enumerate(ds.dataloader(num_workers=0)):
        tracker.consume(batch)
        if step == 2:
            break
    return json.loads(json.dumps(tracker.state_dict()))


# --------------------------------------------------------------------------- format, versions


def test_state_records_format_and_library_version(saved):
    assert saved["version"] == STATE_VERSION == 4 and saved["kind"] == "dataset"
    assert saved["library_version"] == robo_resume.__version__
    state = ResumeState.from_dict(json.dumps(saved))
    assert state.to_dict() == saved
    assert ResumeState.from_dict(state) is state


def test_v1_state_is_migrated_and_logged(tab_root, saved, caplog):
    v1 = {k: v for k, v in saved.items() if k != "library_version"}
    v1["version"] = 1
    caplog.set_level(logging.INFO, logger="robo_resume")
    state = ResumeState.from_dict(v1)
    assert state.library_version == "unknown"
    assert state.to_dict()["version"] == STATE_VERSION
    assert f"migrated a resume state from format version 1 to {STATE_VERSION}" in caplog.text
    ds = ChunkedEpisodeDataset(tab_root, **KW, resume_state=v1)  # resumes like the v2 state
    assert ds.start_point(0) == ChunkedEpisodeDataset(
        tab_root, **KW, resume_state=saved
    ).start_point(0)


def test_future_state_version_is_refused(saved):
    future = {**saved, "version": STATE_VERSION + 1, "library_version": "9.0.0"}
    with pytest.raises(
        ResumeStateError,
        match=r"Unsupported resume state version.*Expected version 1 to 4.*Found version 5, "
        r"written by robo_resume 9\.0\.0.*Fix: upgrade robo_resume to 9\.0\.0 or newer",
    ):
        ResumeState.from_dict(future)


@pytest.mark.parametrize("version", [0, "2", None, True, 2.5])
def test_bad_state_versions_are_refused(saved, version):
    with pytest.raises(ResumeStateError, match=r"Unsupported resume state version.*Fix: resume"):
        ResumeState.from_dict({**saved, "version": version})


def test_other_library_version_is_accepted_and_logged(tab_root, saved, caplog):
    caplog.set_level(logging.WARNING, logger="robo_resume")
    other = {**saved, "library_version": "0.0.1"}
    ds = ChunkedEpisodeDataset(tab_root, **KW, resume_state=other)
    assert ds.resume_state.library_version == "0.0.1"
    assert "written by robo_resume 0.0.1, this is robo_resume 0.1.0" in caplog.text
    assert f"format version {STATE_VERSION}" in caplog.text
    caplog.clear()
    ChunkedEpisodeDataset(tab_root, **KW, resume_state=saved)
    assert caplog.text == ""


# --------------------------------------------------------------------------- fingerprints


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (
            {"seed": 1},
            r"different 'seed'.*Expected seed=1 .this dataset.*Found seed=0 "
            r".the state.*Fix: pass the same seed.*strict=False",
        ),
        ({"chunk_frames": 9}, r"different 'plan'.*Fix: pass the same chunk_frames"),
        (
            {"episodes": [0, 1, 2]},
            r"different 'episodes'.*other differing fields: "
            r"\['plan', 'total_frames'\].*Fix: pass the same episodes= selection",
        ),
        # batch_size may change with a resume_state (elastic resume, tests/test_elastic.py)
        ({"drop_last": True}, r"different 'drop_last'.*Fix: construct the dataset with the same"),
        ({"infinite": True}, r"different 'mode'.*Expected mode='infinite'.*Found mode='epoch'"),
    ],
)
def test_state_for_other_options_is_refused(tab_root, saved, change, pattern):
    with pytest.raises(ResumeStateError, match=pattern):
        ChunkedEpisodeDataset(tab_root, **{**KW, **change}, resume_state=saved)


def test_state_for_another_dataset_is_refused(factory, saved):
    other = factory(episode_lengths=(10, 12, 14), num_cameras=0).root
    with pytest.raises(
        ResumeStateError,
        match=r"different 'dataset'.*Fix: the state belongs to another dataset.*pass the root",
    ):
        ChunkedEpisodeDataset(other, **KW, resume_state=saved)


def test_strict_false_logs_instead_of_raising(tab_root, saved, caplog):
    ds = ChunkedEpisodeDataset(tab_root, **{**KW, "seed": 5, "chunk_frames": 9})
    state = ResumeState.from_dict(saved)
    caplog.set_level(logging.WARNING, logger="robo_resume")
    state.check_fingerprint(ds.fingerprint, strict=False)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.name for r in warnings] == ["robo_resume", "robo_resume"]
    assert "frames may be replayed or lost" in warnings[0].getMessage()
    assert "different 'plan'" in warnings[0].getMessage()
    assert "different 'seed'" in warnings[1].getMessage()
    assert "strict=False" in ResumeState.check_fingerprint.__doc__
    assert "replay or lose frames" in " ".join(ResumeState.check_fingerprint.__doc__.split())
    with pytest.raises(ResumeStateError, match="different 'plan'"):
        state.check_fingerprint(ds.fingerprint)


def test_merge_refuses_other_runs(saved):
    a = ResumeState.from_dict(saved)
    b = ResumeState.from_dict({**saved, "fingerprint": {**saved["fingerprint"], "seed": 3}})
    with pytest.raises(ResumeStateError, match=r"Cannot merge states made for a different 'seed'"):
        a.merged(b)
    assert a.merged(a) == a


# --------------------------------------------------------------------------- malformed states


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        ({"format": "x"}, r"not a robo_resume state.*Fix: pass the value saved"),
        ({"batches": -1}, r"field 'batches'.*Expected an int >= 0.*Found -1"),
        ({"batches": True}, r"field 'batches'.*Found True"),
        ({"world_size": 0}, r"field 'world_size'.*Expected an int >= 1"),
        ({"num_workers": 1.5}, r"field 'num_workers'.*Found 1\.5"),
        ({"fingerprint": [1]}, r"field 'fingerprint'.*Expected a dict.*Found list"),
        ({"cursors": [[0, 0, 0]]}, r"cursors are malformed.*\[rank, role, epoch, position\]"),
        ({"cursors": [[0, 0, 0, -2]]}, r"cursor field 'position'.*Found -2"),
        ({"cursors": [[0, 0, 0, 1], [0, 0, 0, 2]]}, r"two cursors for one stream.*rank=0, role=0"),
        ({"cursors": [[1, 0, 0, 1]]}, r"outside the state's topology.*rank < 1 and role < 1"),
        ({"library_version": 3}, r"field 'library_version'.*a version string"),
    ],
)
def test_malformed_states_are_refused(saved, edit, pattern):
    with pytest.raises(ResumeStateError, match=pattern):
        ResumeState.from_dict({**saved, **edit})


def test_missing_keys_and_bad_json():
    with pytest.raises(ResumeStateError, match=r"lacks keys.*missing \['world_size'"):
        ResumeState.from_dict({"format": "robo_resume.state", "version": 3, "fingerprint": {}})
    with pytest.raises(ResumeStateError, match=r"not valid JSON"):
        ResumeState.from_dict("{oops")


# --------------------------------------------------------------------------- state files


def test_save_and_load_state(tmp_path, tab_root, saved):
    path = save_state(saved, tmp_path / "run" / "data_state.json")
    assert json.loads(path.read_text()) == saved
    state = load_state(path)
    assert state.to_dict() == saved
    ds = ChunkedEpisodeDataset(tab_root, **KW, resume_state=state)
    assert ds.start_point(0)[2] == 3
    assert sorted(os.listdir(path.parent)) == ["data_state.json"]


def test_state_file_errors(tmp_path, saved):
    with pytest.raises(MissingFileError, match=r"state file is missing.*nope\.json"):
        load_state(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "robo_')
    with pytest.raises(CorruptFileError, match=r"not valid JSON.*bad\.json.*Fix"):
        load_state(bad)
    bad.write_text(json.dumps({**saved, "version": 7}))
    with pytest.raises(ResumeStateError, match=r"version 7.*Read from file .*bad\.json"):
        load_state(bad)
    good = save_state(saved, tmp_path / "good.json")
    with pytest.raises(ResumeStateError, match="field 'batches'"):
        save_state({**saved, "batches": -1}, good)  # validated before it replaces a good file
    assert load_state(good).to_dict() == saved
    with pytest.raises(MissingFileError, match=r"checkpoint file is missing.*ckpt\.pt"):
        load_checkpoint(tmp_path / "ckpt.pt")


def test_failed_write_keeps_old_file_and_no_temp(tmp_path):
    path = save_checkpoint({"step": 1}, tmp_path / "ckpt.pt")

    def boom(f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, boom)
    assert load_checkpoint(path) == {"step": 1}
    assert os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.skipif(sys.platform == "win32", reason="flock-based cleanup is POSIX only")
def test_cleanup_spares_live_writers_and_removes_dead_ones(tmp_path):
    import fcntl

    path = tmp_path / "ckpt.pt"
    live = tmp_path / ".ckpt.pt.live.tmp"
    dead = tmp_path / ".ckpt.pt.dead.tmp"
    other = tmp_path / ".other.pt.dead.tmp"
    for p in (live, dead, other):
        p.write_bytes(b"x")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a save in progress holds
    try:
        save_checkpoint({"step": 2}, path)
        assert sorted(os.listdir(tmp_path)) == sorted(
            [".ckpt.pt.live.tmp", ".other.pt.dead.tmp", "ckpt.pt"]
        )
    finally:
        os.close(fd)
    save_checkpoint({"step": 3}, path)
    assert sorted(os.listdir(tmp_path)) == [".other.pt.dead.tmp", "ckpt.pt"]


@pytest.mark.skipif(sys.platform == "win32", reason="flock-based cleanup is POSIX only")
def test_dead_writers_leftovers_are_gone_before_the_save_creates_its_own(tmp_path, monkeypatch):
    # A save killed after creating its temporary file but before cleaning up would otherwise
    # leave two leftovers (the old one and its own): the cleanup must come first.
    import tempfile

    path = save_checkpoint({"step": 1}, tmp_path / "ckpt.pt")
    (tmp_path / ".ckpt.pt.dead.tmp").write_bytes(b"x")  # a killed writer's: no lock held
    seen = []
    real_mkstemp = tempfile.mkstemp

    def spy(*args, **kwargs):
        seen.append(sorted(n for n in os.listdir(tmp_path) if n.endswith(".tmp")))
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    save_checkpoint({"step": 2}, path)
    assert seen == [[]], f"leftovers still there when the save created its own file: {seen}"
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    assert load_checkpoint(path) == {"step": 2}


# --------------------------------------------------------------------------- SIGKILL while saving

# A "zygote" imports torch once and forks one saver per round (a fresh interpreter per round
# would spend ~2 s importing torch). Each saver alternately saves a 4 MB checkpoint whose tensor
# is filled with the step and a JSON state whose every cursor holds the step, logging
# "B <kind> <step>" before and "D <kind> <step>" after each save.
ZYGOTE = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from robo_resume.checkpoint import save_checkpoint, save_state
    from robo_resume.state import ResumeState, StreamCursor

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed savers are reaped automatically
    print("ready", flush=True)
    for line in sys.stdin:
        start, ckpt, state, log = line.split()
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(1)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            step = int(start)
            while True:
                os.write(fd, f"B ckpt {step}\\n".encode())
                weights = torch.full((1 << 20,), step, dtype=torch.int32)
                save_checkpoint({"step": step, "weights": weights}, ckpt)
                os.write(fd, f"D ckpt {step}\\n".encode())
                os.write(fd, f"B state {step}\\n".encode())
                cursors = tuple(StreamCursor(r, w, 0, step) for r in range(32) for w in range(16))
                save_state(ResumeState({"step": step}, 32, 16, step, cursors), state)
                os.write(fd, f"D state {step}\\n".encode())
                step += 1
        print(pid, flush=True)
    """
)


def _gone(pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.002)
    raise AssertionError(f"saver {pid} still alive after SIGKILL")


def _expected(log: Path, kind: str, before: int) -> set[int]:
    """Steps the file may hold: the last completed save's, or the one in flight."""
    done, started = before, None
    if not log.exists():  # killed before the saver wrote its first line (a slow fork under load)
        return {done}
    for line in log.read_text().splitlines():
        k, what, step = line.split()
        if what != kind:
            continue
        if k == "D":
            done, started = int(step), None
        else:
            started = int(step)
    return {done} if started is None else {done, started}


def _check_ckpt(path: Path, allowed: set[int]) -> int:
    ck = load_checkpoint(path)
    step = ck["step"]
    assert step in allowed, (step, allowed)
    w = ck["weights"]
    assert w.shape == (1 << 20,) and bool((w == step).all()), f"torn checkpoint at step {step}"
    return step


def _check_state(path: Path, allowed: set[int]) -> int:
    st = load_state(path)
    step = st.batches
    assert step in allowed, (step, allowed)
    assert st.fingerprint == {"step": step} and len(st.cursors) == 512
    assert {c.position for c in st.cursors} == {step}, f"torn state at step {step}"
    return step


@pytest.mark.slow(13)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.timeout(180)
def test_sigkill_while_saving_never_breaks_files(tmp_path):
    ckpt, state = tmp_path / "ckpt.pt", tmp_path / "state.json"
    save_checkpoint({"step": 0, "weights": torch.zeros(1 << 20, dtype=torch.int32)}, ckpt)
    save_state(
        ResumeState(
            {"step": 0},
            32,
            16,
            0,
            tuple(StreamCursor(r, w, 0, 0) for r in range(32) for w in range(16)),
        ),
        state,
    )
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    rng = random.Random(1234)
    kills, torn_writes, steps = 0, 0, {"ckpt": 0, "state": 0}
    try:
        assert zygote.stdout.readline().strip() == "ready"
        while kills < 40:  # by count, not by time: a loaded CI machine only makes it slower
            log = tmp_path / f"log{kills}.txt"
            zygote.stdin.write(f"{max(steps.values()) + 1} {ckpt} {state} {log}\n")
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline())
            time.sleep(rng.uniform(0.01, 0.3))
            os.kill(pid, signal.SIGKILL)
            _gone(pid)
            kills += 1
            steps["ckpt"] = _check_ckpt(ckpt, _expected(log, "ckpt", steps["ckpt"]))
            steps["state"] = _check_state(state, _expected(log, "state", steps["state"]))
            names = os.listdir(tmp_path)
            for target in ("ckpt.pt", "state.json"):
                tmps = [n for n in names if n.startswith(f".{target}.") and n.endswith(".tmp")]
                assert len(tmps) <= 1, f"temporary files pile up: {tmps}"
                torn_writes += len(tmps)
    finally:
        zygote.stdin.close()
        zygote.kill()
        zygote.wait()
    assert kills == 40
    assert torn_writes >= 1, "no kill landed during a write; the test proves nothing"
    assert steps["ckpt"] >= 10, "the savers made no progress"
    # The next successful save removes the leftovers of the killed savers.
    save_checkpoint({"step": -1}, ckpt)
    save_state(ResumeState({}, 1, 0, 0), state)
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith("log")) == [
        "ckpt.pt",
        "state.json",
    ]


class _RunsCode:
    """Pickles to a call of os.system: what a malicious checkpoint file holds."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_load_checkpoint_refuses_pickled_code_and_runs_none(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"step": 3, "payload": _RunsCode(marker)}, path)
    with pytest.raises(CorruptFileError, match=r"safe loading refuses.*evil\.pt.*trusted=True"):
        load_checkpoint(path)
    assert not marker.exists(), "loading the checkpoint ran code pickled into it"
    # on purpose, for a file one wrote oneself: the code runs (this is what trusted means)
    load_checkpoint(path, trusted=True)
    assert marker.exists()


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_load_checkpoint_refuses_a_plain_pickle_that_runs_code(tmp_path, protocol):
    """Not a torch zip file: a bare pickle stream (torch's legacy path) is refused the same way."""
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"step": 1, "x": _RunsCode(marker)}, protocol=protocol))
    with pytest.raises(CorruptFileError, match=r"safe loading refuses.*evil\.pkl.*trusted=True"):
        load_checkpoint(path)
    assert not marker.exists(), "loading the checkpoint ran code pickled into it"


def test_load_checkpoint_loads_what_save_checkpoint_is_for(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    data = {"version": 3, "cursors": [[0, 0, 0, 5]], "seed": 0.5, "name": "x"}
    saved = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7, "data": data}
    path = save_checkpoint(saved, tmp_path / "ok.pt")
    loaded = load_checkpoint(path)
    assert loaded["step"] == 7 and loaded["data"] == saved["data"]
    assert torch.equal(loaded["model"]["weight"], saved["model"]["weight"])
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
