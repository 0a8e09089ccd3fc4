"""Open cost: time to read a dataset's metadata and to construct a ChunkedEpisodeDataset.

Measured, median of several repeats after a warm-up (warm page cache), per dataset:

- ``robo_resume.load_metadata(root)``: reads and validates ``meta/`` (info.json, stats.json,
  tasks.parquet, the episodes parquet) into one ``EpisodeInfo`` per episode;
- ``ChunkedEpisodeDataset(root, batch_size=32)``: the above plus planning (chunks of 64 frames),
  the dataset and plan fingerprints and the schedule options, i.e. what every training run and
  every resume pays before its first batch (no data or video file is opened);
- the same with ``meta=`` given (planning alone).

Datasets: synthetic v3.0 ``meta/`` folders with 10^4 episodes (and 10^3, 10^5 in full runs),
written with the factory's columns (two cameras, per-episode stats) but without data or video
files, see ``_common.write_synthetic_meta``; and ``../shared/datasets/open50`` (50 real
episodes) when present.

Run::

    python benchmarks/open_cost.py                  # full run (one to two minutes)
    python benchmarks/open_cost.py --quick          # 10^4 episodes and open50, a few seconds
    python benchmarks/open_cost.py --json out.json  # also write every number

The table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common as C

from robo_resume import ChunkedEpisodeDataset, load_metadata

BATCH = 32
OPEN50 = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "open50"


def _meta_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in (root / "meta").rglob("*") if f.is_file())


def measure(name: str, root: Path, repeats: int) -> dict[str, Any]:
    """Median times of load_metadata and of constructing the dataset on ``root``."""
    meta = load_metadata(root)
    t_load = C.median_time(lambda: load_metadata(root), repeats, warmup=1)
    C.progress(f"{name}: load_metadata {C.fmt_time(t_load)}")
    t_construct = C.median_time(
        lambda: ChunkedEpisodeDataset(root, batch_size=BATCH), repeats, warmup=1
    )
    C.progress(f"{name}: ChunkedEpisodeDataset(root) {C.fmt_time(t_construct)}")
    t_plan = C.median_time(
        lambda: ChunkedEpisodeDataset(root, batch_size=BATCH, meta=meta), repeats, warmup=1
    )
    C.progress(f"{name}: ChunkedEpisodeDataset(meta=...) {C.fmt_time(t_plan)}")
    chunks = len(ChunkedEpisodeDataset(root, batch_size=BATCH, meta=meta).chunks)
    return {
        "dataset": name,
        "root": str(root),
        "version": meta.version,
        "episodes": meta.num_episodes,
        "frames": meta.total_frames,
        "cameras": len(meta.camera_keys),
        "chunks": chunks,
        "meta_bytes": _meta_bytes(root),
        "load_metadata_s": t_load,
        "construct_s": t_construct,
        "construct_with_meta_s": t_plan,
        "load_per_episode_s": t_load / meta.num_episodes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10^4 episodes and open50 only, fast")
    ap.add_argument("--json", type=Path, help="write all numbers to this file")
    ap.add_argument("--open50", type=Path, default=OPEN50, help="path of the open50 dataset")
    args = ap.parse_args(argv)

    info = C.machine()
    print(C.describe_machine(info))
    sizes = (10**4,) if args.quick else (10**3, 10**4, 10**5)
    repeats = 3 if args.quick else 7
    rows = []
    with tempfile.TemporaryDirectory(prefix="robo_resume_bench_") as tmp:
        for n in sizes:
            root = Path(tmp) / f"synthetic-{n}"
            C.progress(f"writing synthetic v3.0 meta/ with {n} episodes (2 cameras)")
            lengths = [50 + (i * 37) % 500 for i in range(n)]
            C.write_synthetic_meta(root, lengths, num_cameras=2)
            reps = 3 if n >= 10**5 else repeats
            rows.append(measure(f"synthetic {n:,} episodes", root, reps))
        if args.open50.is_dir():
            rows.append(measure("open50", args.open50, repeats))
        else:
            C.progress(f"open50 not found at {args.open50}; skipped")

    print()
    print(
        "Open cost (median, warm page cache): load_metadata(root), "
        "ChunkedEpisodeDataset(root, batch_size=32), and the same with meta= given"
    )
    C.print_table(
        [
            "dataset",
            "version",
            "episodes",
            "frames",
            "chunks",
            "meta/ size",
            "load_metadata",
            "per episode",
            "construct(root)",
            "construct(meta=)",
        ],
        [
            [
                r["dataset"],
                r["version"],
                f"{r['episodes']:,}",
                f"{r['frames']:,}",
                f"{r['chunks']:,}",
                f"{r['meta_bytes'] / 2**20:.1f} MB",
                C.fmt_time(r["load_metadata_s"]),
                C.fmt_time(r["load_per_episode_s"]),
                C.fmt_time(r["construct_s"]),
                C.fmt_time(r["construct_with_meta_s"]),
            ]
            for r in rows
        ],
    )
    if not args.open50.is_dir():
        print(f"open50: skipped (not found at {args.open50})")
    result = {
        "benchmark": "open_cost",
        "machine": info,
        "quick": args.quick,
        "batch_size": BATCH,
        "repeats": repeats,
        "rows": rows,
    }
    if args.json:
        C.write_json(args.json, result)
        C.progress(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
