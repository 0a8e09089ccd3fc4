"""Open cost: time to read a dataset's metadata and to construct a ChunkedEpisodeDataset.

Measured, median of several repeats after a warm-up (warm page cache), per dataset (at 10^6
episodes one timed run each, no warm-up: the old per-episode code takes minutes there):

- ``robo_resume.load_metadata(root)``: reads and validates ``meta/`` (info.json, stats.json,
  tasks.parquet, the episodes parquet or episodes.jsonl) into the episode columns;
- ``ChunkedEpisodeDataset(root, batch_size=32)``: the above plus planning (chunks of 64 frames),
  the dataset and plan fingerprints and the schedule options, i.e. what every training run and
  every resume pays before its first batch (no data or video file is opened);
- the same with ``meta=`` given (planning alone);
- ``robo-resume plan ROOT --step 1000000 --batch-size 32 --num-workers 8 --world-size 4
  --json``, the wall time of the command in a fresh process (every synthetic v3.0 size in full
  runs, the largest in ``--quick``), beside a process that only imports what the command does;
- ``ds.fingerprint`` of a fresh dataset (the plan digest, the dataset and selection hashes);
- memory (full runs): resident memory (RSS) of a fresh process after ``load_metadata`` minus
  before it (``retained``), its peak while loading (``peak``), then with the dataset
  constructed (``+plan``) and its epoch layout shared for 8 workers (``+layout``); and per
  worker, after locating its stream at step 10^6, its private memory (USS: the pages no other
  process maps, from ``/proc/self/smaps_rollup`` read once; what the machine gets back when the
  worker exits): a forked worker's beyond a forked worker that only runs the garbage collector
  (which dirties the imports' pages), and a forkserver and a spawn worker's beyond one of the
  same start method with the imports only. Spawn and forkserver workers map the metadata,
  plan and layout arrays from memory files the training process made for them
  (``robo_resume.stream.shared_arrays``); those pages exist once on the machine, whatever the
  number of workers: the training process's shared memory (``RssShmem``) is printed beside
  (``main shm``), after the first workers and after 3 later epochs' workers (flat). The JSON
  also has each worker's PSS (the shared pages divided among the processes that map them),
  RSS and the shared pages it touched.

Datasets: synthetic v3.0 ``meta/`` folders with 10^4 episodes (and 10^3, 10^5, 10^6 in full
runs), written with the factory's columns (two cameras, per-episode stats) but without data or
video files, see ``_common.write_synthetic_meta``; a synthetic v2.1 ``meta/`` (episodes.jsonl)
with 10^5 episodes in full runs (``_common.write_synthetic_meta_v21``); and
``../shared/datasets/open50`` (50 real episodes) when present. After the table, the growth per
decade: the time at 10x the episodes divided by the time before (10 is linear).

Run::

    python benchmarks/open_cost.py                  # full run (a few minutes)
    python benchmarks/open_cost.py --quick          # 10^3, 10^4 episodes and open50, seconds
    python benchmarks/open_cost.py --json out.json  # also write every number

The table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as C

from robo_resume import ChunkedEpisodeDataset, load_metadata

BATCH = 32
OPEN50 = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "open50"


def _meta_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in (root / "meta").rglob("*") if f.is_file())


_RSS_PROBE = """
import gc, json, multiprocessing as mp, sys
def rss(key="VmRSS:"):  # VmHWM: this process's peak (ru_maxrss would count the parent's)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))
def smaps():  # read once, not polled: USS (Private_*), PSS, and the shared memory it maps
    with open("/proc/self/smaps_rollup") as f:
        kb = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f if l.rstrip().endswith("kB")}
    uss = kb["Private_Clean"] + kb["Private_Dirty"]
    return {"uss": uss, "pss": kb["Pss"], "rss": kb["Rss"], "shm": rss("RssShmem:")}
def start(ds, q):  # what a DataLoader worker does first: locate its stream
    from robo_resume.index.start import resume_point
    sched = ds.schedule(8)
    st = resume_point(sched, 10**6, infinite=True, rank=0).starts[3]
    sched.locate(st.epoch, 3, st.position)
    gc.collect()
    q.put(smaps())
def idle(q):  # a forked worker that only collects: the imports' pages it dirties
    gc.collect(); q.put(smaps())
