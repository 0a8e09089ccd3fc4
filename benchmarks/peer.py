"""Samples per second into a training loop: robo_resume vs the loader lerobot 0.6's trainer builds.

Measured side by side in one run, interleaved (robo_resume, lerobot+torchcodec, lerobot+pyav,
robo_resume, ...), median of ``--repeats``. Both sides deliver uint8 images, batch 32, 2 workers,
persistent workers, prefetch factor 4:

- ``robo_resume``: ``ChunkedEpisodeDataset(root, batch_size=32, seed=0, image_dtype="uint8",
  delta_timestamps=..., episodes=...)`` and ``ds.dataloader(num_workers=2,
  persistent_workers=True, prefetch_factor=4)``; every batch goes through
  ``ds.tracker().consume(batch)`` as in training. Workers start from a forkserver
  (``worker_context()``): this process also builds lerobot's datasets, which read parquet with
  threads, and forking after that is unsafe (see ``ChunkedEpisodeDataset.dataloader``).
- ``lerobot+<backend>``: what ``lerobot-train`` 0.6.1 builds (``scripts/lerobot_train.py`` and
  ``datasets/factory.py``): ``LeRobotDataset(repo_id, root=root, episodes=...,
  delta_timestamps=..., return_uint8=True, video_backend=backend)``, an ``EpisodeAwareSampler``
  over the episodes' ``dataset_from_index``/``dataset_to_index`` (shuffle, seed 0, with the
  dataset's ``absolute_to_relative_idx``) and ``DataLoader(batch_size=32, num_workers=2,
  persistent_workers=True, prefetch_factor=4, sampler=..., drop_last=False)`` with the trainer's
  default ``multiprocessing_context="spawn"`` (``--peer-start``). Backends "torchcodec" and
  "pyav"; if torchcodec cannot load (FFmpeg's shared libraries missing) one line says so and how
  to fix it, and only pyav is measured.

Each measurement builds the dataset and loader (not timed), then times ``iter()`` to the first
batch separately ("first batch": worker start-up, imports, first seeks; reported, never part of
samples/s), discards ``--warmup`` batches in all (the first included) and times the next
``--batches`` batches of robo_resume or ``--peer-batches`` of lerobot, the latter stopping early
after ``--peer-seconds`` (at least one batch). The default warm-up (12 batches) is more than
the 8 batches two workers with prefetch factor 4 queue while they start: timed batches are
produced, not taken from that queue (with 3 warm-up batches and 20 timed ones lerobot measured
up to 2x faster). Target: robo_resume >= 4x lerobot+torchcodec.

Datasets: (b) the factory dataset of ``benchmarks/throughput.py`` (224x224, 2 cameras, AV1 with a
keyframe every 2 frames, lerobot's default encoding; 20 episodes of 300 frames, written once to
``--data-dir``) and (d) ``../shared/datasets/open50`` (the 43 episodes with video, 480x640
mpeg4, on both sides). Each without and with windows: the action key 50 steps ahead
(``k / fps``, k = 0..49) and each camera 2 frames (``[-1 / fps, 0]``), as ACT / diffusion ask.

Run: ``python benchmarks/peer.py [--json out/peer.json] [--datasets b,d]``; ``--quick`` runs a
tiny version (used by the tests): one repeat of a few batches, (b) with 4 episodes of 64 frames
without windows and open50 with 3 episodes with windows; lerobot's workers start from a
forkserver with lerobot preloaded instead of spawning (a spawned worker imports torch and lerobot,
about 3 s of CPU each, which was most of a quick run's time; steady state is the same).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, factory_once, machine, print_table, progress, write_json
from throughput import BATCH, FACTORY, OPEN50, OPEN50_WITH_VIDEO, REPO, Case, factory_root

WORKERS = 2
PREFETCH = 4
TARGET = 4.0  # robo_resume / lerobot+torchcodec
BACKENDS = ("torchcodec", "pyav")
PEER_START = "spawn"  # lerobot 0.6.1 TrainPipelineConfig.dataloader_multiprocessing_context


def quick_factory_root(data_dir: Path) -> Path:
    """(b) in small for ``--quick``: 4 episodes of 64 frames (written once to ``data_dir``)."""
    return factory_once(
        data_dir / "b-peer-quick",
        "(b) 224x224, 2 cams, AV1 gop 2",
        episode_lengths=(64,) * 4,
        num_cameras=2,
        **FACTORY["b"],
    )


def describe(case: Case) -> str:
    """One line naming the dataset, its selected episodes and frames, and its video."""
    eps = case.episodes or [e.episode_index for e in case.meta.episodes]
    frames = sum(case.meta.episode(e).length for e in eps)
    if case.name == "d":
        return f"open50, {len(eps)} episodes with video, {frames} frames, 480x640 mpeg4"
    f = FACTORY[case.name]
    return (
        f"factory, {len(eps)} episodes, {frames} frames, 2 cams {f['height']}x{f['width']} "
        f"{f['codec'].upper()} gop {f['gop']}"
    )


def start_forkserver() -> None:
    """Start this process's forkserver with both sides' imports preloaded (``--peer-start
    forkserver``): each lerobot worker then forks from it instead of importing torch and lerobot
    itself (about 3 s of CPU per worker). Must run before the first DataLoader starts: the
    preload list of a running forkserver cannot change (``worker_context()`` sets its own)."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    from robo_resume.stream.startup import FORKSERVER_PRELOAD

    mp.set_forkserver_preload([*FORKSERVER_PRELOAD, "lerobot.datasets.lerobot_dataset"])
    forkserver.ensure_running()


