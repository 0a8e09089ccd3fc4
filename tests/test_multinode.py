"""Several machines: torchrun --nnodes=2 on one machine, crash and exact resume on every rank.

Two node groups of 2 processes each (4 ranks, gloo, 1 DataLoader worker per rank: 4 streams),
rendezvous at 127.0.0.1 (node 0's address, as on a cluster). Each node reads its own copy of
the dataset (the "local copy per node" layout): node 1 the copy given with ``--root``, node 0
the one the example generates itself without ``--root`` (as in the README's single-node
command, so this test also runs that path); the checkpoint and logs are in one shared folder.
The run is killed after step 5 (last checkpoint: step 3) and resumed with both nodes: every
rank's trained batches equal the uninterrupted run's exactly, and the epoch holds every frame
at most once over the 4 ranks.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from robo_resume import make_dataset

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


@pytest.mark.slow(60)
@pytest.mark.timeout(900)
def test_two_nodes_crash_and_resume_exactly_on_every_rank(tmp_path):
    copy = tmp_path / "node1" / "dataset"  # node 1's local copy of the example's dataset
    make_dataset(copy, episode_lengths=(31, 44, 27, 38), num_cameras=1)
    roots = [None, copy]  # node 0: the example generates its own (in each workdir)
    full, crash = tmp_path / "full", tmp_path / "crash"
    full.mkdir()
    crash.mkdir()
    outs = _nodes(full, roots)
    assert "finished at step" in outs[0] and f"on {NODES * PER_NODE} ranks" in outs[0]
    _nodes(crash, roots, "--stop-at-step", "5", ok=False)
    _nodes(crash, roots, "--resume")
    world = NODES * PER_NODE
    for rank in range(world):
        want = {s: v[0] for s, v in _steps(full / f"consumed.rank{rank}.txt").items()}
        got = {s: v[-1] for s, v in _steps(crash / f"consumed.rank{rank}.txt").items()}
        assert got == want, f"rank {rank}"
        assert len(want) >= 6, f"rank {rank}: {len(want)} steps, too few to cross the crash"
        replayed = [s for s, v in _steps(crash / f"consumed.rank{rank}.txt").items() if len(v) > 1]
        assert replayed == [4, 5], f"rank {rank}: steps run twice {replayed}"
    epoch = [
        i
        for r in range(world)
        for v in _steps(full / f"consumed.rank{r}.txt").values()
        for i in v[0]
    ]
    assert len(epoch) == len(set(epoch)), "a frame was delivered twice in one epoch"
    assert len(set(epoch)) > 0.8 * (31 + 44 + 27 + 38)
