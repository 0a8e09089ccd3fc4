"""Scale: resume-locate time against episodes (10^3..10^6) and against streams (1..8,192).

Pure arithmetic over synthetic episode spans (no files): what a DataLoader worker pays, in a
fresh process, to find where its stream resumes at a large step. Measured per setting:

- ``plan``: ``make_chunks`` (the plan as columns; the dataset does it once, before the workers);
- ``first locate``: a fresh :class:`~robo_resume.index.schedule.Schedule`, ``resume_point`` of
  rank 0 at step 10^6 and ``locate`` of its first stream: includes the epoch's permutation and
  prefix sums (computed once per epoch per process) and the stream's segments;
- ``next locate``: the same for another stream in the same process (its segments and the
  group only), median over a few streams.

Episode lengths are 50 + (i * 37) % 500 frames (about 300 on average, as in open_cost.py),
``chunk_frames=64``, batch size 32. Against episodes: 4 ranks x 8 workers. Against streams:
10^5 episodes (``--quick``: 10^4), ranks x 8 workers (1 stream: 1 rank, 0 workers). The growth
per decade is the ratio of consecutive rows, measured side by side in one run.

Run::

    python benchmarks/scale.py            # full (under a minute on 2 cores)
    python benchmarks/scale.py --quick    # 10^3..10^5 episodes, 10^4 for the streams sweep
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import _common as C
import numpy as np

from robo_resume.index.plan import EpisodeSpans, make_chunks
from robo_resume.index.schedule import Schedule, ScheduleConfig, Topology
from robo_resume.index.start import resume_point

STEP = 10**6
BATCH = 32


def _spans(n: int) -> EpisodeSpans:
    lengths = 50 + (np.arange(n, dtype=np.int64) * 37) % 500
    return EpisodeSpans(np.arange(n, dtype=np.int64), np.cumsum(lengths) - lengths, lengths)


def measure(episodes: int, topo: Topology, plan=None) -> dict:
    """Times of planning, the first locate and further locates for one setting."""
    t0 = time.perf_counter()
    if plan is None:
        plan = make_chunks(_spans(episodes), 64)
    t_plan = time.perf_counter() - t0
    t0 = time.perf_counter()
    sched = Schedule(plan, ScheduleConfig(seed=0, batch_size=BATCH), topo)
    rp = resume_point(sched, STEP, infinite=True, rank=0)
    start = rp.starts[0]
    sched.locate(start.epoch, 0, start.position)
    t_first = time.perf_counter() - t0
    nexts = []
    streams = topo.num_streams
    for g in sorted({streams // 3, streams // 2, streams - 1} - {0}):
        role = g % topo.workers_per_rank
        rp = resume_point(sched, STEP, infinite=True, rank=g // topo.workers_per_rank)
        s = rp.starts[role]
        t0 = time.perf_counter()
        sched.locate(s.epoch, g, s.position)
        nexts.append(time.perf_counter() - t0)
    return {
        "episodes": episodes,
        "chunks": len(plan),
        "streams": streams,
        "plan_s": t_plan,
        "first_locate_s": t_first,
        "next_locate_s": statistics.median(nexts) if nexts else None,
    }


def _growth(rows: list[dict], key: str) -> list[str]:
    out = ["-"]
    for a, b in itertools.pairwise(rows):
        out.append(f"x{b[key] / a[key]:.1f}" if a[key] and b[key] else "-")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, a few seconds")
    ap.add_argument("--json", help="write all numbers to this file")
    args = ap.parse_args(argv)
    print(C.describe_machine())
    sizes = [10**3, 10**4, 10**5] + ([] if args.quick else [10**6])
    by_episodes = []
    for n in sizes:
        C.progress(f"episodes {n:,}")
        by_episodes.append(measure(n, Topology(4, 8)))
    fixed = 10**4 if args.quick else 10**5
    plan = make_chunks(_spans(fixed), 64)
    by_streams = []
    for topo in [Topology(1, 0), Topology(1, 8)] + [Topology(r, 8) for r in (8, 64, 1024)]:
        C.progress(f"streams {topo.num_streams:,}")
        by_streams.append(measure(fixed, topo, plan))

    print()
    print(f"Resume-locate against episodes (4 ranks x 8 workers, step {STEP:,}, batch {BATCH})")
    growth = _growth(by_episodes, "first_locate_s")
    C.print_table(
        ["episodes", "chunks", "plan", "first locate", "per decade", "next locate"],
        [
            [
                f"{r['episodes']:,}",
                f"{r['chunks']:,}",
                C.fmt_time(r["plan_s"]),
                C.fmt_time(r["first_locate_s"]),
                g,
                C.fmt_time(r["next_locate_s"]),
            ]
            for r, g in zip(by_episodes, growth, strict=True)
        ],
    )
    print()
    print(f"Resume-locate against streams ({fixed:,} episodes, step {STEP:,})")
    C.print_table(
        ["streams", "first locate", "next locate"],
        [
            [f"{r['streams']:,}", C.fmt_time(r["first_locate_s"]), C.fmt_time(r["next_locate_s"])]
            for r in by_streams
        ],
    )
    if args.json:
        C.write_json(
            args.json,
            {
                "benchmark": "scale",
                "machine": C.machine(),
                "by_episodes": by_episodes,
                "by_streams": by_streams,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
