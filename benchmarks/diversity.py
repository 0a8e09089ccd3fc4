"""Batch diversity next to frames/s: how many episodes a batch mixes, and at what speed.

For each setting (the default shuffle order, ``StreamTuning.fast()``'s ``interleave=4``, larger
interleaves, smaller chunks) and batch
size, printed side by side:

- ``episodes``: distinct episodes per batch (mean), and its ratio to uniform random sampling;
- ``consec``: neighbouring pairs per batch that are consecutive frames (same episode, frame
  index + 1), mean;
- ``frames/s`` (the settings of ``--speed``, and lerobot's shuffled loader):
  ``ds.dataloader(num_workers=W)`` with ``--dtype`` images (float32 by default, what lerobot
  yields), W = 0 and 2, ``--n`` batches after ``--warmup`` (0: one whole epoch; lerobot:
  ``--lerobot-n`` batches after at most 2, it seeks and decodes frame by frame), median of
  ``--rounds`` rounds taken alternately (A, B, C, then C, B, A, ...), with min-max spread;
- the frames/s table repeats, at its batch size (``--speed-batch``) and worker count, each
  setting's distinct episodes per batch as a ratio to uniform sampling and its consecutive
  pairs, so that speed and diversity are read on one row;
- ``peak RSS``: the largest resident memory of the measuring process (its ``VmHWM``) and of its
  largest DataLoader worker (``ru_maxrss`` of the children), MB.

Diversity is computed from the schedule alone (:class:`robo_resume.index.schedule.Schedule`,
index arithmetic, no decoding) over ``--epochs`` epochs of every stream, with 0 workers and with
2 (a batch is consecutive frames of one stream, i.e. of one worker). Reference rows:

- ``uniform``: uniform random sampling without replacement (a random permutation of all frames
  cut into batches, simulated), what ``shuffle=True`` over frames gives;
- ``lerobot``: lerobot 0.6.1 ``LeRobotDataset(root, video_backend="pyav")`` in
  ``DataLoader(shuffle=True)``: the loader's own batch sampler, its indices looked up in the
  dataset's ``episode_index`` / ``frame_index`` columns (nothing decoded); its frames/s is
  measured like a setting's (forked workers).

Datasets: ``../shared/datasets/open50`` (the 43 episodes with video; lerobot cannot load the
others) and a factory dataset of 10 episodes of 300 frames (96x96, 2 cameras, AV1).

Run: ``python benchmarks/diversity.py [--json out/diversity.json]``; ``--quick``: a small
factory dataset without cameras, two settings, one round, 0 workers, measured in this process,
lerobot's diversity but not its frames/s (used by the tests).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, factory_once, machine, print_table, progress, write_json

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"
OPEN50_WITH_VIDEO = [e for e in range(50) if e not in (1, 2, 7, 9, 25, 33, 34)]

# name -> (StreamTuning kwargs or None for the defaults, chunk_frames or None)
DEFAULT = "fast (interleave=4)"
"""The baseline of the speed columns: StreamTuning.fast(), the default until the shuffle order."""
SHUFFLE = "default (shuffle)"
LEROBOT = "lerobot shuffle=True"
SETTINGS = {
    DEFAULT: ({"order": "interleave"}, None),
    SHUFFLE: (None, None),
    "interleave=8": ({"interleave": 8}, None),
    "interleave=16": ({"interleave": 16}, None),
    "interleave=32": ({"interleave": 32}, None),
    "interleave=64": ({"interleave": 64}, None),
    "interleave=128": ({"interleave": 128}, None),
    "interleave=4, chunk_frames=16": ({"interleave": 4}, 16),
    "rounds, interleave=32": ({"interleave": 32, "interleave_order": "rounds"}, None),
    "rounds, interleave=64": ({"interleave": 64, "interleave_order": "rounds"}, None),
    "spread, interleave=8": ({"interleave": 8, "interleave_order": "spread"}, None),
    "spread, interleave=16": ({"interleave": 16, "interleave_order": "spread"}, None),
    "spread, interleave=32": ({"interleave": 32, "interleave_order": "spread"}, None),
}
SPEED_SETTINGS = (DEFAULT, SHUFFLE, "interleave=16", "interleave=32", "interleave=128", LEROBOT)
"""Settings whose frames/s ``--speed`` measures by default (the first is the baseline)."""
QUICK_SPEED = (DEFAULT, SHUFFLE, "interleave=32")


def _tuning(kw):
    from robo_resume import StreamTuning

    return None if kw is None else StreamTuning(**kw)


def _dataset(root, episodes, batch_size, setting, **kw):
    from robo_resume import ChunkedEpisodeDataset

    tuning_kw, chunk_frames = SETTINGS[setting]
    return ChunkedEpisodeDataset(
        root,
        batch_size=batch_size,
        episodes=episodes,
        chunk_frames=chunk_frames,
        tuning=_tuning(tuning_kw),
        **kw,
    )


def batch_stats(episode: np.ndarray, frame: np.ndarray) -> tuple[float, float]:
    """(mean distinct episodes, mean consecutive-frame neighbour pairs) of batches given as
    ``(batches, B)`` arrays of episode and frame indices."""
    if not len(episode):
        return float("nan"), float("nan")
    ordered = np.sort(episode, axis=1)
    distinct = 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(axis=1)
    consec = ((episode[:, 1:] == episode[:, :-1]) & (frame[:, 1:] == frame[:, :-1] + 1)).sum(1)
    return float(distinct.mean()), float(consec.mean())


def _columns(ds) -> tuple[np.ndarray, np.ndarray]:
    """Episode and frame index of every dataset ``index`` of the dataset's plan."""
    plan = ds.chunks
    size = int((plan.dataset_from_index + (plan.stop - plan.start)).max())
    episode = np.full(size, -1, dtype=np.int64)
    frame = np.full(size, -1, dtype=np.int64)
    for c in range(len(plan)):
        a = int(plan.dataset_from_index[c])
        n = int(plan.stop[c] - plan.start[c])
        episode[a : a + n] = plan.episode_index[c]
        frame[a : a + n] = np.arange(plan.start[c], plan.stop[c])
    return episode, frame


