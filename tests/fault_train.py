"""Training process for the SIGKILL fault-injection test (tests/test_faults.py).

A long-lived *zygote* (this script) imports torch and robo_resume once, prints ``ready`` and
then reads commands on stdin: ``run <id> [<workdir> [OPTIONS]]`` forks a fresh training process
(its own session, so the test can also remove its DataLoader workers; ``--workdir`` unless
given; OPTIONS, e.g. ``--workers 1 --batch-size 6``, override the zygote's own for this run),
prints ``pid <pid>``, waits for it and prints
``exit <pid> <status>`` (negative: killed by that signal); ``quit`` ends. The zygote runs no torch
code itself, so forking it is safe, and each training run costs a fork instead of a
two-second interpreter start, which lets one test SIGKILL and resume a run 20+ times.

``--root`` may be a remote dataset's URL (tests/test_remote_kill.py): the zygote has not
imported obstore (it checks), so each forked run opens its own client, and the run's
DataLoader workers start from a forkserver of their own (a remote dataset's default).

A training run resumes from ``<workdir>/ckpt.pt`` if present, trains a tiny model on
``ds.dataloader(num_workers=W)`` (``--workers``, 2), saves ``{"model", "optimizer", "step",
"data": tracker.state_dict()}`` atomically (``save_checkpoint``) every ``--every`` steps, and
appends one JSON line per event to ``<workdir>/log.jsonl`` with a single ``os.write`` on an
``O_APPEND`` descriptor (the kernel keeps it when the process is SIGKILLed; a line is never
cut by a kill):

- ``{"run", "event": "start", "resumed_from": step}``: the checkpoint this run continues;
- ``{"run", "event": "step", "step", "epoch", "index": [...]}``: a batch the loop consumed
  (with ``--digest``, also ``"digest": [...]``: per frame, a hash of every tensor's row);
- ``{"run", "event": "ckpt", "step"}``: written after the checkpoint file replaced the old one;
- ``{"run", "event": "done", "step"}``.

After logging a step it prints ``step <n>`` on stdout, which the test uses to time the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


def train(args: argparse.Namespace, run: int, workdir: str) -> None:
    """One training run (in a forked process)."""
    import torch

    from robo_resume import CURSOR_KEY, ChunkedEpisodeDataset, StreamTuning
    from robo_resume.audit import epochs_started
    from robo_resume.checkpoint import load_checkpoint, save_checkpoint

    work = Path(workdir)
    fd = os.open(work / "log.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(**event) -> None:
        event = {"run": run, **event, "t": round(time.time(), 3)}
        os.write(fd, (json.dumps(event) + "\n").encode())

    ckpt_path = work / "ckpt.pt"
    ckpt = load_checkpoint(ckpt_path) if ckpt_path.exists() else None
    ds = ChunkedEpisodeDataset(
        args.root,
        batch_size=args.batch_size,
        seed=args.seed,
        chunk_frames=args.chunk_frames,
        resume_state=ckpt["data"] if ckpt else None,
        tuning=StreamTuning(order=args.order),
        image_dtype=args.image_dtype,
    )
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    step = 0
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    log(event="start", resumed_from=step)
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=args.workers)
    epochs = args.epochs - (epochs_started(ds, ckpt["data"], args.workers) if ckpt else 0)
    for _ in range(epochs):
        for batch in loader:
            epoch = int(batch[CURSOR_KEY][-1, 3])
            batch = tracker.consume(batch)
            loss = torch.nn.functional.mse_loss(model(batch["observation.state"]), batch["action"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            extra = {"digest": frame_digests(batch)} if args.digest else {}
            log(event="step", step=step, epoch=epoch, index=batch["index"].tolist(), **extra)
            print(f"step {step}", flush=True)
            if step % args.every == 0:
                save_checkpoint(
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "step": step,
                        "data": tracker.state_dict(),
                    },
                    ckpt_path,
                )
                log(event="ckpt", step=step)
            if args.slow:
                time.sleep(args.slow)
    log(event="done", step=step)
    print("done", flush=True)


def frame_digests(batch: dict) -> list[str]:
    """Per frame of ``batch``, a hash of that frame's row of every tensor (images included)."""
    import hashlib

    import torch

    keys = sorted(k for k, v in batch.items() if isinstance(v, torch.Tensor))
    out = []
    for row in range(len(batch["index"])):
        h = hashlib.sha1()
        for k in keys:
            h.update(k.encode())
            h.update(batch[k][row].contiguous().numpy().tobytes())
        out.append(h.hexdigest()[:16])
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chunk-frames", type=int, default=16)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--order", default=None, choices=[None, "shuffle", "interleave"])
    p.add_argument("--image-dtype", default="float32")
    p.add_argument("--digest", action="store_true")
    return p


def main() -> int:
    args = parser().parse_args()

    # Import (and warm up) once here; every run is a fork. No data is read here: forking a
    # process whose Arrow or decoder threads are running is not safe.
    import pandas  # noqa: F401  (the metadata reader imports it on first use)
    import torch

    import robo_resume.audit
    import robo_resume.checkpoint  # noqa: F401

    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch.optim's
    opt.load_state_dict(opt.state_dict())  # lazily imported parts (about a second)

    if "obstore" in sys.modules:  # a client made here would not survive the forks
        raise SystemExit("fault_train: the zygote imported obstore before forking")
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] != "run":
            break
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()
                # not the zygote's command pipe (DataLoader workers close stdin when they start)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                sys.stdin = open(os.devnull)
                run_args = parser().parse_args(sys.argv[1:] + cmd[3:])  # later options win
                train(run_args, int(cmd[1]), cmd[2] if len(cmd) > 2 else args.workdir)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
