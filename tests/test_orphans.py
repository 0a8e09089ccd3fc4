"""No orphans (issue 13 item 7): after SIGKILL of a training process, its DataLoader workers (and
a forkserver, and multiprocessing's resource tracker) exit, with every start method.

Without ``robo_resume.stream.lifetime`` the forkserver case fails: the workers hold the
forkserver's alive pipe open and the forkserver is their parent, so all of them stay forever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 30.0  # generous: measured 0.1 s (fork), 0.7 s (forkserver), 6.5 s (spawn)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for descendants")

TRAIN = """
import sys
import time

from robo_resume import ChunkedEpisodeDataset


def main():
    root, method = sys.argv[1], sys.argv[2]
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8, infinite=True)
    for step, batch in enumerate(ds.dataloader(num_workers=2, multiprocessing_context=method)):
        if step == 4:
            print("TRAINING", flush=True)
        time.sleep(0.02)  # the model's step


if __name__ == "__main__":
    main()
"""


def _descendants(pid: int) -> list[int]:
    """Processes below ``pid`` now (one scan of /proc; the test process only)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone (waiting for init to reap it)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.fixture(scope="module")
def train_script(tmp_path_factory, factory):
    root = factory(episode_lengths=(60, 45, 50), height=48, width=64).root
    script = tmp_path_factory.mktemp("orphans") / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    return script, root


@pytest.mark.slow(12)
@pytest.mark.timeout(90)
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_workers_exit_after_sigkill_of_training(train_script, method):
    script, root = train_script
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root), method],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    below: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "TRAINING", "the training loop did not start"
        below = _descendants(proc.pid)
        assert len(below) >= 2, f"expected 2 workers below the training process, found {below}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        start = time.monotonic()
        while any(_alive(p) for p in below) and time.monotonic() - start < BOUND_S:
            time.sleep(0.1)
        left = {
            p: Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:90]
            for p in below
            if _alive(p)
        }
        assert not left, f"{method}: still running {BOUND_S:.0f} s after SIGKILL: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in below:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
