"""SIGKILL and resume of a training run over a remote dataset, with faults on the wire.

tests/fault_train.py's zygote forks each training run; ``--root`` is the dataset's URL on a
loopback server (plain HTTP, S3 on moto) that answers some requests with 503 or resets the
connection mid-body while the runs read. A run is SIGKILLed after its checkpoint at about 75%
of the epoch, then resumed from it twice: with the same topology (2 workers, batch 8) and
elastically (1 worker, batch 6). Checked:

- exactly once: the frames the killed run consumed up to its checkpoint plus the resumed run's
  are the epoch's frames, each once; with the same topology in the uninterrupted order;
- the items are the local folder's (per frame, a hash of every tensor's row: images included);
- the resumed run fetches nothing for the chunks already consumed: its mp4 range requests (from
  the server's log) cover well under half the bytes of a whole epoch's run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import moto  # noqa: F401 - the dev extra installs it: a missing one fails, never skips
import obstore  # noqa: F401
import pytest
from remote_servers import FolderServer, S3Server

from robo_resume import ChunkedEpisodeDataset, StreamTuning
from robo_resume.remote.files import WHOLE_FILE

HERE = Path(__file__).resolve().parent
LENGTHS = (37, 52, 29, 44, 61, 33, 48, 40)  # 344 frames: 43 batches of 8 per epoch
BATCH, SEED, CHUNK = 8, 5, 16
MP4 = "videos/observation.images.cam0/chunk-000/file-000.mp4"


@pytest.fixture(scope="module")
def big(factory) -> Path:
    """One mp4 of all episodes, larger than a file fetched whole (so reads are byte ranges)."""
    root = factory(
        episode_lengths=LENGTHS,
        episodes_per_file=len(LENGTHS),
        num_cameras=1,
        codec="mpeg4",
        gop=1,
        height=480,
        width=640,
    ).root
    assert (root / MP4).stat().st_size > WHOLE_FILE  # else the byte counts prove nothing
    return root


class Zygote:
    """tests/fault_train.py started once; :meth:`run` forks one training run."""

    def __init__(self, root: str, tmp: Path, env: dict[str, str]):
        self.err = tmp / "zygote.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, str(HERE / "fault_train.py"), "--root", root),
                    *("--workdir", str(tmp), "--every", "1", "--epochs", "1"),
                    *("--batch-size", str(BATCH), "--chunk-frames", str(CHUNK)),
                    *("--seed", str(SEED), "--order", "interleave", "--image-dtype", "uint8"),
                    "--digest",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=HERE.parent,
                env=env,
            )
        assert self._line().strip() == "ready"

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        assert line, f"the zygote died: {self.err.read_text()[-3000:]}"
        return line

    def run(self, n: int, workdir: Path, *options: str, on_step=None, kill_after=None) -> int:
        """Run ``n`` in ``workdir``; ``on_step(step)`` per consumed step; SIGKILL once a step
        after ``kill_after`` is seen. Returns the exit status (negative: the signal)."""
        workdir.mkdir(exist_ok=True)
        self.proc.stdin.write(f"run {n} {workdir} {' '.join(options)}\n")
        self.proc.stdin.flush()
        kind, pid = self._line().split()
        assert kind == "pid"
        status = None
        try:
            while status is None:
                line = self._line()
                if line.startswith("step"):
                    step = int(line.split()[1])
                    if on_step is not None:
                        on_step(step)
                    if kill_after is not None and step > kill_after:
                        os.kill(int(pid), signal.SIGKILL)
                        kill_after = None
                elif line.startswith("exit"):
                    status = int(line.split()[2])
        finally:
            try:
                os.killpg(int(pid), signal.SIGKILL)  # its DataLoader workers and forkserver
            except (ProcessLookupError, PermissionError):
                pass
        return status

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def steps_of(workdir: Path, run: int) -> list[dict]:
    events = [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]
    return [e for e in events if e["run"] == run and e["event"] == "step"]


def start_of(workdir: Path, run: int) -> int:
    events = [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]
    return next(e["resumed_from"] for e in events if e["run"] == run and e["event"] == "start")


def range_bytes(log, path: str) -> int:
    """Bytes asked for by the GETs of ``path`` in a server log (Range headers)."""
    total = 0
    for method, p, rng in log:
        if method == "GET" and p.endswith(path):
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng or "")
            assert m, f"a GET of the whole mp4: {rng}"
            total += int(m.group(2)) - int(m.group(1)) + 1
    return total


def frames(steps: list[dict]) -> dict[int, str]:
    """index -> digest of every frame consumed (each index once: asserted)."""
    pairs = [(i, d) for e in steps for i, d in zip(e["index"], e["digest"], strict=True)]
    twice = [i for i, c in Counter(i for i, _ in pairs).items() if c > 1]
    assert not twice, f"frames consumed twice: {twice}"
    return dict(pairs)


@pytest.mark.slow(45)
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["http", "s3"])
def test_sigkill_and_resume_over_a_faulty_remote_is_exact(big, tmp_path, kind):
    total = sum(LENGTHS)
    env = dict(os.environ, ROBO_RESUME_CACHE=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    server: FolderServer | S3Server
    if kind == "http":
        server = FolderServer(big).start()
        url = server.url
    else:
        server = S3Server().start()
    zygote = None
    try:
        if kind == "s3":
            server.upload(big, "bucket", "ds")
            url = "s3://bucket/ds"
            env.update(
                AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="testing",
                AWS_REGION="us-east-1",
                AWS_ENDPOINT_URL=server.url,
            )
            env.pop("AWS_PROFILE", None)
        faults = server.faults

        def inject(step: int) -> None:  # while the run reads: 503s, then resets mid-body
            if step in (1, 9):
                faults.fail_next, faults.fail_status = 2, 503
            if step in (4, 12):
                faults.reset_next = 1

        t0 = time.monotonic()
        zygote = Zygote(url, tmp_path, env)
        print(f"\nzygote ready after {time.monotonic() - t0:.1f} s")
        n = ChunkedEpisodeDataset(
            big,
            batch_size=BATCH,
            seed=SEED,
            chunk_frames=CHUNK,
            tuning=StreamTuning(order="interleave"),
        ).batches_per_epoch(2)

        # the local folder, uninterrupted: the order and the items every remote run must give
        assert zygote.run(0, tmp_path / "local", "--root", str(big)) == 0
        local = steps_of(tmp_path / "local", 0)
        assert len(local) == n
        want = frames(local)
        assert sorted(want) == list(range(total))

        # the remote dataset, uninterrupted, with faults: the local run, and a whole epoch's bytes
        mark = len(faults.log)
        faults.fail_next = 1  # the run's first request (meta/info.json's HEAD) fails once
        assert zygote.run(1, tmp_path / "full", on_step=inject) == 0
        full = steps_of(tmp_path / "full", 1)
        assert [e["index"] for e in full] == [e["index"] for e in local]
        assert frames(full) == want
        full_bytes = range_bytes(faults.log[mark:], MP4)

        # killed after its checkpoint at about 75% of the epoch
        killed = tmp_path / "killed"
        at = -(-3 * n // 4)
        # its first video reads meet two 503s and a reset (the prefetch runs far ahead of the
        # steps on this small file: faults injected at a step may find no request left)
        faults.only = "videos/"
        faults.fail_next, faults.fail_status, faults.reset_next = 2, 503, 1
        status = zygote.run(2, killed, kill_after=at)
        assert status == -signal.SIGKILL
        assert faults.fail_next == 0 and faults.reset_next == 0  # every injected fault was met
        faults.only = None
        elastic = tmp_path / "elastic"
        elastic.mkdir()
        shutil.copy(killed / "ckpt.pt", elastic / "ckpt.pt")
        shutil.copy(killed / "log.jsonl", elastic / "log.jsonl")

        # resumed, same topology: exactly once, the uninterrupted order, few bytes
        mark = len(faults.log)
        faults.fail_next, faults.reset_next = 2, 1
        assert zygote.run(3, killed) == 0
        resumed_from = start_of(killed, 3)
        assert at <= resumed_from <= at + 1
        before = [e for e in steps_of(killed, 2) if e["step"] <= resumed_from]
        after = steps_of(killed, 3)
        assert [e["step"] for e in after] == list(range(resumed_from + 1, n + 1))
        assert [e["index"] for e in before + after] == [e["index"] for e in local]
        assert frames(before + after) == want
        resumed_bytes = range_bytes(faults.log[mark:], MP4)

        # resumed elastically (1 worker, batch 6): each frame once, the local items
        assert zygote.run(4, elastic, "--workers", "1", "--batch-size", "6") == 0
        assert start_of(elastic, 4) == resumed_from
        rest = steps_of(elastic, 4)
        assert all(len(e["index"]) <= 6 for e in rest)
        got = frames(before + rest)  # asserts that no frame comes twice
        assert sorted(got) == list(range(total)) and got == want
        elastic_bytes = range_bytes(faults.log[mark:], MP4) - resumed_bytes

        print(f"runs done after {time.monotonic() - t0:.1f} s")
        ratio = resumed_bytes / full_bytes
        print(
            f"\n{kind}: resumed at step {resumed_from} of {n} ({resumed_from / n:.0%}); mp4 bytes "
            f"asked: whole epoch {full_bytes}, resumed {resumed_bytes} ({ratio:.2f}), elastic "
            f"{elastic_bytes} ({elastic_bytes / full_bytes:.2f}); file {(big / MP4).stat().st_size}"
            "; faults: 4 503s and 2 resets in each of the uninterrupted and killed runs, 2 503s "
            "and a reset at the resumed run's start"
        )
        # Resumed at 75% of the epoch: well under the 75% a run that fetched the consumed
        # chunks again would ask for. Each worker's opens (the file's head and moov, twice with
        # 2 workers) and the retried ranges are fixed costs of a run, large for a 1.1 MB file.
        assert ratio < 0.7 and elastic_bytes / full_bytes < 0.5
    finally:
        if zygote is not None:
            zygote.close()
        server.stop()
