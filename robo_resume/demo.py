"""The demo: train a tiny policy, SIGKILL the training process, resume it, prove exactly-once.

``robo-resume demo`` (see :func:`run_demo`) runs the training loop of :func:`train` in a child
process (``python -m robo_resume.demo``), the way a real job runs. The child logs every consumed
batch and checkpoints model, optimizer, step and data state every few steps, atomically. The
parent kills it with SIGKILL at a random step after a checkpoint, starts it again from the
checkpoint, and compares the frames the training actually used (up to the checkpoint, then after
the resume) with the order of an uninterrupted run.

The child also keeps the per-step record of consumed stream positions that ``robo-resume train``
keeps (:class:`~robo_resume.lerobot_train.record.StepRecord`, saved in every checkpoint), and the
parent audits two checkpoints with it (:func:`~robo_resume.lerobot_train.audit.audit_record`):
the one the kill left (steps 1 to its step trained once, the rest pending) and the final one
(every frame of every epoch trained exactly once). ``--resume-workers``/``--resume-batch-size``
resume with another topology (elastically); the order then differs from an uninterrupted run's,
by design, and the counts and the audit are what is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lerobot_train.audit import RunAudit

__all__ = ["run_demo", "train"]


_last_progress: dict[str, int] = {}


def _progress(label: str, done: int, total: int) -> None:
    """A one-line progress bar on stderr (redrawn in place on a terminal, else every 25%)."""
    tty = sys.stderr.isatty()
    quarter = done * 4 // max(total, 1)
    key = done if tty else quarter
    if _last_progress.get(label) == key:
        return
    _last_progress[label] = key
    width = 30
    filled = int(width * done / max(total, 1))
    bar = "#" * filled + "-" * (width - filled)
    end = "\r" if tty and done < total else "\n"
    print(f"[demo] {label} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)


def _tiny_policy(state_dim: int, action_dim: int, cameras: int):
    """The demo's model: a strided conv per camera, pooled, concatenated with the state, ->
    action (the examples have their own copy, examples/tiny_policy.py, to replace freely)."""
    import torch
    from torch import nn

    class _Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, kernel_size=4, stride=4)
            self.head = nn.Sequential(
                nn.Linear(state_dim + 8 * cameras, 64), nn.ReLU(), nn.Linear(64, action_dim)
            )

        def forward(self, state, images):
            feats = [self.conv(img).relu().mean(dim=(2, 3)) for img in images]
            return self.head(torch.cat([state, *feats], dim=1))

    return _Tiny()


def train(args: argparse.Namespace) -> int:
    """The training job (runs in the child process); resumes from ``workdir/ckpt.pt`` if present."""
    import torch

    from .checkpoint import load_checkpoint, save_checkpoint
    from .dataset import CURSOR_KEY, ChunkedEpisodeDataset
    from .lerobot_train.record import RunHeader, StepRecord
    from .stream.loader import BatchLoader

    work = Path(args.workdir)
    ckpt_path = work / "ckpt.pt"
    ckpt = load_checkpoint(ckpt_path) if args.resume and ckpt_path.exists() else None
    t0 = time.perf_counter()
    ds = ChunkedEpisodeDataset(
        args.root,
        batch_size=args.batch_size,
        seed=args.seed,
        chunk_frames=args.chunk_frames,
        resume_state=ckpt["data"] if ckpt else None,
        episodes=[int(e) for e in args.episodes.split(",")] if args.episodes else None,
        on_error=args.on_error,
    )
    cams = ds.meta.camera_keys
    state_key = "observation.state" if "observation.state" in ds.meta.features else "state"
    action_key = "action" if "action" in ds.meta.features else "actions"
    sd = ds.meta.features[state_key]["shape"][0]
    ad = ds.meta.features[action_key]["shape"][0]
    torch.manual_seed(args.seed)
    model = _tiny_policy(sd, ad, len(cams))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=args.num_workers)
    assert isinstance(loader, BatchLoader)  # no collate_fn, not stateful
    # the per-step record of consumed stream positions (what the audit counts from), continued
    # from the checkpoint's and saved with every checkpoint, as robo-resume train keeps it
    record = StepRecord.from_files(ckpt["record"], where=ckpt_path) if ckpt else StepRecord([], [])
    record.begin(
        RunHeader.of_run(
            ds,
            first_step=step + 1,
            first_row=len(record.rows),
            num_workers=args.num_workers,
            tuning=None,
            resumed_from=ckpt_path if ckpt else None,
            start_state=ckpt["data"] if ckpt else None,
        )
    )

    def save() -> None:
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "data": tracker.state_dict(),
            "record": record.files(1),
        }
        save_checkpoint(state, ckpt_path)
        log.write(json.dumps({"event": "checkpoint", "run": run, "step": step}) + "\n")
        log.flush()

    run = "resumed" if ckpt else "first"
    first = True
    with open(work / "consumed.jsonl", "a") as log:
        for _epoch in loader.epochs(args.epochs):  # the epochs left after the checkpoint
            for batch in loader:
                record.add(step + 1, 0, batch[CURSOR_KEY])
                batch = tracker.consume(batch)
                if first:
                    log.write(
                        json.dumps(
                            {
                                "event": "first_batch",
                                "run": run,
                                "seconds": time.perf_counter() - t0,
                            }
                        )
                        + "\n"
                    )
                    first = False
                step += 1
                loss = torch.zeros(())
                if len(batch["index"]):  # on_error="skip" can empty a batch: no model step
                    pred = model(batch[state_key], [batch[c] for c in cams])
                    loss = torch.nn.functional.mse_loss(pred, batch[action_key])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                log.write(
                    json.dumps(
                        {
                            "event": "step",
                            "run": run,
                            "step": step,
                            "loss": round(loss.item(), 5),
                            "index": batch["index"].tolist(),
                        }
                    )
                    + "\n"
                )
                log.flush()
                if step % args.checkpoint_every == 0:
                    save()
                if args.slow:
                    time.sleep(args.slow)
        if step % args.checkpoint_every:
            save()  # the end of training: the audit checks every step
        log.write(
            json.dumps(
                {"event": "done", "run": run, "step": step, "seconds": time.perf_counter() - t0}
            )
            + "\n"
        )
    return 0


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by SIGKILL
            pass
    return out


def _child(
    args: argparse.Namespace, *extra: str, workers: int | None = None, batch: int | None = None
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "robo_resume.demo",
        "--root",
        str(args.root_path),
        "--workdir",
        str(args.workdir_path),
        "--batch-size",
        str(batch or args.batch_size),
        "--num-workers",
        str(args.num_workers if workers is None else workers),
        "--seed",
        str(args.seed),
        "--epochs",
        str(args.epochs),
        *(["--chunk-frames", str(args.chunk_frames)] if args.chunk_frames else []),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--slow",
        str(args.slow),
        "--on-error",
        args.on_error,
        *(["--episodes", ",".join(map(str, args.episode_list))] if args.episode_list else []),
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_demo(args: argparse.Namespace) -> dict[str, Any]:
    """Generate (or use) a dataset, train, SIGKILL, resume, compare. Returns the report."""
    import tempfile

    from .audit import consume
    from .dataset import ChunkedEpisodeDataset
    from .errors import format_ranges
    from .files import readable_episodes
    from .testing import make_dataset

    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="robo_resume_demo_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.root:
        root = Path(args.root)
    else:
        root = work / "dataset"
        print(f"[demo] writing a synthetic LeRobot v3.0 dataset to {root}", file=sys.stderr)
        make_dataset(
            root,
            episode_lengths=(97, 142, 88, 120, 75, 133, 64, 110),
            num_cameras=2,
            height=48,
            width=64,
            overwrite=True,
        )
    args.root_path, args.workdir_path = root, work / "train"
    args.workdir_path.mkdir(parents=True, exist_ok=True)
    for f in ("consumed.jsonl", "ckpt.pt"):
        (args.workdir_path / f).unlink(missing_ok=True)

    episodes = getattr(args, "episodes", None)
    if episodes == "readable":
        episodes = readable_episodes(root)
    args.on_error = getattr(args, "on_error", "raise")

    def make(**kw):
        return ChunkedEpisodeDataset(
            root,
            batch_size=args.batch_size,
            seed=args.seed,
            chunk_frames=args.chunk_frames,
            episodes=episodes,
            on_error=args.on_error,
            **kw,
        )

    ds = make()
    meta = ds.meta
    args.episode_list = ds.episodes if episodes is not None else None
    print(
        f"[demo] dataset {root}: LeRobot {meta.version}, {meta.num_episodes} episodes "
        f"({len(ds.episodes)} used), {meta.total_frames} frames, cameras {list(meta.camera_keys)}",
        file=sys.stderr,
    )
    trackers: list[Any] = []
    reference, _ = consume(
        make, num_workers=args.num_workers, epochs=args.epochs, trackers=trackers
    )
    skipped = trackers[0].skipped
    ref = [i for _, b in reference for i in b]
    total_steps = len(reference)
    rng = random.Random(args.kill_seed)
    kill_at = rng.randint(
        args.checkpoint_every + 1, max(args.checkpoint_every + 1, total_steps - 2)
    )
    if kill_at % args.checkpoint_every == 0:  # kill between checkpoints: work after one is redone
        kill_at += 1

    log_path = args.workdir_path / "consumed.jsonl"
    t_train = time.perf_counter()
    child = _child(args)
    steps = 0
    while child.poll() is None:
        steps = max([e["step"] for e in _read_log(log_path) if e["event"] == "step"], default=0)
        _progress(f"training (SIGKILL at step {kill_at})", min(steps, kill_at), kill_at)
        if steps >= kill_at:
            os.kill(child.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    child.wait()
    killed = child.returncode == -signal.SIGKILL
    events = _read_log(log_path)
    ckpts = [e["step"] for e in events if e["event"] == "checkpoint"]
    last_ckpt = max(ckpts, default=0)
    ran = [e for e in events if e["event"] == "step"]
    pre = [i for e in ran if e["step"] <= last_ckpt for i in e["index"]]
    print(
        f"[demo] killed with SIGKILL at step {max(e['step'] for e in ran)} "
        f"(last checkpoint: step {last_ckpt})",
        file=sys.stderr,
    )

    ckpt_path = args.workdir_path / "ckpt.pt"
    killed_ckpt = args.workdir_path / "ckpt_at_kill.pt"
    shutil.copyfile(ckpt_path, killed_ckpt)  # the resume overwrites it: audited below
    workers = getattr(args, "resume_workers", None)
    workers = args.num_workers if workers is None else workers
    batch = getattr(args, "resume_batch_size", None) or args.batch_size
    elastic = (workers, batch) != (args.num_workers, args.batch_size)
    t_resume = time.perf_counter()
    child = _child(args, "--resume", workers=workers, batch=batch)
    _, err = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the resumed training failed:\n{err[-2000:]}")
    wall = time.perf_counter() - t_resume
    events = _read_log(log_path)
    resumed = [e for e in events if e["event"] == "step" and e["run"] == "resumed"]
    post = [i for e in resumed for i in e["index"]]
    first_batch = next(
        e["seconds"] for e in events if e["event"] == "first_batch" and e["run"] == "resumed"
    )
    done = next(e for e in events if e["event"] == "done" and e["run"] == "resumed")
    got = pre + post
    want_c, got_c = Counter(ref), Counter(got)
    at_kill, final = _audit(killed_ckpt), _audit(ckpt_path)
    report = {
        "dataset": str(root),
        "episodes": list(ds.episodes),
        "on_error": args.on_error,
        "skip_summary": (
            f"{len(skipped)} chunk(s), {sum(r['stop'] - r['frame'] for r in skipped)} frames "
            f"of episodes {format_ranges(r['episode'] for r in skipped)} in the uninterrupted run"
            if skipped
            else None
        ),
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "epochs": args.epochs,
        "steps_uninterrupted": total_steps,
        "killed_at_step": max(e["step"] for e in ran),
        "killed_by_sigkill": killed,
        "resumed_from_checkpoint_step": last_ckpt,
        "resumed_with": {"num_workers": workers, "batch_size": batch, "elastic": elastic},
        "frames_replayed": sum((got_c - want_c).values()),
        "frames_lost": sum((want_c - got_c).values()),
        # another topology trains the rest of the epoch in another order, by design
        "order_identical": None if elastic else got == ref,
        "audit_at_kill": at_kill.to_dict(),
        "audit": final.to_dict(),
        "resume_to_first_batch_s": round(first_batch, 3),
        "resumed_process_wall_s": round(wall, 3),
        "throughput_frames_per_s": round(len(post) / max(done["seconds"] - first_batch, 1e-9)),
        "train_wall_s": round(t_resume - t_train, 3),
    }
    return report


def _audit(path: Path) -> RunAudit:
    """The audit of a demo checkpoint: its per-step record against its data state and step."""
    from .checkpoint import load_checkpoint
    from .lerobot_train.audit import audit_record
    from .lerobot_train.record import StepRecord
    from .state.resume import ResumeState

    ckpt = load_checkpoint(path)
    record = StepRecord.from_files(ckpt["record"], where=path)
    state = ResumeState.from_dict(ckpt["data"])
    return audit_record(record, state, int(ckpt["step"]), checkpoint=str(path))


def _child_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m robo_resume.demo")
    p.add_argument("--root", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--chunk-frames", type=int, default=None)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--episodes", default=None, help="comma-separated episode indices")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise")
    return train(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(_child_main())
