"""Launched by tests/test_ddp.py with torchrun (2 CPU processes, gloo): training runs.

Writes out/rank{R}.json with the batches (index lists; with --mix, [source, index list]) this
rank consumed; with --crash-at it saves the gathered resume state (rank 0 writes state.json)
and stops, like a killed job. With --full-too, the same processes first run uninterrupted into
out/full and then, with a new dataset and loader, the crash run into out/crash: one torchrun
start instead of two (the resume always runs in a new torchrun, from state.json alone).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch.distributed as dist

from robo_resume import ChunkedEpisodeDataset, MixedDataset, MixSource


def run(a: argparse.Namespace, out: Path, crash_at: int) -> None:
    """One training run from a new dataset and loader; ``crash_at``: stop after that batch."""
    rank = dist.get_rank()
    out.mkdir(parents=True, exist_ok=True)
    state = json.loads(Path(a.resume).read_text()) if a.resume else None
    if a.mix:
        ds = MixedDataset(
            [MixSource(a.root, 1), MixSource(a.mix, 3)],
            batch_size=a.batch_size,
            seed=7,
            chunk_frames=8,
            exhausted="stop",
            resume_state=state,
        )
    else:
        ds = ChunkedEpisodeDataset(
            a.root, batch_size=a.batch_size, seed=7, chunk_frames=8, resume_state=state
        )
    assert ds.world_size == 2 and ds.rank == rank, (ds.rank, ds.world_size)
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=a.num_workers)
    batches = []
    epochs = a.epochs
    if state is not None and a.mix:
        epochs -= ds.epochs_started(state, a.num_workers)
    elif state is not None:
        from robo_resume.audit import epochs_started

        epochs -= epochs_started(ds, state, a.num_workers)
    done = False
    for _ in range(epochs):
        for batch in loader:
            batch = tracker.consume(batch)
            index = batch["index"].tolist()
            batches.append([tracker.last_source, index] if a.mix else index)
            if crash_at and len(batches) == crash_at:
                saved = tracker.state_dict()  # collective: gathers every rank's cursors
                if rank == 0:
                    (out / "state.json").write_text(json.dumps(saved))
                done = True
                break
        if done:
            break
    (out / f"rank{rank}.json").write_text(json.dumps(batches))
    dist.barrier()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=5)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--crash-at", type=int, default=0)
    p.add_argument("--full-too", action="store_true", help="first an uninterrupted run (see top)")
    p.add_argument("--resume", default=None)
    p.add_argument("--mix", default=None, help="a second root: train on a 1:3 MixedDataset")
    a = p.parse_args()

    dist.init_process_group("gloo")
    out = Path(a.out)
    if a.full_too:
        run(a, out / "full", 0)
        run(a, out / "crash", a.crash_at)
    else:
        run(a, out, a.crash_at)
    dist.destroy_process_group()


if __name__ == "__main__":  # workers start from a forkserver, which imports this file
    main()