def schedule_diversity(ds, workers: int, epochs: int) -> tuple[float, float]:
    """Diversity of the dataset's batches with ``workers`` DataLoader workers, from the schedule."""
    sched = ds.schedule(workers)
    episode, frame = _columns(ds)
    b = ds.batch_size
    eps, frs = [], []
    for e in range(epochs):
        for s in range(sched.topology.num_streams):
            idx = sched.frame_indices(e, s)
            idx = idx[: len(idx) // b * b].reshape(-1, b)
            eps.append(episode[idx])
            frs.append(frame[idx])
    return batch_stats(np.concatenate(eps), np.concatenate(frs))


def uniform_diversity(ds, epochs: int, seed: int = 0) -> tuple[float, float]:
    """Diversity of uniform random sampling of the dataset's frames (simulated permutations)."""
    episode, frame = _columns(ds)
    keep = np.flatnonzero(episode >= 0)
    rng = np.random.default_rng(seed)
    b = ds.batch_size
    eps, frs = [], []
    for _ in range(epochs):
        p = keep[rng.permutation(len(keep))]
        p = p[: len(p) // b * b].reshape(-1, b)
        eps.append(episode[p])
        frs.append(frame[p])
    return batch_stats(np.concatenate(eps), np.concatenate(frs))


def lerobot_diversity(root, episodes, batch_size: int, epochs: int) -> tuple[float, float]:
    """Diversity of lerobot's ``DataLoader(LeRobotDataset(...), shuffle=True)`` batches: its
    batch sampler's indices, looked up in the dataset's episode and frame index columns."""
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/diversity", root=root, episodes=episodes, video_backend="pyav")
    cols = ds.hf_dataset.select_columns(["episode_index", "frame_index"]).with_format("numpy")
    episode = np.asarray(cols["episode_index"], dtype=np.int64)
    frame = np.asarray(cols["frame_index"], dtype=np.int64)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True)
    batches = [np.asarray(b) for _ in range(epochs) for b in loader.batch_sampler]
    idx = np.stack(batches)
    return batch_stats(episode[idx], frame[idx])


# -- frames/s and memory, one subprocess per measurement ------------------------------------------
def _peak_rss_mb() -> float:
    """This process's peak RSS (MB): ``VmHWM``, read once. ``ru_maxrss`` is not used for the
    process itself: Linux carries it over ``exec`` from the parent (the benchmark's own peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _lerobot_loader(root, episodes, batch_size: int, workers: int):
    """lerobot's shuffled loader: ``DataLoader(LeRobotDataset(...), shuffle=True)``."""
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/diversity", root=root, episodes=episodes, video_backend="pyav")
    # forked workers (this process has decoded nothing yet): their peak RSS is measured
    return torch.utils.data.DataLoader(
        ds, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True
    )


def _epochs(loader):
    """The loader's batches, epoch after epoch, without end."""
    while True:
        yield from loader


def _measure_child(args) -> dict:
    """Frames/s of one setting, and the peak RSS of this process and of its workers (MB)."""
    episodes = json.loads(args.episodes)
    if args.setting == LEROBOT:
        loader = _lerobot_loader(args.root, episodes, args.batch, args.workers)
        if args.n:  # as many batches as asked (several epochs if needed)
            loader = _epochs(loader)
    else:
        ds = _dataset(
            args.root,
            episodes,
            args.batch,
            args.setting,
            image_dtype=args.dtype,
            infinite=bool(args.n),
        )
        loader = ds.dataloader(num_workers=args.workers)
    it = iter(loader)
    for _ in range(args.warmup if args.n else 0):
        next(it)
    gc.collect()  # start-up's pending full collection, not the timed window's (throughput.py)
    frames, t = 0, time.perf_counter()
    for _, batch in zip(range(args.n) if args.n else iter(int, 1), it, strict=False):
        frames += len(batch["index"])
    fps = frames / (time.perf_counter() - t)
    del it, loader  # the workers exit and are reaped: their peak RSS counts below
    own = _peak_rss_mb()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"fps": fps, "rss_mb": own, "worker_rss_mb": kids}