def torchcodec_error() -> str | None:
    """None if torchcodec and its FFmpeg libraries load, else the first line of the error."""
    try:
        import torchcodec.decoders  # noqa: F401  (loads libtorchcodec and FFmpeg's libraries)
    except Exception as e:  # ImportError, OSError or RuntimeError, depending on what is missing
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return None


def _drain(
    loader: Any,
    consume: Callable[[Any], Any],
    warmup: int,
    batches: int,
    max_seconds: float | None = None,
) -> dict[str, float]:
    """Samples/s of up to ``batches`` batches after ``warmup`` (first batch timed on its own).

    Stops early once ``max_seconds`` have passed in the timed part (at least one batch is
    timed). Shuts the loader's (persistent) workers down before returning, so that they do not
    compete with the next measurement.
    """
    t0 = time.perf_counter()
    it = iter(loader)
    consume(next(it))
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        consume(next(it))
    gc.collect()  # start-up's pending full collection, not the timed window's (throughput.py)
    samples = done = 0
    t = time.perf_counter()
    while done < batches:
        samples += len(consume(next(it))["index"])
        done += 1
        if max_seconds is not None and time.perf_counter() - t > max_seconds:
            break
    dt = time.perf_counter() - t
    shutdown = getattr(it, "_shutdown_workers", None)  # torch's iterator; private but stable
    if shutdown is not None:
        try:
            shutdown()
        except RuntimeError as exc:
            # Seen with lerobot's torchcodec workers: a worker stopped mid-stream aborts in
            # C++ ("terminate called without an active exception"), and torch's SIGCHLD
            # handler raises here. The measurement above is complete; say so and go on.
            print(f"[bench] note: a worker died while shutting down: {exc}", flush=True)
    del it, loader
    gc.collect()
    return {"samples_per_s": samples / dt, "first_batch_s": first, "batches": done, "seconds": dt}


