"""Peak resident memory (RSS) of a DataLoader worker while streaming, and what makes it grow.

Every measurement runs in a fresh Python process (so that nothing a previous measurement left
in the heap is inherited by the forked workers) which builds
``ChunkedEpisodeDataset(..., batch_size=32, image_dtype="float32", infinite=True,
tuning=StreamTuning(interleave=k)).dataloader(num_workers=2)``, draws ``--batches`` batches and
then, while the workers are still alive, reads each worker's ``VmHWM`` (peak RSS) and ``VmRSS``
from ``/proc/<pid>/status``. A ``worker_init_fn`` records each worker's pid and its RSS right
after start (the *baseline*: the pages it shares with the parent after fork, i.e. the import
cost of torch, PyAV, pyarrow and the dataset object); *growth* is peak minus baseline, what
streaming itself costs. The main process reports its own peak RSS minus its RSS just before
the loader started (``/proc/self/clear_refs`` resets the peak first), which holds the float32
batches (images cross from the workers as uint8 and are converted in the main process).

Experiments (MB = 2^20 bytes):

1. ``../shared/datasets/open50`` (the 43 episodes with video, 480x640 mpeg4, one camera) with 3
   chunks open at once per worker: per-worker peak, baseline and growth.
2. Open chunks: the same with ``interleave`` 1, 2, 3, 4, 6, 8; a linear fit gives MB per extra
   open chunk.
3. Cameras: factory datasets (12 episodes of 300 frames, 224x224 AV1, 1, 2 and 3 cameras) at
   interleave 3; a linear fit gives MB per camera.
4. Dataset size: the same factory with 12 vs 48 episodes, and open50 with 10 vs 43 episodes:
   peak RSS must not depend on it (PASS when the ratio large/small is within 10% of 1).

Run: ``python benchmarks/memory.py [--json out/memory.json] [--batches 60]``; ``--quick`` runs
a small version on tiny factory datasets only (used by the tests). Factory datasets are written
once to ``--data-dir`` (default ``out/bench_data``) and reused.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, machine, print_table, progress, write_json

REPO = Path(__file__).resolve().parents[1]
OPEN50 = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "open50"
OPEN50_WITH_VIDEO = [e for e in range(50) if e not in (1, 2, 7, 9, 25, 33, 34)]
BATCH = 32
WORKERS = 2
INTERLEAVE = 3  # chunks open at once per worker in experiments 1, 3 and 4
SIZE_TOLERANCE = 0.10
MB = 2**20


# -- measuring (runs in a fresh process per configuration) -------------------------------------
def proc_status(pid: int | str = "self") -> dict[str, int]:
    """The ``Vm*`` and ``Rss*`` lines of ``/proc/<pid>/status``, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.startswith(("Vm", "Rss")) and value.strip().endswith("kB"):
            out[key] = int(value.split()[0]) * 1024
    return out


def smaps_rollup(pid: int | str = "self") -> dict[str, int]:
    """``Pss`` and ``Private_*`` of ``/proc/<pid>/smaps_rollup`` in bytes ({} if unreadable)."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, _, value = line.partition(":")
            if key in ("Pss", "Private_Clean", "Private_Dirty"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _record_worker(folder: str, worker_id: int) -> None:
    """``worker_init_fn``: write this worker's pid and RSS right after start to ``folder``."""
    st = proc_status()
    info = {"worker_id": worker_id, "pid": os.getpid(), "status": st}
    Path(folder, f"worker-{worker_id}.json").write_text(json.dumps(info))


