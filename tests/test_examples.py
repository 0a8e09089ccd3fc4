"""Every example runs on tiny data and does what its docstring says (so examples cannot rot)."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_example, run_script

from robo_resume import ChunkedEpisodeDataset
from robo_resume.audit import consume

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(*args, ok=True, timeout=300):
    r = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
    if ok:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def torchrun(*args, ok=True):
    return run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args, ok=ok)


def steps(path):
    """{step: [index, ...]} from a consumed log (the last line per step wins)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        step, *idx = map(int, line.split())
        out.setdefault(step, []).append(idx)
    return out


@pytest.mark.slow(5)
def test_train_policy_crash_and_resume(tmp_path, script_zygote):
    """Crash after step 7 (last checkpoint: step 5), resume: the uninterrupted order exactly.

    The uninterrupted order is computed in this process (the example's dataset and loader:
    batch 8, seed 0, chunk_frames 16, 2 workers, 2 epochs) rather than by a third run of the
    example: the crashed run's steps 1-7 are themselves uninterrupted and must agree with it.
    """
    crash = tmp_path / "crash"  # no --root: the example writes its own dataset there
    script = EXAMPLES / "train_policy.py"
    # each run forked from a zygote that imported torch and robo_resume (conftest.run_script)
    code, out, err = run_script(script_zygote, script, "--workdir", crash, "--stop-at-step", "7")
    assert code == 1 and "crashing after step 7 (last checkpoint: step 5)" in out, err[-3000:]
    code, out, err = run_script(script_zygote, script, "--workdir", crash, "--resume")
    assert code == 0, out[-2000:] + err[-3000:]
    make = functools.partial(
        ChunkedEpisodeDataset, crash / "dataset", batch_size=8, seed=0, chunk_frames=16
    )
    batches, _ = consume(make, num_workers=2, epochs=2)
    want = {step: idx for step, (_, idx) in enumerate(batches, 1)}
    assert sorted(want) == list(range(1, 37))  # 140 frames, batch 8, 2 workers: 18 per epoch
    got = steps(crash / "consumed.txt")
    # steps 6 and 7 ran twice (after the checkpoint, then again after the resume): the
    # training used the second run of them, which must equal the uninterrupted run exactly
    trained = {s: v[-1] for s, v in got.items()}
    assert trained == want
    assert [len(v) for s, v in sorted(got.items())][5:7] == [2, 2]
    # the crashed run's steps 6 and 7 (after the checkpoint) were uninterrupted too
    assert [got[s][0] for s in (6, 7)] == [want[6], want[7]]


def test_stateful_dataloader_example(capsys):
    out = run_example("stateful_dataloader.py", capsys=capsys)
    assert "identical to the uninterrupted run: True" in out, out


def test_uint8_on_device_example(tmp_path, capsys):
    out = run_example("uint8_on_device.py", "--workdir", tmp_path, "--num-workers", "2",
                      "--batches", "8", capsys=capsys)  # fmt: skip
    assert "identical to image_dtype='float32': True" in out, out
    assert "MiB as uint8" in out


def test_lerobot_policy_example(capsys):
    out = run_example("lerobot_policy.py", "--steps", "3", "--num-workers", "1", capsys=capsys)
    assert "trained ACT for 3 steps" in out, out


# examples/ddp_train.py (crash and exact resume on every rank, docs/distributed.md's commands)
# runs in tests/test_multinode.py as two torchrun node groups.


@pytest.mark.slow(19)
@pytest.mark.timeout(600)
def test_accelerate_example_and_the_pitfall(tmp_path):
    """The example's two runs, one torchrun start: in each rank, the example's main runs
    as documented, then with --prepare-loader (tests/example_runs.py)."""
    torchrun(Path(__file__).with_name("example_runs.py"), "accelerate_train.py",
             "--workdir", tmp_path, "---", "--workdir", tmp_path, "--prepare-loader")  # fmt: skip

    def frames(kind):
        return Counter(
            int(i)
            for r in range(2)
            for line in (tmp_path / f"consumed.{kind}.rank{r}.txt").read_text().splitlines()
            for i in line.split()
        )

    plain, prepared = frames("plain"), frames("prepared")
    total = 31 + 44 + 27 + 38
    assert sorted(plain) == list(range(total)) and set(plain.values()) == {1}
    assert sum(prepared.values()) < total / 2 + 8  # accelerate re-sharded: frames lost


@pytest.mark.slow(8)
def test_remote_dataset_example(tmp_path, monkeypatch):
    """The example serves a generated dataset over loopback HTTP, streams it with 2 forkserver
    workers, resumes on 1 worker and checks the frames against the local folder."""
    monkeypatch.setenv("ROBO_RESUME_CACHE", str(tmp_path / "cache"))
    r = run(EXAMPLES / "remote_dataset.py")
    assert "streamed 5 batches from http://127.0.0.1:" in r.stdout
    assert "resumed on 1 worker: 96 frames left of the epoch" in r.stdout
    assert "the same frames as the local folder, in the same order" in r.stdout