def bare(q):
    import gc, robo_resume.dataset, robo_resume.index.start  # a worker with the imports only
    gc.collect(); q.put(smaps())
def child(ctx, target, *args):
    q = ctx.Queue(); p = ctx.Process(target=target, args=(*args, q)); p.start()
    out = q.get(timeout=600); p.join(); return out
def beyond(a, b):
    return {k: a[k] - b[k] for k in a}
if __name__ == "__main__":
    import pandas, pyarrow.compute, pyarrow.parquet, torch, robo_resume  # imports are not data
    from robo_resume import ChunkedEpisodeDataset
    from robo_resume.format.arrow_columns import release_freed_memory
    gc.collect(); before = rss()
    meta = robo_resume.load_metadata(sys.argv[1])
    gc.collect(); after = rss()
    peak = rss("VmHWM:")
    ds = ChunkedEpisodeDataset(sys.argv[1], batch_size=32, meta=meta)
    gc.collect(); plan = rss()
    ds.share_schedule(8)  # what BatchLoader does before its 8 workers start
    release_freed_memory(); gc.collect(); layout = rss()
    forks = mp.get_context("fork")
    fork = beyond(child(forks, start, ds), child(forks, idle))
    out = {"retained": after - before, "peak": peak - before, "plan": plan - before,
           "layout": layout - before, "fork_worker": fork, "n": meta.num_episodes}
    for method in ("forkserver", "spawn"):
        ctx = mp.get_context(method)
        out[method + "_worker"] = beyond(child(ctx, start, ds), child(ctx, bare))
    out["shared"] = [rss("RssShmem:")]  # the main process's memory files (spawn, forkserver)
    fs = mp.get_context("forkserver")
    for epoch in (1, 2, 3):  # later epochs, each with new workers: their layouts replace it
        ds.epochs.worker(0).playing(epoch - 1)  # what the loader's next iteration sets
        ds.share_schedule(8)
        child(fs, start, ds)
        gc.collect(); out["shared"].append(rss("RssShmem:"))
    print(json.dumps(out))
"""


def metadata_memory(root: Path) -> dict[str, int] | None:
    """RSS growth of a fresh process from ``load_metadata(root)`` (``retained``, ``peak``),
    then with the dataset constructed (``plan``) and its epoch layout shared for 8 workers
    (``layout``); per start method (``fork_worker``, ``forkserver_worker``, ``spawn_worker``)
    a worker's ``uss``, ``pss``, ``rss`` and ``shm`` beyond a worker without the dataset, after
    locating its stream at step 10^6; the main process's shared memory after the first workers
    and after each of 3 later epochs' (``shared``). Linux only; else None."""
    if not Path("/proc/self/status").is_file():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "rss_probe.py"  # a file: forkserver children import __main__
        probe.write_text(_RSS_PROBE)
        out = subprocess.run(
            [sys.executable, str(probe), str(root)],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ),
            cwd=root,  # not the repository: "" on sys.path would shadow PYTHONPATH
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(
    name: str, root: Path, repeats: int, warmup: int = 1, *, memory: bool = True
) -> dict[str, Any]:
    """Median times of load_metadata and of constructing the dataset on ``root`` (and the
    metadata's RSS in a fresh process with ``memory``)."""
    meta = load_metadata(root)
    t_load = C.median_time(lambda: load_metadata(root), repeats, warmup=warmup)
    C.progress(f"{name}: load_metadata {C.fmt_time(t_load)}")
    rss = metadata_memory(root) if memory else None
    if rss:
        C.progress(f"{name}: metadata RSS retained {rss['retained'] / 2**20:.0f} MB")
    t_construct = C.median_time(
        lambda: ChunkedEpisodeDataset(root, batch_size=BATCH), repeats, warmup=warmup
    )
    C.progress(f"{name}: ChunkedEpisodeDataset(root) {C.fmt_time(t_construct)}")
    ds = None

    def construct_with_meta() -> None:
        nonlocal ds
        ds = None  # one plan in memory at a time
        ds = ChunkedEpisodeDataset(root, batch_size=BATCH, meta=meta)

    t_plan = C.median_time(construct_with_meta, repeats, warmup=warmup)
    C.progress(f"{name}: ChunkedEpisodeDataset(meta=...) {C.fmt_time(t_plan)}")
    t0 = time.perf_counter()
    ds.fingerprint  # noqa: B018 (computed on first use: a fresh dataset's, once)
    t_fingerprint = time.perf_counter() - t0
    chunks = len(ds.chunks)
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
        "fingerprint_s": t_fingerprint,
        "load_per_episode_s": t_load / meta.num_episodes,
        "meta_rss_retained_bytes": rss["retained"] if rss else None,
        "meta_rss_peak_bytes": rss["peak"] if rss else None,
        "plan_rss_bytes": rss["plan"] if rss else None,
        "layout_rss_bytes": rss["layout"] if rss else None,
        "fork_worker_uss_bytes": rss["fork_worker"]["uss"] if rss else None,
        "forkserver_worker_uss_bytes": rss["forkserver_worker"]["uss"] if rss else None,
        "spawn_worker_uss_bytes": rss["spawn_worker"]["uss"] if rss else None,
        "workers": {k: rss[k] for k in ("fork_worker", "forkserver_worker", "spawn_worker")}
        if rss
        else None,
        "main_shared_bytes_by_epoch": rss["shared"] if rss else None,
        "repeats": repeats,
    }