def _reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False if not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    """Stream ``cfg["batches"]`` batches and return the peak RSS of every worker and of main."""
    warnings.filterwarnings("ignore")
    logging.getLogger("robo_resume").setLevel(logging.WARNING)
    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    ds = ChunkedEpisodeDataset(
        cfg["root"],
        batch_size=BATCH,
        episodes=cfg["episodes"],
        image_dtype="float32",
        infinite=True,
        tuning=StreamTuning(interleave=cfg["interleave"]),
    )
    cams = list(ds.meta.camera_keys)
    with tempfile.TemporaryDirectory(prefix="robo-mem-") as folder:
        loader = ds.dataloader(
            num_workers=cfg["workers"],
            worker_init_fn=functools.partial(_record_worker, folder),
            persistent_workers=False,
        )
        gc.collect()
        reset = _reset_peak()
        main_before = proc_status()
        t0 = time.perf_counter()
        it = iter(loader)  # keeps the workers alive until deleted
        frames, shape, dtype = 0, None, None
        for _ in range(cfg["batches"]):
            batch = next(it)
            frames += len(batch["index"])
            shape, dtype = tuple(batch[cams[0]].shape), str(batch[cams[0]].dtype)
            del batch
        seconds = time.perf_counter() - t0
        main_after = proc_status()
        workers = []
        for f in sorted(Path(folder).glob("worker-*.json")):
            w = json.loads(f.read_text())
            st = proc_status(w["pid"])  # the worker is alive: `it` still holds it
            st0 = w["status"]
            smaps = smaps_rollup(w["pid"])
            uss = smaps.get("Private_Clean", 0) + smaps.get("Private_Dirty", 0)
            workers.append(
                {
                    "worker_id": w["worker_id"],
                    "pid": w["pid"],
                    "baseline_mb": st0["VmRSS"] / MB,
                    "peak_mb": st["VmHWM"] / MB,
                    "growth_mb": (st["VmHWM"] - st0["VmRSS"]) / MB,
                    "end_rss_mb": st["VmRSS"] / MB,
                    "end_pss_mb": smaps["Pss"] / MB if smaps else None,
                    "end_uss_mb": uss / MB if smaps else None,
                    **{
                        f"{when}_{kind.lower()}_mb": s.get(kind, 0) / MB
                        for when, s in (("baseline", st0), ("end", st))
                        for kind in ("RssAnon", "RssFile", "RssShmem")
                    },
                }
            )
        del it
    if len(workers) != cfg["workers"]:
        raise RuntimeError(f"expected {cfg['workers']} workers to report, got {len(workers)}")
    for w in workers:
        if not (w["peak_mb"] > 0 and w["baseline_mb"] > 0):
            raise RuntimeError(f"implausible RSS numbers of worker {w}")
    return {
        **cfg,
        "cameras": len(cams),
        "image_shape": shape,
        "image_dtype": dtype,
        "frames": frames,
        "seconds": seconds,
        "frames_per_s": frames / seconds,
        "workers": workers,
        "main": {
            "pid": os.getpid(),
            "before_mb": main_before["VmRSS"] / MB,
            "peak_mb": main_after["VmHWM"] / MB,
            "delta_mb": (main_after["VmHWM"] - main_before["VmRSS"]) / MB,
            "peak_reset": reset,
        },
    }


# -- orchestration -----------------------------------------------------------------------------
class Runner:
    """Runs each distinct configuration once, each in its own Python process."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.runs: dict[str, dict[str, Any]] = {}

    def __call__(self, label: str, root: Path, episodes: list[int] | None, interleave: int):
        cfg = {
            "root": str(root),
            "episodes": episodes,
            "interleave": interleave,
            "workers": WORKERS,
            "batches": self.batches,
        }
        key = json.dumps(cfg, sort_keys=True)
        if key in self.runs:
            return self.runs[key]
        progress(f"{label}: interleave={interleave}, {self.batches} batches")
        with tempfile.TemporaryDirectory(prefix="robo-mem-") as tmp:
            out = Path(tmp) / "run.json"
            proc = subprocess.run(
                [sys.executable, __file__, "--_one", key, "--_out", str(out)],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout + proc.stderr)
                raise RuntimeError(f"measurement {label} failed (exit {proc.returncode})")
            run = json.loads(out.read_text())
        run["label"] = label
        self.runs[key] = run
        return run


def factory_root(data_dir: Path, cameras: int, episodes: int, quick: bool) -> Path:
    """Write (once) and return a factory dataset under ``data_dir``."""
    from robo_resume.testing import make_dataset

    if quick:
        name = f"mem-quick-cams{cameras}" + ("" if episodes == 4 else f"-ep{episodes}")
        kw = dict(episode_lengths=(60,) * episodes, height=64, width=64, episodes_per_file=2)
    else:
        name = f"mem-cams{cameras}" + ("" if episodes == 12 else f"-ep{episodes}")
        kw = dict(episode_lengths=(300,) * episodes, height=224, width=224, episodes_per_file=4)
    root = data_dir / name
    if not (root / "meta" / "info.json").is_file():
        progress(f"writing factory dataset {name} ({episodes} episodes, {cameras} cameras)")
        make_dataset(root, num_cameras=cameras, fps=30, overwrite=True, **kw)
    return root


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line ``y = slope * x + intercept``."""
    mx, my = mean(xs), mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def summary(run: dict[str, Any]) -> dict[str, float]:
    """Worker means (peak, baseline, growth), the largest worker peak and the main delta."""
    ws = run["workers"]
    return {
        "baseline_mb": mean([w["baseline_mb"] for w in ws]),
        "peak_mb": mean([w["peak_mb"] for w in ws]),
        "max_peak_mb": max(w["peak_mb"] for w in ws),
        "growth_mb": mean([w["growth_mb"] for w in ws]),
        "main_delta_mb": run["main"]["delta_mb"],
    }


def _mb(x: float) -> str:
    return f"{x:.1f}"


