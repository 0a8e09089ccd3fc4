"""One live ``robo-resume train`` run per ``--output_dir`` (robo_resume/lerobot_train/lock.py),
and the way on after a run killed during its first save.

Real runs, forked from the zygotes of tests/test_lerobot_train.py's kind (one per concurrent
run: a zygote forks one run at a time). A run is held in the middle of a save by the
pipeline's test hook ``ROBO_RESUME_TRAIN_SAVE_PAUSE`` (robo_resume/lerobot_train/checkpoints.py,
``pause_for_tests``): it prints ``save paused: PARTIAL`` and waits for a file the test
creates. So "a second run while the first is alive" and "killed during its first save" happen
at a known point, not after a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from test_lerobot_train import TINY_ACT, _alive, _out_file, ckpt, env_for, resume_args, steps_of
from test_lerobot_train import train as run_train
from train_zygote import Zygote, kill_group

from robo_resume.lerobot_train.checkpoints import SAVE_PAUSE_ENV
from robo_resume.lerobot_train.lock import LOCK_FILE
from robo_resume.testing import make_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("lock")
    return make_dataset(
        base / "a", episode_lengths=(40, 25, 33, 30), num_cameras=1, height=48, width=64
    ).root


@pytest.fixture(scope="module")
def zygotes(tmp_path_factory):
    """Two zygotes (tests/train_zygote.py): the first run of a test from one, the runs started
    beside it from the other."""
    base = tmp_path_factory.mktemp("lock_zygotes")
    pair = tuple(Zygote(seed, env_for(None), base / f"zygote{seed}.err") for seed in (1, 2))
    try:
        for z in pair:
            z.launch()
        yield pair
    finally:
        for z in pair:
            z.close()


def args_for(root: Path, out: Path, *extra: str) -> list[str]:
    return [*TINY_ACT, "--dataset.repo_id=local/a", f"--dataset.root={root}", "--batch_size=4",
            "--seed=1", "--steps=4", "--save_freq=2", f"--output_dir={out}", *extra]  # fmt: skip


def start_paused(zygote: Zygote, args: list[str], log: Path, release: Path) -> tuple[int, Path]:
    """Fork ``robo-resume train ARGS`` whose saves wait for ``release``: (pid, output file)."""
    out_file = _out_file(zygote)
    env = dict(env_for(log), **{SAVE_PAUSE_ENV: str(release)})
    return zygote.start("robo-resume", ["train", *args], env, out_file), out_file


def wait_paused(out_file: Path, pid: int, count: int) -> None:
    """Wait until run ``pid`` has paused in its ``count``-th save (fails if it ends first)."""
    deadline = time.monotonic() + 240  # a hang guard, not a measurement
    while out_file.read_text().count("save paused:") < count:
        assert _alive(pid), f"the run ended before save {count}: {out_file.read_text()[-3000:]}"
        assert time.monotonic() < deadline, out_file.read_text()[-3000:]
        time.sleep(0.02)


def refused(text: str, pid: int) -> None:
    """``text`` is the refusal of a run started beside live run ``pid``."""
    assert "Another robo-resume train run is training into this --output_dir" in text, text[-3000:]
    assert f"Found PID {pid} on host {socket.gethostname()}, started " in text
    assert "or give this run another --output_dir" in text
    assert "Traceback" not in text and "num_learnable_params" not in text
    assert "Cannot resume" not in text and "The output directory exists" not in text


@pytest.mark.slow(30)
def test_a_second_run_into_a_live_runs_output_dir_is_refused(root, zygotes, tmp_path):
    """fresh-fresh (before and after the first run's first checkpoint) and fresh-resume: each
    refused naming the live run; the first run finishes intact."""
    out, release = tmp_path / "run", tmp_path / "release"
    args = args_for(root, out, "--num_workers=0")
    first, first_out = start_paused(zygotes[0], args, tmp_path / "first.idx", release)
    try:
        wait_paused(first_out, first, 1)  # in its first save: only a partial folder
        assert [p.name for p in (out / "checkpoints").iterdir()] == [f".000002.partial-{first}"]
        code, text = run_train(args, tmp_path / "second.idx", ok=False, zygote=zygotes[1])
        assert code == 2
        refused(text, first)
        release.touch()
        wait_paused(first_out, first, 2)  # checkpoint 2 complete, in its second save
        assert os.readlink(ckpt(out, "last")) == "000002"
        code, text = run_train(args, tmp_path / "second.idx", ok=False, zygote=zygotes[1])
        assert code == 2
        refused(text, first)  # not lerobot's "the output directory exists: resume it"
        code, text = run_train(
            [*args, *resume_args(out)], tmp_path / "second.idx", ok=False, zygote=zygotes[1]
        )
        assert code == 2
        refused(text, first)
        release.touch()
        code = zygotes[0].wait(first, 240)
    finally:
        if _alive(first):
            kill_group(first)
            zygotes[0].wait(first, 60)
    text = first_out.read_text()
    assert code == 0, text[-3000:]
    # the refused runs trained nothing and wrote nothing; the first run is whole
    assert not Path(f"{tmp_path / 'second.idx'}.rank0").exists()
    assert [s for s, _ in steps_of(tmp_path / "first.idx")] == [1, 2, 3, 4]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["000002", "000004", "last"]
    assert os.readlink(ckpt(out, "last")) == "000004"
    assert (out / LOCK_FILE).read_text() == ""  # released: the next run takes it silently
    from lerobot.policies.act.modeling_act import ACTPolicy

    ACTPolicy.from_pretrained(ckpt(out, "last") / "pretrained_model")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (its DataLoader workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.slow(30)
def test_killed_in_its_first_save_then_resume_says_start_fresh_and_fresh_takes_over(
    root, zygotes, tmp_path
):
    """A run SIGKILLed during its first save (only ``.000002.partial-PID`` left), its forked
    DataLoader workers kept alive (stopped): ``--resume=true`` says there is no complete
    checkpoint and to start fresh; the same command without it is accepted, takes the stale
    lock over with a WARNING naming the dead run, and removes the dead writer's partial folder
    (not a live process's)."""
    out, release = tmp_path / "run", tmp_path / "release"
    args = args_for(root, out, "--num_workers=2", "--dataloader_multiprocessing_context=fork")
    first, first_out = start_paused(zygotes[0], args, tmp_path / "first.idx", release)
    workers: list[int] = []
    try:
        wait_paused(first_out, first, 1)
        partial = out / "checkpoints" / f".000002.partial-{first}"
        assert [p.name for p in (out / "checkpoints").iterdir()] == [partial.name]
        # The workers were forked after the lock was taken: they hold the lock file open. Kept
        # alive (stopped) past the trainer's death, they must not keep the directory locked.
        workers = children(first)
        assert len(workers) == 2, workers
        lock = str(out / LOCK_FILE)
        for w in workers:
            assert lock in [os.readlink(fd) for fd in Path(f"/proc/{w}/fd").iterdir()]
            os.kill(w, signal.SIGSTOP)
        os.kill(first, signal.SIGKILL)
        assert zygotes[0].wait(first, 60) == -signal.SIGKILL
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == first  # stale, not released

        code, text = run_train([*args, *resume_args(out)], ok=False, zygote=zygotes[1])
        assert code == 2, text[-3000:]
        assert "Cannot resume: the run has no complete checkpoint yet" in text, text[-3000:]
        assert f"only {partial.name} (a save that was interrupted)" in text
        assert f"--output_dir={out}), without --resume and --config_path" in text
        assert "Traceback" not in text

        live = out / "checkpoints" / f".000002.partial-{os.getpid()}"  # a live PID: not removed
        live.mkdir()
        _, text = run_train(args, tmp_path / "fresh.idx", zygote=zygotes[1])
    finally:
        kill_group(first)  # the stopped workers (SIGKILL ends stopped processes too)
        if _alive(first):
            zygotes[0].wait(first, 60)
    assert f"named PID {first} on host {socket.gethostname()}, started " in text
    assert "which ended without releasing it (killed, or its machine stopped): this run takes " \
        "it over" in text  # fmt: skip
    assert f"removed what interrupted saves of dead runs left in {out / 'checkpoints'}: " \
        f"{partial.name}" in text  # fmt: skip
    assert not partial.exists() and live.is_dir()
    assert [s for s, _ in steps_of(tmp_path / "fresh.idx")] == [1, 2, 3, 4]
    visible = sorted(p.name for p in (out / "checkpoints").iterdir() if p != live)
    assert visible == ["000002", "000004", "last"]


@pytest.mark.slow(5)
def test_a_lock_of_another_host_is_refused_with_the_file_to_remove(root, zygotes, tmp_path):
    """A lock file naming a run on another host (nobody holds it here): refused, naming the
    file to remove if that run is dead."""
    out = tmp_path / "run"
    (out / "checkpoints" / ".000002.partial-4242").mkdir(parents=True)
    holder = {"pid": 4242, "host": "gpu-node-7", "started": "2026-01-01 10:00:00 +0000"}
    (out / LOCK_FILE).write_text(json.dumps(holder))
    code, text = run_train(args_for(root, out, "--num_workers=0"), ok=False, zygote=zygotes[1])
    assert code == 2, text[-3000:]
    assert "locked by a run on another host, which cannot be checked from here" in text
    assert "Found PID 4242 on host gpu-node-7, started 2026-01-01 10:00:00 +0000" in text
    assert f"remove the lock file (rm {out / LOCK_FILE}) and run the same command again" in text
    assert (out / "checkpoints" / ".000002.partial-4242").is_dir()  # not ours to remove
