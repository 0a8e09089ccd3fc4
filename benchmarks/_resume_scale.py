"""Resume at scale (part of ``resume.py``): what a resume at a late step costs before any frame
is decoded, from 10^3 to 10^6 episodes, and its growth per decade.

Synthetic v3.0 ``meta/`` folders (two cameras, no data or video files: decoding needs real
files, which do not exist at 10^6 episodes), one rank of 4 with 8 workers, a resume at step
10^6 (batch 32). Timed, in one process, in order:

- ``load``: ``load_metadata(root)``;
- ``construct``: ``ChunkedEpisodeDataset(meta=..., resume_step=10^6 * 32, infinite=True,
  world_size=4, rank=0)`` (the plan);
- ``share``: ``start_point(8)`` and ``share_schedule(8)``: the epoch layout, computed in the
  main process before the workers start (they inherit it);
- ``locate``: each of the rank's 8 streams locates its start (what each worker does before it
  opens its first file), one after another.

``total`` is their sum: the time to the first file opened after a resume, less imports.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import _common as C

from robo_resume import ChunkedEpisodeDataset, load_metadata
from robo_resume.index.schedule import Topology

STEP = 10**6
BATCH = 32
WORLD, WORKERS = 4, 8


def resume_locate(root: Path) -> dict[str, float]:
    """The four timed parts (seconds) of a resume at step 10^6 on ``root``."""
    t = {}
    t0 = time.perf_counter()
    meta = load_metadata(root)
    t["load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = ChunkedEpisodeDataset(
        root,
        meta=meta,
        batch_size=BATCH,
        resume_step=STEP * BATCH,
        infinite=True,
        world_size=WORLD,
        rank=0,
    )
    t["construct_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, starts, _ = ds.start_point(WORKERS)
    ds.share_schedule(WORKERS)
    t["share_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sched, topo = ds.schedule(WORKERS), Topology(WORLD, WORKERS)
    for role, (epoch, position) in enumerate(starts):
        g = topo.stream_id(0, role)
        if position < sched.length(g):
            sched.locate(epoch, g, position)
    t["locate_s"] = time.perf_counter() - t0
    t["total_s"] = sum(t.values())
    return t


def measure(work: Path, sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """One row per size: the median of each part over ``repeats`` runs (fresh dataset each)."""
    rows = []
    for n in sizes:
        root = work / f"resume-scale-{n}"
        C.progress(f"resume at scale: writing synthetic v3.0 meta/ with {n:,} episodes")
        C.write_synthetic_meta(root, [50 + (i * 37) % 500 for i in range(n)], num_cameras=2)
        runs = [resume_locate(root) for _ in range(repeats)]
        row: dict[str, Any] = {"episodes": n, "repeats": repeats}
        for key in runs[0]:
            values = sorted(r[key] for r in runs)
            row[key] = values[len(values) // 2]
            row[key.replace("_s", "_spread_s")] = [values[0], values[-1]]
        C.progress(f"resume at scale, {n:,} episodes: {C.fmt_time(row['total_s'])}")
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]]) -> None:
    """The table, with the growth per decade of the total (10x is linear)."""
    print()
    print(
        f"Resume at scale (no decoding): step {STEP:,}, batch {BATCH}, rank 0 of {WORLD}, "
        f"{WORKERS} workers; median"
    )
    growth = ["-"] + [f"x{b['total_s'] / a['total_s']:.1f}" for a, b in itertools.pairwise(rows)]
    C.print_table(
        ["episodes", "load", "construct", "share", "locate x8", "total", "per decade"],
        [
            [
                f"{r['episodes']:,}",
                C.fmt_time(r["load_s"]),
                C.fmt_time(r["construct_s"]),
                C.fmt_time(r["share_s"]),
                C.fmt_time(r["locate_s"]),
                C.fmt_time(r["total_s"]),
                g,
            ]
            for r, g in zip(rows, growth, strict=True)
        ],
    )
