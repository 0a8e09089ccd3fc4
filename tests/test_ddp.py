"""DDP: 2 CPU processes under torchrun (gloo), crash and resume, every rank exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("ddp_run.py")


def torchrun(tmp_path, name, root, *extra):
    out = tmp_path / name
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPT),
        "--root",
        str(root),
        "--out",
        str(out),
        *extra,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def ranks(out: Path) -> list[list]:
    """Each rank's consumed batches, as ddp_run.py wrote them to ``out``."""
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(2)]


@pytest.mark.slow(20)
@pytest.mark.timeout(600)
def test_ddp_two_ranks_crash_and_resume(factory, tmp_path):
    root = factory(episode_lengths=(23, 41, 17, 30, 9, 26), num_cameras=0).root
    # one torchrun runs uninterrupted (full/), then from a new dataset and loader stops after
    # batch `crash` (crash/, with the gathered state); a second torchrun resumes from state.json
    crash = 9
    out = torchrun(tmp_path, "run", root, "--full-too", "--crash-at", str(crash))
    full, before = ranks(out / "full"), ranks(out / "crash")
    assert len(full[0]) == len(full[1]), "ranks must yield the same number of batches"
    n_epoch_batches = len(full[0]) // 2
    assert n_epoch_batches // 2 < crash < n_epoch_batches, "the crash is not mid-epoch 0"
    epoch0 = [i for r in full for b in r[:n_epoch_batches] for i in b]
    assert len(epoch0) == len(set(epoch0)), "a frame was given to two ranks in one epoch"
    total = sum((23, 41, 17, 30, 9, 26))
    assert total - len(epoch0) < 2 * 2 * 1, "more than the tail was dropped"

    assert all(len(b) == crash for b in before)
    state = json.loads((out / "crash" / "state.json").read_text())
    assert sorted({c[0] for c in state["cursors"]}) == [0, 1], "state must cover all ranks"
    after = ranks(torchrun(tmp_path, "resume", root, "--resume", str(out / "crash" / "state.json")))
    for rank in range(2):
        assert before[rank] + after[rank] == full[rank], f"rank {rank} resumed order differs"


@pytest.mark.slow(17)
@pytest.mark.timeout(120)
def test_ddp_mix_two_ranks_crash_and_resume(factory, tmp_path):
    """A 1:3 MixedDataset under torchrun: MixTracker.state_dict() gathers both ranks' mix
    positions and every source's cursors into one state, and each rank resumes exactly."""
    a = factory(episode_lengths=(23, 41, 17, 30, 9, 26), num_cameras=0).root
    b = factory(version="v2.1", episode_lengths=(19, 27, 12, 33), num_cameras=0).root
    run = ("--mix", str(b), "--epochs", "1")
    crash = 7  # as in test_ddp_two_ranks_crash_and_resume: full/ and crash/ from one torchrun
    out = torchrun(tmp_path, "run", a, *run, "--full-too", "--crash-at", str(crash))
    full, before = ranks(out / "full"), ranks(out / "crash")
    assert len(full[0]) == len(full[1]) > 4, "ranks must yield the same number of batches"
    assert len(full[0]) // 2 < crash < len(full[0]), "the crash is not mid-run"
    for source in (0, 1):
        seen = [i for r in full for s, idx in r if s == source for i in idx]
        assert len(seen) == len(set(seen)), f"source {source}: a frame on two ranks"
    assert {s for r in full for s, _ in r} == {0, 1}
    assert all(len(r) == crash for r in before)
    state = json.loads((out / "crash" / "state.json").read_text())
    assert state["kind"] == "mix"
    assert sorted({(m[0], m[1]) for m in state["mix"]}) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for src in state["sources"]:
        assert sorted({c[0] for c in src["cursors"]}) == [0, 1], "a source lacks a rank"
    after = ranks(
        torchrun(tmp_path, "resume", a, *run, "--resume", str(out / "crash" / "state.json"))
    )
    for rank in range(2):
        assert [tuple(x) for x in before[rank] + after[rank]] == [tuple(x) for x in full[rank]], (
            f"rank {rank} resumed order differs"
        )
