"""DDP: 2 CPU processes under torchrun (gloo), crash and resume, every rank exactly once.

Both tests' runs take two torchrun starts (the ``runs`` fixture): the first runs, one after the
other, each from a new dataset and loader, the uninterrupted run and the run stopped after batch
``crash`` (saving the gathered state) of a plain dataset and of a 1:3 mix; the second resumes
both from their state.json alone, in new processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("ddp_run.py")
PLAIN = dict(episode_lengths=(23, 41, 17, 30, 9, 26), num_cameras=0)
CRASH, MIX_CRASH = 9, 7  # mid-epoch 0 of 2 epochs (16 batches each); mid-run of the 1-epoch mix


def torchrun(*runs: dict) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(SCRIPT), *(f"--job={json.dumps(r, default=str)}" for r in runs)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=360)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def ranks(out: Path) -> list[list]:
    """Each rank's consumed batches, as ddp_run.py wrote them to ``out``."""
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(2)]


@pytest.fixture(scope="module")
def runs(factory, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("ddp")
    a = factory(**PLAIN).root
    b = factory(version="v2.1", episode_lengths=(19, 27, 12, 33), num_cameras=0).root
    plain, mix = dict(root=a), dict(root=a, mix=b, epochs=1)
    torchrun(
        dict(plain, out=base / "plain" / "full"),
        dict(plain, out=base / "plain" / "crash", crash_at=CRASH),
        dict(mix, out=base / "mix" / "full"),
        dict(mix, out=base / "mix" / "crash", crash_at=MIX_CRASH),
    )
    torchrun(
        dict(plain, out=base / "plain" / "resume", resume=base / "plain" / "crash" / "state.json"),
        dict(mix, out=base / "mix" / "resume", resume=base / "mix" / "crash" / "state.json"),
    )
    return base


@pytest.mark.slow(30)
@pytest.mark.timeout(600)
def test_ddp_two_ranks_crash_and_resume(runs):
    out = runs / "plain"
    full, before = ranks(out / "full"), ranks(out / "crash")
    assert len(full[0]) == len(full[1]), "ranks must yield the same number of batches"
    n_epoch_batches = len(full[0]) // 2
    assert n_epoch_batches // 2 < CRASH < n_epoch_batches, "the crash is not mid-epoch 0"
    epoch0 = [i for r in full for b in r[:n_epoch_batches] for i in b]
    assert len(epoch0) == len(set(epoch0)), "a frame was given to two ranks in one epoch"
    total = sum(PLAIN["episode_lengths"])
    assert total - len(epoch0) < 2 * 2 * 1, "more than the tail was dropped"

    assert all(len(b) == CRASH for b in before)
    state = json.loads((out / "crash" / "state.json").read_text())
    assert sorted({c[0] for c in state["cursors"]}) == [0, 1], "state must cover all ranks"
    after = ranks(out / "resume")
    for rank in range(2):
        assert before[rank] + after[rank] == full[rank], f"rank {rank} resumed order differs"


@pytest.mark.slow(1)
@pytest.mark.timeout(600)
def test_ddp_mix_two_ranks_crash_and_resume(runs):
    """A 1:3 MixedDataset under torchrun: MixTracker.state_dict() gathers both ranks' mix
    positions and every source's cursors into one state, and each rank resumes exactly."""
    out = runs / "mix"
    full, before = ranks(out / "full"), ranks(out / "crash")
    assert len(full[0]) == len(full[1]) > 4, "ranks must yield the same number of batches"
    assert len(full[0]) // 2 < MIX_CRASH < len(full[0]), "the crash is not mid-run"
    for source in (0, 1):
        seen = [i for r in full for s, idx in r if s == source for i in idx]
        assert len(seen) == len(set(seen)), f"source {source}: a frame on two ranks"
    assert {s for r in full for s, _ in r} == {0, 1}
    assert all(len(r) == MIX_CRASH for r in before)
    state = json.loads((out / "crash" / "state.json").read_text())
    assert state["kind"] == "mix"
    assert sorted({(m[0], m[1]) for m in state["mix"]}) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for src in state["sources"]:
        assert sorted({c[0] for c in src["cursors"]}) == [0, 1], "a source lacks a rank"
    after = ranks(out / "resume")
    for rank in range(2):
        assert [tuple(x) for x in before[rank] + after[rank]] == [tuple(x) for x in full[rank]], (
            f"rank {rank} resumed order differs"
        )
