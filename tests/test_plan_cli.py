"""``robo-resume plan`` without the dataset class: the same streams, and no torch import.

The command builds its schedule from the metadata, the selection and the plan functions
directly (``cli/plan.py``), so that it does not import torch (1.5 to 6 s of its cold start). The
oracle here is what the command computed before: ``ChunkedEpisodeDataset(...).schedule()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from robo_resume.cli import main

REPO = Path(__file__).resolve().parents[1]


def _oracle(root, *, step, batch_size, num_workers, world_size, seed, chunk_frames, episodes,
            infinite):  # fmt: skip
    from robo_resume import ChunkedEpisodeDataset
    from robo_resume.index.schedule import Topology
    from robo_resume.index.start import resume_point

    ds = ChunkedEpisodeDataset(
        root,
        batch_size=batch_size,
        seed=seed,
        chunk_frames=chunk_frames,
        episodes=episodes,
        resume_step=step * batch_size,
        infinite=infinite,
        rank=0,
        world_size=world_size,
    )
    sched = ds.schedule(num_workers)
    topo, wp, out = Topology(world_size, num_workers), max(num_workers, 1), []
    for rank in range(world_size):
        rp = resume_point(sched, step, infinite=infinite, rank=rank)
        for worker in range(wp):
            role = (worker + rp.rotation) % wp
            s = rp.starts[role]
            g = topo.stream_id(rank, role)
            where = [None, None, None]
            if s.position < sched.length(g):
                cur = sched.locate(s.epoch, g, s.position)
                seg, frame = sched.group(s.epoch, g, cur.group).frame(cur.offset)
                where = [seg.chunk_id, seg.episode_index, frame]
            out.append([rank, worker, g, s.epoch, s.position, *where])
    return out, sched.batches_per_rank, sched.frames_per_stream


CASES = [
    dict(step=5, batch_size=4, num_workers=2, world_size=2, seed=0, chunk_frames=None,
         episodes=None, infinite=False),
    dict(step=37, batch_size=3, num_workers=3, world_size=1, seed=7, chunk_frames=5,
         episodes="1,3-5", infinite=True),
    dict(step=11, batch_size=2, num_workers=0, world_size=3, seed=2, chunk_frames=9,
         episodes="train[:60%]", infinite=False),
    dict(step=400, batch_size=4, num_workers=2, world_size=1, seed=1, chunk_frames=16,
         episodes=None, infinite=True),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_plan_equals_the_dataset_schedule(factory, capsys, case):
    root = factory(num_cameras=0, episode_lengths=(23, 41, 17, 30, 12, 26, 9)).root
    argv = ["plan", str(root), "--json"]
    for k, v in case.items():
        if k == "infinite":
            argv += ["--infinite"] if v else []
        elif v is not None:
            argv += [f"--{k.replace('_', '-')}", str(v)]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    eps = case["episodes"]
    if eps is not None and "[" not in eps:
        eps = [i for p in eps.split(",") for i in range(int(p[0]), int(p[-1]) + 1)]
    want, per_rank, per_stream = _oracle(root, **{**case, "episodes": eps})
    keys = ("rank", "worker", "stream", "epoch", "position", "chunk", "episode", "frame")
    assert [[s[k] for k in keys] for s in got["streams"]] == want
    assert got["batches_per_epoch_per_rank"] == per_rank
    assert got["frames_per_stream"] == per_stream


def test_plan_starts_chunks_on_keyframes_like_the_dataset(factory, capsys):
    # long GOPs: the dataset's default (cut_at_keyframes=None) starts chunks on keyframes, and
    # the command must plan the same chunks (it planned them evenly before: other cursors)
    root = factory(num_cameras=1, episode_lengths=(40, 33, 52), codec="mpeg4", gop=12).root
    case = dict(step=9, batch_size=4, num_workers=2, world_size=1, seed=3, chunk_frames=8,
                episodes=None, infinite=True)  # fmt: skip
    from robo_resume import ChunkedEpisodeDataset

    assert ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8).keyframe_cuts
    argv = ["plan", str(root), "--json", "--step", "9", "--batch-size", "4", "--num-workers",
            "2", "--seed", "3", "--chunk-frames", "8", "--infinite"]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    want, per_rank, per_stream = _oracle(root, **case)
    keys = ("rank", "worker", "stream", "epoch", "position", "chunk", "episode", "frame")
    assert [[s[k] for k in keys] for s in got["streams"]] == want
    assert got["batches_per_epoch_per_rank"] == per_rank
    assert got["frames_per_stream"] == per_stream


@pytest.mark.parametrize("cameras", [0, 1])
def test_plan_command_does_not_import_torch(factory, tmp_path, cameras):
    root = factory(num_cameras=cameras, codec="mpeg4", gop=12).root
    code = (
        "import sys\n"
        "from robo_resume.cli import main\n"
        f"rc = main(['plan', {str(root)!r}, '--step', '3', '--batch-size', '2', '--json'])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("NO TORCH 0"), out.stdout[-300:]


def test_import_robo_resume_is_lazy_and_complete():
    code = (
        "import sys, robo_resume\n"
        "lazy = 'torch' not in sys.modules\n"
        "missing = [n for n in robo_resume.__all__ if getattr(robo_resume, n, None) is None]\n"
        "print(lazy, missing)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True []"
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        import robo_resume

        robo_resume.nope  # noqa: B018


def test_plan_takes_the_stream_flags_of_train(factory, capsys):
    """--stream.* parsed as robo-resume train parses them (the same values as plan's --order
    spelling); both at once, or a bad value, get train's message and exit code 2."""
    root = factory(num_cameras=0, episode_lengths=(23, 41, 17, 30, 12, 26, 9)).root
    base = ["plan", str(root), "--json", "--step", "7", "--batch_size", "4", "--num_workers", "2"]
    out = []
    for flags in (["--stream.order=interleave", "--stream.interleave=3"],
                  ["--order", "interleave", "--interleave", "3"], []):  # fmt: skip
        assert main([*base, *flags]) == 0
        out.append(json.loads(capsys.readouterr().out)["streams"])
    assert out[0] == out[1] != out[2]
    assert main([*base, "--stream.order=interleave", "--order", "interleave"]) == 2
    assert "Both --stream.* and plan's --order" in capsys.readouterr().err
    assert main([*base, "--stream.order=zigzag"]) == 2
    assert "Unknown --stream.order" in capsys.readouterr().err


def test_plan_prints_the_resume_line_a_resumed_dataset_logs(factory, capsys, caplog):
    """The `resume:` line of plan's text output is the line the dataset logs on resume."""
    import logging

    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    root = factory(num_cameras=0, episode_lengths=(23, 41, 17, 30, 12, 26, 9)).root
    argv = ["plan", str(root), "--step", "13", "--batch-size", "4", "--num-workers", "0",
            "--seed", "3", "--stream.order=interleave"]  # fmt: skip
    assert main(argv) == 0
    planned = [x for x in capsys.readouterr().out.splitlines() if x.startswith("resume: ")]
    ds = ChunkedEpisodeDataset(
        root,
        batch_size=4,
        seed=3,
        resume_step=13 * 4,
        tuning=StreamTuning(order="interleave"),
    )
    with caplog.at_level(logging.INFO, logger="robo_resume"):
        next(iter(ds.dataloader(num_workers=0)))
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume: st")]
    assert len(planned) == 1 and planned == logged, (planned, logged)