def run_robo(case: Case, windows: bool, args: argparse.Namespace) -> dict[str, float]:
    from robo_resume import ChunkedEpisodeDataset, StreamTuning, worker_context

    ds = ChunkedEpisodeDataset(
        case.root,
        batch_size=BATCH,
        seed=0,
        image_dtype="uint8",
        delta_timestamps=case.delta if windows else None,
        episodes=case.episodes,
        tuning=StreamTuning(**json.loads(args.tuning)) if args.tuning else None,
    )
    loader = ds.dataloader(
        num_workers=WORKERS,
        persistent_workers=True,
        prefetch_factor=PREFETCH,
        multiprocessing_context=worker_context(),
    )
    tracker = ds.tracker()
    return _drain(loader, tracker.consume, args.warmup, args.batches)


def run_peer(case: Case, windows: bool, backend: str, args: argparse.Namespace) -> dict[str, float]:
    import torch
    from lerobot.datasets import EpisodeAwareSampler
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(
        f"local/{case.root.name}",
        root=case.root,
        episodes=case.episodes,
        delta_timestamps=case.delta if windows else None,
        return_uint8=True,
        video_backend=backend,
    )
    sampler = EpisodeAwareSampler(
        ds.meta.episodes["dataset_from_index"],
        ds.meta.episodes["dataset_to_index"],
        episode_indices_to_use=ds.episodes,
        shuffle=True,
        seed=0,
        absolute_to_relative_idx=ds.absolute_to_relative_idx,
    )
    loader = torch.utils.data.DataLoader(
        ds,
        num_workers=WORKERS,
        batch_size=BATCH,
        shuffle=False,
        sampler=sampler,
        pin_memory=False,  # the trainer pins only on CUDA
        drop_last=False,
        prefetch_factor=PREFETCH,
        persistent_workers=True,
        multiprocessing_context=args.peer_start,
    )
    return _drain(loader, lambda b: b, args.warmup, args.peer_batches, args.peer_seconds)