def measure(
    root, episodes, batch, setting, workers, warmup, batches, dtype="float32", fresh=True
) -> dict:
    """Run :func:`_measure_child` in a fresh interpreter (peak RSS of this setting only);
    ``fresh=False``: in this process (``--quick``: no interpreter start-up, RSS not apart)."""
    if not fresh:
        ns = argparse.Namespace(
            root=str(root), episodes=json.dumps(episodes), batch=batch, setting=setting
        )
        ns.workers, ns.warmup, ns.n, ns.dtype = workers, warmup, batches, dtype
        return _measure_child(ns)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--root",
        str(root),
        "--episodes",
        json.dumps(episodes),
        "--batch",
        str(batch),
        "--setting",
        setting,
        "--workers",
        str(workers),
        "--warmup",
        str(warmup),
        "--n",
        str(batches),
        "--dtype",
        dtype,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    if out.returncode:
        raise RuntimeError(f"measurement failed ({setting}, {workers} workers):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def factory_root(data_dir: Path, quick: bool) -> Path:
    """Write (once) the factory dataset: 10 episodes of 300 frames (quick: 6 of 120, no
    cameras: written in a second)."""
    return factory_once(
        data_dir / f"diversity{'-quick' if quick else ''}",
        "(diversity)",
        episode_lengths=(120,) * 6 if quick else (300,) * 10,
        num_cameras=0 if quick else 2,
        height=96,
        width=96,
    )


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def run_case(name, root, episodes, args) -> dict:
    """Every setting's diversity (and the speed settings' frames/s) on one dataset's
    ``episodes`` (None: all)."""
    out: dict = {"dataset": name, "batches": {}}
    settings = list(SETTINGS) if not args.quick else list(QUICK_SPEED)
    for b in args.batch_sizes:
        rows, res = [], {}
        uni = uniform_diversity(_dataset(root, episodes, b, DEFAULT), args.epochs)
        for setting in settings:
            ds = _dataset(root, episodes, b, setting)
            d0 = schedule_diversity(ds, 0, args.epochs)
            d2 = schedule_diversity(ds, 2, args.epochs)
            # open chunks of the interleave order (None: the shuffle order's windows)
            interleave = ds.config.interleave if not ds.config.window else None
            res[setting] = {"w0": d0, "w2": d2, "interleave": interleave}
            rows.append(
                [
                    setting,
                    "-" if interleave is None else interleave,
                    _fmt(d0[0]),
                    _fmt(d0[0] / uni[0]),
                    _fmt(d2[0]),
                    _fmt(d2[0] / uni[0]),
                    _fmt(d0[1]),
                    _fmt(d2[1]),
                ]
            )
        rows.append(["uniform random", "-", _fmt(uni[0]), "1.00", "-", "-", _fmt(uni[1]), "-"])
        res["uniform"] = uni
        if args.lerobot:
            lr = lerobot_diversity(root, episodes, b, args.epochs)
            res["lerobot"] = lr
            cells = ["lerobot shuffle=True", "-", _fmt(lr[0]), _fmt(lr[0] / uni[0]), "-", "-"]
            rows.append([*cells, _fmt(lr[1]), "-"])
        print(f"\n## {name}: batch {b}, diversity (means over {args.epochs} epochs)")
        headers = ["setting", "interleave", "episodes w0", "/uniform", "episodes w2", "/uniform"]
        print_table([*headers, "consec w0", "consec w2"], rows)
        out["batches"][b] = res
    speed = {}
    timed = [s for s in args.speed if s != LEROBOT or args.lerobot]
    for w in args.workers:
        runs: dict = {s: [] for s in timed}
        for r in range(args.rounds):
            for s in timed if r % 2 == 0 else timed[::-1]:
                progress(f"{name}: {s}, {w} workers, round {r + 1}")
                runs[s].append(
                    measure(
                        root,
                        episodes,
                        args.speed_batch,
                        s,
                        w,
                        min(args.warmup, 2) if s == LEROBOT else args.warmup,
                        args.lerobot_n if s == LEROBOT else args.n,
                        args.dtype,
                        fresh=not args.quick,
                    )
                )
        speed[w] = runs
    out["speed"] = speed
    if not speed or not timed:  # --workers or --speed without values: diversity only
        return out
    rows = []
    base = {w: statistics.median(m["fps"] for m in speed[w][timed[0]]) for w in speed}
    div = speed_diversity(root, episodes, args, timed)
    out["speed_diversity"] = div
    for w, runs in speed.items():
        for s, ms in runs.items():
            fps = [m["fps"] for m in ms]
            med = statistics.median(fps)
            ratio, consec = div[s][f"w{w}"]
            rows.append(
                [
                    s,
                    w,
                    _fmt(ratio),
                    _fmt(consec),
                    f"{med:,.0f}",
                    f"{min(fps):,.0f}-{max(fps):,.0f}",
                    f"{med / base[w]:.2f}",
                    f"{max(m['rss_mb'] for m in ms):,.0f}",
                    f"{max(m['worker_rss_mb'] for m in ms):,.0f}" if w else "-",
                ]
            )
    what = f"{args.n} batches" if args.n else "one epoch"
    what += f" (lerobot {args.lerobot_n})" if LEROBOT in timed else ""
    print(
        f"\n## {name}: frames/s, {args.dtype}, batch {args.speed_batch}, {what} after "
        f"{args.warmup}, {args.rounds} rounds"
    )
    headers = ["setting", "workers", "episodes /uniform", "consec", "frames/s (median)"]
    print_table([*headers, "min-max", "/default", "peak RSS MB", "worker peak RSS MB"], rows)
    return out


def speed_diversity(root, episodes, args, settings) -> dict:
    """Per timed setting and worker count (``"w0"``, ``"w2"``): distinct episodes per batch as
    a ratio to uniform sampling and consecutive pairs per batch, at the speed batch size (the
    frames/s table's first columns)."""
    b = args.speed_batch
    ref = _dataset(root, episodes, b, DEFAULT)
    uni = uniform_diversity(ref, args.epochs)
    out = {}
    for s in settings:
        if s == LEROBOT:
            lr = lerobot_diversity(root, episodes, b, args.epochs) if args.lerobot else None
            d = (lr[0] / uni[0], lr[1]) if lr else (float("nan"), float("nan"))
            out[s] = {f"w{w}": d for w in args.workers}
            continue
        ds = _dataset(root, episodes, b, s)
        out[s] = {}
        for w in args.workers:
            d = schedule_diversity(ds, w, args.epochs)
            out[s][f"w{w}"] = (d[0] / uni[0], d[1])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--data-dir", default=str(REPO / "out" / "bench_data"))
    p.add_argument("--datasets", default="open50,factory")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--no-lerobot", dest="lerobot", action="store_false")
    p.add_argument("--speed-batch", type=int, default=32)
    p.add_argument(
        "--speed",
        nargs="*",
        default=list(SPEED_SETTINGS),
        choices=[*SETTINGS, LEROBOT],
        help="settings whose frames/s is measured (the first is the baseline of /default)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "uint8"])
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument(
        "--n", type=int, default=0, help="batches timed per measurement (0: one whole epoch)"
    )
    p.add_argument(
        "--lerobot-n",
        type=int,
        default=20,
        help="batches timed per measurement of lerobot's loader (it decodes frame by frame)",
    )
    # the child process's arguments
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--episodes", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--setting", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[8, 16, 32])
    args = p.parse_args(argv)
    import logging

    logging.disable(logging.INFO)
    if args.child:
        args.workers = args.workers[0]
        print(json.dumps(_measure_child(args)))
        return 0
    if args.quick:
        args.rounds, args.epochs, args.batch_sizes, args.workers = 1, 1, [16], [0]
        args.n, args.warmup, args.speed_batch = 6, 1, 16
        args.speed = list(QUICK_SPEED)
        args.datasets = "factory"
    print(describe_machine())
    results = {"machine": machine(), "cases": []}
    for name in args.datasets.split(","):
        if name == "open50":
            if not (OPEN50 / "meta" / "info.json").is_file():
                progress(f"skipping open50: {OPEN50} is missing")
                continue
            results["cases"].append(run_case("open50", OPEN50, OPEN50_WITH_VIDEO, args))
        else:
            root = factory_root(Path(args.data_dir), args.quick)
            results["cases"].append(run_case("factory", root, None, args))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
