"""Several machines: torchrun --nnodes=2 on one machine, crash and exact resume on every rank.

Two node groups of 2 processes each (4 ranks, gloo, 1 DataLoader worker per rank: 4 streams),
rendezvous at 127.0.0.1 (node 0's address, as on a cluster). Each node reads its own copy of
the dataset (the "local copy per node" layout): node 1 the copy given with ``--root``, node 0
the one the example generates itself without ``--root`` (as in docs/distributed.md's single-node
command, so this test also runs that path); the checkpoint and logs are in one shared folder.
The run is killed after step 5 (last checkpoint: step 3) and resumed with both nodes to the end
of the epoch: every rank's trained batches, the 3 steps before the checkpoint from the killed
run and the rest from the resumed one, equal exactly the uninterrupted order of that rank,
and the epoch holds every frame at most once over the 4 ranks. The uninterrupted order is
computed in this process (the example's dataset and loader, with the rank given explicitly,
one worker, one epoch) rather than by a third two-node run: the killed run's steps 1-5 are
themselves an uninterrupted two-node run and must agree with it.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from robo_resume import ChunkedEpisodeDataset, make_dataset
from robo_resume.audit import consume

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NODES, PER_NODE = 2, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(workdir: Path, roots: list[Path | None], *extra: str, ok: bool = True) -> list[str]:
    """Run examples/ddp_train.py as NODES torchrun node groups; their outputs, node 0 first.

    ``roots[node]``: that node's ``--root``, or None to let the example generate its dataset.
    """
    port = _free_port()
    procs = []
    for node in range(NODES):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={NODES}",
            f"--node_rank={node}",
            f"--nproc_per_node={PER_NODE}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            str(EXAMPLES / "ddp_train.py"),
            "--workdir",
            str(workdir),
            *(["--root", str(roots[node])] if roots[node] is not None else []),
            *extra,
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # its own group: killed whole if it hangs
            )
        )
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for node, p in enumerate(procs):
        if ok:
            assert p.returncode == 0, f"node {node}:\n{outs[node][-3000:]}"
        else:
            assert p.returncode != 0, f"node {node} did not crash:\n{outs[node][-3000:]}"
    return outs


def _steps(path: Path) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = {}
    for line in path.read_text().splitlines():
        step, *idx = map(int, line.split())
        out.setdefault(step, []).append(idx)
    return out


def _uninterrupted(root: Path, world: int) -> list[dict[int, list[int]]]:
    """Each rank's uninterrupted batches ``{step: index list}``, computed here: the dataset and
    loader of examples/ddp_train.py (batch 4, seed 0, chunk_frames 16, 1 worker, 1 epoch) with
    the rank and world size given instead of taken from torch.distributed."""
    out = []
    for rank in range(world):
        make = functools.partial(
            ChunkedEpisodeDataset,
            root,
            batch_size=4,
            seed=0,
            chunk_frames=16,
            rank=rank,
            world_size=world,
        )
        batches, _ = consume(make, num_workers=1)
        out.append({step: idx for step, (_, idx) in enumerate(batches, 1)})
    return out


@pytest.mark.slow(54)
@pytest.mark.timeout(900)
def test_two_nodes_crash_and_resume_exactly_on_every_rank(tmp_path):
    copy = tmp_path / "node1" / "dataset"  # node 1's local copy of the example's dataset
    make_dataset(copy, episode_lengths=(31, 44, 27, 38), num_cameras=1)
    roots = [None, copy]  # node 0: the example generates its own (in the workdir)
    crash = tmp_path / "crash"
    crash.mkdir()
    _nodes(crash, roots, "--stop-at-step", "5", ok=False)
    outs = _nodes(crash, roots, "--resume")
    world = NODES * PER_NODE
    assert "finished at step" in outs[0] and f"on {world} ranks" in outs[0]
    uninterrupted = _uninterrupted(copy, world)
    trained = []
    for rank in range(world):
        want = uninterrupted[rank]
        logged = _steps(crash / f"consumed.rank{rank}.txt")
        got = {s: v[-1] for s, v in logged.items()}
        assert got == want, f"rank {rank}"
        assert len(want) >= 6, f"rank {rank}: {len(want)} steps, too few to cross the crash"
        replayed = [s for s, v in logged.items() if len(v) > 1]
        assert replayed == [4, 5], f"rank {rank}: steps run twice {replayed}"
        # the killed run's steps 4 and 5 (after the checkpoint) were uninterrupted too
        assert [logged[s][0] for s in (4, 5)] == [want[4], want[5]], f"rank {rank}"
        trained += [i for v in got.values() for i in v]
    assert len(trained) == len(set(trained)), "a frame was trained on twice in one epoch"
    assert len(set(trained)) > 0.8 * (31 + 44 + 27 + 38)