def measure(case: Case, windows: bool, backends: tuple[str, ...], args) -> dict[str, Any]:
    sides = ("robo_resume", *backends)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for r in range(args.repeats):
        for side in sides:
            progress(f"({case.name}) windows={windows} repeat {r + 1}/{args.repeats}: {side}")
            if side == "robo_resume":
                runs[side].append(run_robo(case, windows, args))
            else:
                runs[side].append(run_peer(case, windows, side, args))
    rate = {s: statistics.median(x["samples_per_s"] for x in runs[s]) for s in sides}
    first = {s: statistics.median(x["first_batch_s"] for x in runs[s]) for s in sides}
    ratio = {b: rate["robo_resume"] / rate[b] for b in backends}
    tc = ratio.get("torchcodec")
    return {
        "dataset": case.name,
        "description": describe(case),
        "windows": windows,
        "samples_per_s": rate,
        "first_batch_s": first,
        "ratio": ratio,
        "target": {"min_over_torchcodec": TARGET, "met": None if tc is None else tc >= TARGET},
        "runs": runs,
    }


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="b,d", help="which of b (factory), d (open50)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=120, help="timed batches of robo_resume")
    p.add_argument("--peer-batches", type=int, default=40, help="timed batches of lerobot")
    p.add_argument(
        "--peer-seconds", type=float, default=20.0, help="stop timing lerobot after this long"
    )
    p.add_argument("--warmup", type=int, default=12, help="batches not timed (first included)")
    p.add_argument(
        "--peer-start",
        choices=("spawn", "forkserver"),
        help=f"how lerobot's workers start (default {PEER_START}, the trainer's; --quick: "
        "forkserver with lerobot preloaded). Start-up is never in samples/s.",
    )
    p.add_argument("--data-dir", type=Path, default=REPO / "out" / "bench_data")
    p.add_argument(
        "--tuning",
        help="robo_resume's StreamTuning keyword arguments as JSON (default: the library "
        'default), e.g. \'{"order": "interleave"}\' for StreamTuning.fast()',
    )
    p.add_argument("--quick", action="store_true", help="tiny datasets, one repeat (tests)")
    p.add_argument("--json", type=Path, help="write all numbers here")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.batches, args.peer_batches, args.warmup = 1, 3, 2, 1
        args.peer_start = args.peer_start or "forkserver"
    args.peer_start = args.peer_start or PEER_START
    if min(args.repeats, args.batches, args.peer_batches, args.warmup) < 1:
        p.error("--repeats, --batches, --peer-batches and --warmup must be >= 1")
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # workers: lerobot's torchvision notice
    logging.getLogger("robo_resume").setLevel(logging.WARNING)

    if args.peer_start == "forkserver":
        start_forkserver()
    info = machine()
    print(describe_machine(info))
    print(
        f"robo_resume with StreamTuning(**{args.tuning})"
        if args.tuning
        else "robo_resume with its default order"
    )
    problem = torchcodec_error()
    if problem is None:
        backends = BACKENDS
    else:
        backends = ("pyav",)
        print(
            f"torchcodec cannot load ({problem}); measuring lerobot with pyav only. "
            "Fix: install FFmpeg's shared libraries (apt-get install ffmpeg)."
        )
    cases = []
    for name in args.datasets.split(","):
        if name == "b":
            root = (
                quick_factory_root(args.data_dir)
                if args.quick
                else factory_root("b", args.data_dir, False)
            )
            cases.append(Case("b", root, None))
        elif name == "d":
            if not (OPEN50 / "meta" / "info.json").is_file():
                p.error(f"{OPEN50} is absent (../shared/datasets/open50)")
            cases.append(
                Case("d", OPEN50, OPEN50_WITH_VIDEO[:3] if args.quick else OPEN50_WITH_VIDEO)
            )
        else:
            p.error(f"unknown dataset {name!r}; expected a subset of b,d")

    doc: dict[str, Any] = {
        "machine": info,
        "batch_size": BATCH,
        "num_workers": WORKERS,
        "prefetch_factor": PREFETCH,
        "backends": list(backends),
        "torchcodec_error": problem,
        "args": vars(args),
        "rows": [],
    }
    for case in cases:
        for windows in (False, True):
            if args.quick and windows != (case.name == "d"):
                continue  # each path once: (b) without windows, (d) with (worker starts dominate)
            doc["rows"].append(measure(case, windows, backends, args))
            if args.json:  # partial results survive an interrupted run
                write_json(args.json, doc)

    rows = doc["rows"]
    print()
    print(
        f"samples/s into the loop (uint8 images, batch {BATCH}, {WORKERS} workers, prefetch "
        f"{PREFETCH}), median of {args.repeats} interleaved repeats; first batch excluded"
    )
    print_table(
        [
            "dataset",
            "windows",
            "robo_resume",
            "lerobot+torchcodec",
            "lerobot+pyav",
            "ours/torchcodec",
            "ours/pyav",
            f">= {TARGET:g}x torchcodec",
        ],
        [
            [
                f"({r['dataset']}) {r['description']}",
                "y" if r["windows"] else "n",
                _fmt(r["samples_per_s"]["robo_resume"]),
                _fmt(r["samples_per_s"].get("torchcodec")),
                _fmt(r["samples_per_s"].get("pyav")),
                _fmt(r["ratio"].get("torchcodec"), ".1f"),
                _fmt(r["ratio"].get("pyav"), ".1f"),
                {True: "PASS", False: "MISS", None: "-"}[r["target"]["met"]],
            ]
            for r in rows
        ],
    )
    print()
    print(
        "first batch (s): iter() to the first batch, worker start-up included (lerobot's "
        f"workers: {args.peer_start}); not in samples/s"
    )
    print_table(
        ["dataset", "windows", "robo_resume", *(f"lerobot+{b}" for b in backends)],
        [
            [
                f"({r['dataset']})",
                "y" if r["windows"] else "n",
                *(_fmt(r["first_batch_s"][s], ".1f") for s in ("robo_resume", *backends)),
            ]
            for r in rows
        ],
    )
    if args.json:
        write_json(args.json, doc)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