PLAN_IMPORTS = (  # what `robo-resume plan` imports for a v3.0 dataset (no torch, no pandas)
    "robo_resume.cli.plan",
    "robo_resume.format.meta_v30",
    "robo_resume.index.schedule",
    "robo_resume.index.start",
    "robo_resume.source",
    "robo_resume.splits",
    "robo_resume.state.records",
    "robo_resume.stream.tuning",
    "pyarrow.compute",
    "pyarrow.parquet",
)
PLAN_ARGS = ["--step", "1000000", "--batch-size", "32", "--num-workers", "8", "--world-size", "4"]


def _wall(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, env=dict(os.environ), cwd=cwd)
    return time.perf_counter() - t0


def plan_cli(root: Path, repeats: int) -> dict[str, Any]:
    """Wall time of ``robo-resume plan ROOT --step 1000000 --batch-size 32 --num-workers 8
    --world-size 4 --json`` in a fresh process (median and spread of ``repeats`` runs), and
    beside it, alternating, of a process that only imports what the command imports
    (:data:`PLAN_IMPORTS`: the interpreter, numpy, pyarrow and the package; what no dataset
    size changes)."""
    cli = [sys.executable, "-m", "robo_resume.cli", "plan", str(root), *PLAN_ARGS, "--json"]
    imp = [sys.executable, "-c", "import " + ", ".join(PLAN_IMPORTS)]
    runs, imports = [], []
    for _ in range(repeats):
        runs.append(_wall(cli, root))
        imports.append(_wall(imp, root))
    runs.sort()
    imports.sort()
    return {
        "plan_cli_s": runs[len(runs) // 2],
        "plan_cli_spread_s": [runs[0], runs[-1]],
        "import_only_s": imports[len(imports) // 2],
    }


def growth(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Rows of the growth-per-decade table: time ratio from each v3.0 size to the next."""
    synth = [r for r in rows if r["dataset"].startswith("synthetic") and r["version"] == "v3.0"]
    out = []
    for a, b in itertools.pairwise(synth):
        out.append(
            [
                f"{a['episodes']:,} -> {b['episodes']:,}",
                f"{b['episodes'] / a['episodes']:g}x",
                f"{b['load_metadata_s'] / a['load_metadata_s']:.1f}x",
                f"{b['construct_s'] / a['construct_s']:.1f}x",
                f"{b['construct_with_meta_s'] / a['construct_with_meta_s']:.1f}x",
                f"{b['plan_cli_s'] / a['plan_cli_s']:.1f}x"
                if a.get("plan_cli_s") and b.get("plan_cli_s")
                else "-",
            ]
        )
    return out


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10^3, 10^4 episodes, open50")
    ap.add_argument("--json", type=Path, help="write all numbers to this file")
    ap.add_argument("--open50", type=Path, default=OPEN50, help="path of the open50 dataset")
    args = ap.parse_args(argv)

    info = C.machine()
    print(C.describe_machine(info))
    sizes = (10**3, 10**4) if args.quick else (10**3, 10**4, 10**5, 10**6)
    repeats = 3 if args.quick else 7
    rows = []
    with tempfile.TemporaryDirectory(prefix="robo_resume_bench_") as tmp:
        for n in sizes:
            root = Path(tmp) / f"synthetic-{n}"
            C.progress(f"writing synthetic v3.0 meta/ with {n} episodes (2 cameras)")
            lengths = [50 + (i * 37) % 500 for i in range(n)]
            C.write_synthetic_meta(root, lengths, num_cameras=2)
            reps, warm = (3, 1) if n == 10**5 else (1, 0) if n >= 10**6 else (repeats, 1)
            rows.append(
                measure(f"synthetic {n:,} episodes", root, reps, warm, memory=not args.quick)
            )
            if not args.quick or n == sizes[-1]:
                rows[-1].update(plan_cli(root, 1 if args.quick else 3))
                C.progress(f"{n:,} episodes: robo-resume plan {C.fmt_time(rows[-1]['plan_cli_s'])}")
            shutil.rmtree(root)
        if not args.quick:
            n = 10**5
            root = Path(tmp) / f"synthetic-v21-{n}"
            C.progress(f"writing synthetic v2.1 meta/ with {n} episodes (2 cameras)")
            C.write_synthetic_meta_v21(root, [50 + (i * 37) % 500 for i in range(n)], num_cameras=2)
            rows.append(measure(f"synthetic v2.1 {n:,} episodes", root, 3))
        if args.open50.is_dir():
            rows.append(measure("open50", args.open50, repeats, memory=not args.quick))
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
            "fingerprint",
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
                C.fmt_time(r["fingerprint_s"]),
            ]
            for r in rows
        ],
    )
    mem = [r for r in rows if r["meta_rss_retained_bytes"] is not None]
    if mem:
        print()
        print(
            "Memory (RSS growth of a fresh process): metadata, its peak while loading, with the "
            "plan (construct), with the epoch layout shared for 8 workers; per worker after "
            "locating its stream, its private memory (USS) beyond a worker of the same start "
            "method without the dataset (spawn and forkserver workers map the arrays from "
            "shared memory); the main process's shared memory after the first workers' start "
            "and after 3 later epochs' workers"
        )
        C.print_table(
            [
                "dataset",
                "metadata",
                "peak",
                "+plan",
                "+layout",
                "fork worker",
                "forkserver worker",
                "spawn worker",
                "main shm",
            ],
            [
                [
                    r["dataset"],
                    _mb(r["meta_rss_retained_bytes"]),
                    _mb(r["meta_rss_peak_bytes"]),
                    _mb(r["plan_rss_bytes"]),
                    _mb(r["layout_rss_bytes"]),
                    _mb(r["fork_worker_uss_bytes"]),
                    _mb(r["forkserver_worker_uss_bytes"]),
                    _mb(r["spawn_worker_uss_bytes"]),
                    " / ".join(_mb(x) for x in r["main_shared_bytes_by_epoch"]),
                ]
                for r in mem
            ],
        )
    clis = [r for r in rows if r.get("plan_cli_s")]
    if clis:
        print()
        print(
            "robo-resume plan ROOT " + " ".join(PLAN_ARGS) + " --json: wall time of the command "
            "(median and range), beside a process that only imports what it imports"
        )
        C.print_table(
            ["dataset", "plan CLI", "range", "import only", "CLI - import"],
            [
                [
                    r["dataset"],
                    C.fmt_time(r["plan_cli_s"]),
                    " - ".join(C.fmt_time(x) for x in r["plan_cli_spread_s"]),
                    C.fmt_time(r["import_only_s"]),
                    f"{r['plan_cli_s'] - r['import_only_s']:+.2f} s",
                ]
                for r in clis
            ],
        )
    decades = growth(rows)
    if decades:
        print()
        print("Growth per decade (synthetic v3.0; time at 10x the episodes / time before):")
        C.print_table(
            ["episodes", "size", "load_metadata", "construct(root)", "construct(meta=)", "plan"],
            decades,
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
        "growth_per_decade": decades,
    }
    if args.json:
        C.write_json(args.json, result)
        C.progress(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