def print_run(title: str, run: dict[str, Any]) -> None:
    print()
    print(title)
    rows = [
        [
            f"worker {w['worker_id']}",
            w["pid"],
            _mb(w["baseline_mb"]),
            _mb(w["peak_mb"]),
            _mb(w["growth_mb"]),
            _mb(w["end_rss_mb"]),
            f"{w['end_rssanon_mb'] - w['baseline_rssanon_mb']:+.1f}",
            f"{w['end_rssfile_mb'] - w['baseline_rssfile_mb']:+.1f}",
            f"{w['end_rssshmem_mb'] - w['baseline_rssshmem_mb']:+.1f}",
            "-" if w["end_uss_mb"] is None else _mb(w["end_uss_mb"]),
        ]
        for w in run["workers"]
    ]
    m = run["main"]
    rows.append(["main process", m["pid"], _mb(m["before_mb"]), _mb(m["peak_mb"])] + [""] * 6)
    print_table(
        [
            "process",
            "pid",
            "baseline MB",
            "peak MB",
            "growth MB",
            "RSS at end MB",
            "anon",
            "file",
            "shmem",
            "USS at end MB",
        ],
        rows,
    )
    print(
        "(baseline: worker RSS right after start; growth: peak - baseline; anon/file/shmem: "
        "change of RssAnon/RssFile/RssShmem from start to end, MB; file pages are shared "
        "library code, anon pages at start are shared with the parent until written; USS: "
        "pages private to the worker)"
    )
    print(
        f"main process peak minus RSS before the loader: {m['delta_mb']:.1f} MB "
        f"(float32 batches of {run['image_shape']}); {run['frames']} frames in "
        f"{run['seconds']:.1f} s"
    )


