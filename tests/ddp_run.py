"""Launched by tests/test_ddp.py with torchrun (2 CPU processes, gloo): training runs.

Each ``--job`` (a JSON object) is one training run from a new dataset and loader, run one after
the other in these processes (one torchrun start for several runs): ``out`` (folder), ``root``,
optional ``mix`` (a second root: a 1:3 MixedDataset, batches logged as [source, index list]),
``epochs`` (default 2), ``crash_at`` (stop after that many batches, saving the gathered resume
state to ``out/state.json`` as a checkpoint would, like a killed job) and ``resume`` (a
state.json to start from). Each rank writes ``out/rank{R}.json``: the batches it consumed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from robo_resume import ChunkedEpisodeDataset, MixedDataset, MixSource

BATCH_SIZE, NUM_WORKERS = 5, 2


def run(spec: dict[str, Any]) -> None:
    """One training run as ``spec`` says (see the module docstring)."""
    rank = dist.get_rank()
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    mix, crash_at = spec.get("mix"), spec.get("crash_at", 0)
    state = json.loads(Path(spec["resume"]).read_text()) if spec.get("resume") else None
    if mix:
        ds = MixedDataset(
            [MixSource(spec["root"], 1), MixSource(mix, 3)],
            batch_size=BATCH_SIZE,
            seed=7,
            chunk_frames=8,
            exhausted="stop",
            resume_state=state,
        )
    else:
        ds = ChunkedEpisodeDataset(
            spec["root"], batch_size=BATCH_SIZE, seed=7, chunk_frames=8, resume_state=state
        )
    assert ds.world_size == 2 and ds.rank == rank, (ds.rank, ds.world_size)
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=NUM_WORKERS)
    batches = []
    epochs = spec.get("epochs", 2)
    if state is not None and mix:
        epochs -= ds.epochs_started(state, NUM_WORKERS)
    elif state is not None:
        from robo_resume.audit import epochs_started

        epochs -= epochs_started(ds, state, NUM_WORKERS)
    done = False
    for _ in range(epochs):
        for batch in loader:
            batch = tracker.consume(batch)
            index = batch["index"].tolist()
            batches.append([tracker.last_source, index] if mix else index)
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
    p.add_argument("--job", action="append", required=True, type=json.loads)
    a = p.parse_args()
    dist.init_process_group("gloo")
    for spec in a.job:
        run(spec)
    dist.destroy_process_group()
    # Every file the test reads is written and closed (each run's loaders are done): end here
    # rather than through Python's shutdown of torch and robo_resume, which the test does not
    # check and which held both ranks (and so torchrun) about a second longer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # workers start from a forkserver, which imports this file
    main()