def sweep_rows(runs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [{key: r[key], "run_label": r["label"], **summary(r)} for r in runs]


def print_sweep(title: str, rows: list[dict[str, Any]], key: str, header: str) -> None:
    print()
    print(title)
    print_table(
        [header, "baseline MB", "peak MB", "max peak MB", "growth MB", "main delta MB"],
        [
            [
                r[key],
                _mb(r["baseline_mb"]),
                _mb(r["peak_mb"]),
                _mb(r["max_peak_mb"]),
                _mb(r["growth_mb"]),
                _mb(r["main_delta_mb"]),
            ]
            for r in rows
        ],
    )


def size_check(name: str, small: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    s, g = summary(small), summary(large)
    ratio = g["peak_mb"] / s["peak_mb"]
    return {
        "dataset": name,
        "small_episodes": small["num_episodes"],
        "large_episodes": large["num_episodes"],
        "small_peak_mb": s["peak_mb"],
        "large_peak_mb": g["peak_mb"],
        "small_growth_mb": s["growth_mb"],
        "large_growth_mb": g["growth_mb"],
        "ratio": ratio,
        "growth_ratio": g["growth_mb"] / s["growth_mb"] if s["growth_mb"] > 0 else None,
        "pass": abs(ratio - 1) <= SIZE_TOLERANCE,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=60, help="batches drawn per measurement")
    p.add_argument("--interleave", default="1,2,3,4,6,8", help="open chunks per worker to try")
    p.add_argument("--data-dir", type=Path, default=REPO / "out" / "bench_data")
    p.add_argument("--no-open50", action="store_true", help="skip the open50 measurements")
    p.add_argument("--quick", action="store_true", help="tiny factory datasets only (tests)")
    p.add_argument("--json", type=Path, help="write all numbers here")
    p.add_argument("--_one", help=argparse.SUPPRESS)
    p.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._one:  # one measurement, in this fresh process
        write_json(args._out, measure(json.loads(args._one)))
        return 0
    if args.quick:
        args.batches, args.interleave, args.no_open50 = 8, "1,3", True
    interleaves = sorted({int(k) for k in args.interleave.split(",")})
    if len(interleaves) < 2 or interleaves[0] < 1:
        p.error("--interleave needs at least two distinct values >= 1 (for the fit)")
    warnings.filterwarnings("ignore")
    logging.getLogger("robo_resume").setLevel(logging.WARNING)

    info = machine()
    print(describe_machine(info))
    print(
        f"peak RSS per DataLoader worker: {WORKERS} workers, batch {BATCH}, float32 images, "
        f"{args.batches} batches per measurement, each in a fresh process"
    )
    run = Runner(args.batches)
    use_open50 = not args.no_open50 and (OPEN50 / "meta" / "info.json").is_file()
    if not args.no_open50 and not use_open50:
        progress(f"skipping open50: {OPEN50} is absent")
    small_eps, large_eps = (4, 16) if args.quick else (12, 48)
    cams_list = [1, 2] if args.quick else [1, 2, 3]
    factory = {k: factory_root(args.data_dir, k, small_eps, args.quick) for k in cams_list}
    factory_large = factory_root(args.data_dir, 1, large_eps, args.quick)

    def tag(r: dict[str, Any], n: int) -> dict[str, Any]:
        r["num_episodes"] = n
        return r

    experiments: dict[str, Any] = {}
    # 1. the reference configuration, and 2. the interleave sweep
    if use_open50:
        ref_name = f"open50 ({len(OPEN50_WITH_VIDEO)} episodes with video, 480x640 mpeg4)"
        ref_root, ref_eps = OPEN50, OPEN50_WITH_VIDEO
    else:
        ref_name = f"factory {small_eps} episodes, 1 camera"
        ref_root, ref_eps = factory[1], None
    n_ref = len(ref_eps) if ref_eps else small_eps
    ref = tag(run("reference", ref_root, ref_eps, INTERLEAVE), n_ref)
    print_run(f"[1] {ref_name}, interleave {INTERLEAVE} (3 chunks open per worker)", ref)
    experiments["reference"] = {"dataset": ref_name, "interleave": INTERLEAVE, "run": ref}

    sweep = [tag(run("interleave", ref_root, ref_eps, k), n_ref) for k in interleaves]
    rows = sweep_rows(sweep, "interleave")
    slope, icpt = fit([r["interleave"] for r in rows], [r["growth_mb"] for r in rows])
    print_sweep(
        f"[2] peak RSS per worker vs chunks open at once (interleave), {ref_name}",
        rows,
        "interleave",
        "interleave",
    )
    print(f"fit: growth = {icpt:.1f} MB + {slope:.2f} MB per open chunk")
    experiments["interleave"] = {
        "dataset": ref_name,
        "rows": rows,
        "mb_per_open_chunk": slope,
        "intercept_mb": icpt,
    }

    # 3. cameras
    cam_runs = [tag(run(f"cameras={k}", factory[k], None, INTERLEAVE), small_eps) for k in factory]
    rows = sweep_rows(cam_runs, "cameras")
    cam_slope, cam_icpt = fit([r["cameras"] for r in rows], [r["growth_mb"] for r in rows])
    res = "64x64" if args.quick else "224x224"
    print_sweep(
        f"[3] peak RSS per worker vs cameras, factory {small_eps} episodes {res} AV1, "
        f"interleave {INTERLEAVE}",
        rows,
        "cameras",
        "cameras",
    )
    print(f"fit: growth = {cam_icpt:.1f} MB + {cam_slope:.2f} MB per camera")
    experiments["cameras"] = {
        "dataset": f"factory {small_eps} episodes {res} AV1",
        "rows": rows,
        "mb_per_camera": cam_slope,
        "intercept_mb": cam_icpt,
    }

    # 4. dataset size
    checks = [
        size_check(
            f"factory 1 camera {res}",
            tag(run("size-small", factory[1], None, INTERLEAVE), small_eps),
            tag(run("size-large", factory_large, None, INTERLEAVE), large_eps),
        )
    ]
    if use_open50:
        few = OPEN50_WITH_VIDEO[:10]
        checks.append(
            size_check(
                "open50",
                tag(run("size-small", OPEN50, few, INTERLEAVE), len(few)),
                ref,
            )
        )
    print()
    print(f"[4] peak RSS per worker vs dataset size, interleave {INTERLEAVE}")
    print_table(
        ["dataset", "episodes", "peak MB", "growth MB", "peak ratio large/small", "result"],
        [
            [
                c["dataset"],
                f"{c['small_episodes']} -> {c['large_episodes']}",
                f"{c['small_peak_mb']:.1f} -> {c['large_peak_mb']:.1f}",
                f"{c['small_growth_mb']:.1f} -> {c['large_growth_mb']:.1f}",
                f"{c['ratio']:.3f}",
                "PASS" if c["pass"] else "MISS",
            ]
            for c in checks
        ],
    )
    experiments["dataset_size"] = {"tolerance": SIZE_TOLERANCE, "checks": checks}

    ok = all(c["pass"] for c in checks)
    worst = max(abs(c["ratio"] - 1) for c in checks)
    conclusion = {
        "mb_per_open_chunk": slope,
        "mb_per_camera": cam_slope,
        "size_ratio_worst": 1 + worst,
        "size_independent": ok,
    }
    print()
    print(
        f"conclusion: +{slope:.2f} MB per extra open chunk per worker (interleave), "
        f"+{cam_slope:.2f} MB per camera at {res}; peak RSS bounded and independent of "
        f"dataset size (within {SIZE_TOLERANCE:.0%}): {'PASS' if ok else 'MISS'} "
        f"(worst ratio {1 + worst:.3f})"
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "memory",
                "quick": args.quick,
                "machine": info,
                "batch_size": BATCH,
                "num_workers": WORKERS,
                "batches": args.batches,
                "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                "experiments": experiments,
                "conclusion": conclusion,
                "runs": list(run.runs.values()),
            },
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
