"""Frames per second delivered to a training loop: robo_resume vs lerobot vs the decode ceiling.

Measured side by side in one run, interleaved (A, B, C, A, B, C, ...), ``--repeats`` times
(default 3):

- ``robo_resume``: ``ChunkedEpisodeDataset(...).dataloader(num_workers=W)``, batch 32, images
  as uint8 and as float32 (lerobot's layout);
- ``lerobot``: ``LeRobotDataset(..., video_backend="pyav")`` in a shuffled ``DataLoader`` (what
  lerobot's trainer does), same workers, batch size and ``delta_timestamps``; float32 images;
- ``plain``: ``torch.utils.data.DataLoader(ds, batch_size=32, num_workers=W)`` over the same
  dataset (items collated by torch's ``default_collate``, as lerobot's trainer and hand-written
  loops build it), uint8 and float32, printed as its ratio to ``ds.dataloader()`` (target 0.8x;
  see docs/tuning.md, 'A plain DataLoader');
- ``1 cam``: robo_resume uint8 with ``features=`` keeping the first camera only (the others are
  never opened or decoded), printed as its ratio to all cameras (datasets with 2+ cameras);
- ``ceiling``: one sequential PyAV decode pass (RGB ndarray per frame and camera, one FFmpeg
  thread per decoder as in robo_resume) over the same episodes' videos, no dataset around it.

Each measurement starts the loader, discards ``--warmup`` batches (worker start-up, first seeks),
runs ``gc.collect()`` and times the next ``--batches`` batches; the ceiling collects before it
starts too. Start-up (building datasets and loaders, imports) leaves objects that make the next
full collection due: without the collect it came at about batch 82 of a 0-worker loader on (a)
(84 ms, about 6% of a 128-batch window) and after that not again in 1,500 batches, so it fell
into some timed windows and not others, and never into the ceiling's, which allocates little.
The workers' own full collections are the library's business (``gc.freeze`` at a worker's
start, robo_resume/stream/lifetime.py) and are not touched here. The ceiling decodes at least
``--ceiling-frames`` frames per measurement (short decode runs were the noisiest numbers on this
shared machine).

Repeats look at different parts of the data: repeat ``r``'s loaders all start at the same batch
of epoch 0, spread evenly over the epoch (the first at batch 0, the last ending at the epoch's
end: :func:`window_starts`), with the dataset's own resume (``resume_step=batch * 32``, which
also places the rounds of 2 workers), so ``--warmup`` and the timed batches follow from there.
The ceiling of repeat ``r`` decodes the episodes rotated by ``r / repeats`` of their number
(:func:`ceiling_episodes`; it decodes a share of every episode, so the rotation changes which
episode comes first, not which frames). One fixed window measured the same fifth of the
epoch every time, and on (c) that fifth decodes 1.47 frames per frame delivered against 1.33
over the whole epoch.

How each ratio is formed (the frames/s columns are always the medians of the repeats):

- ``u8/ceiling``, ``f32/ceiling``, ``plain/robo u8``, ``plain/robo f32`` (:data:`PAIRED`): a
  repeat measures plain u8, robo u8, ceiling, robo f32, plain f32 one right after the other,
  each ratio divides two adjacent measurements of the same repeat, and the cell reports the
  median of these per-repeat ratios with their min-max; the ceiling target's verdict uses
  that median. The machine has slow and fast phases (single repeats' u8/ceiling of one cell
  ranged 0.82-1.42), and a ratio of two medians taken at different times mixed them.
- ``f32/lerobot`` (the lerobot target) and ``1 cam/all``: ratio of the two medians (those
  measurements are not adjacent).

Targets: robo_resume float32 against lerobot (both deliver float32 images); robo_resume uint8
against the ceiling (both deliver uint8 RGB frames: the ceiling has no float conversion, which
at 480x640 moves 4 bytes per pixel and costs about as much as decoding). float32 over the
ceiling is printed too. Datasets: (a) factory 96x96, 2 cameras, AV1 with a
keyframe every 2 frames (lerobot's default); (b) the same at 224x224; (c) factory h264 with a
250-frame GOP; (d) ``../shared/datasets/open50`` (the 43 episodes with video, 480x640 mpeg4).
Each with ``num_workers`` 0 and 2, without and with ``delta_timestamps`` (an action horizon of
50 and 2 frames per camera).

Run: ``python benchmarks/throughput.py [--json out/throughput.json] [--datasets a,b,c,d]``;
``--quick`` runs a small version (used by the tests; lerobot, which decodes frame by frame,
is measured in the first repeat of each cell only). Factory datasets are written once to
``--data-dir`` (default ``out/bench_data``) and reused. ``--tuning JSON`` builds every
robo_resume loader with ``StreamTuning(**JSON)`` (e.g. a diverse setting against the ceiling,
issue 15 item 4); ``--u8-only`` measures robo_resume uint8, the ceiling and lerobot only.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, factory_once, machine, print_table, progress, write_json

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"
OPEN50_WITH_VIDEO = [e for e in range(50) if e not in (1, 2, 7, 9, 25, 33, 34)]
BATCH = 32

FACTORY = {
    "a": dict(height=96, width=96, codec="av1", gop=2),
    "b": dict(height=224, width=224, codec="av1", gop=2),
    "c": dict(height=96, width=96, codec="h264", gop=250),
}
DESCRIPTION = {
    "a": "factory 96x96, 2 cams, AV1 gop 2",
    "b": "factory 224x224, 2 cams, AV1 gop 2",
    "c": "factory 96x96, 2 cams, h264 gop 250",
    "d": "open50 (43 episodes with video), 480x640 mpeg4 gop 12",
}
TARGETS = {  # dataset -> (min robo_resume/lerobot, min robo_resume/ceiling): issue 15 item 3
    "a": (4.0, 0.9),
    "b": (None, 0.9),
    "c": (4.0, 0.9),
    "d": (4.0, 0.9),
}


def factory_root(name: str, data_dir: Path, quick: bool) -> Path:
    """Write (once) and return the factory dataset ``name`` under ``data_dir``."""
    return factory_once(
        data_dir / f"{name}{'-quick' if quick else ''}",
        f"({name}) {DESCRIPTION[name]}",
        episode_lengths=(120,) * 6 if quick else (300,) * 20,
        num_cameras=2,
        **FACTORY[name],
    )


class Case:
    """One dataset: where it is, which episodes, its cameras and its delta_timestamps."""

    def __init__(self, name: str, root: Path, episodes: list[int] | None) -> None:
        from robo_resume import load_metadata

        self.name, self.root, self.episodes = name, root, episodes
        self.meta = load_metadata(root)
        fps = self.meta.fps
        action = "actions" if "actions" in self.meta.features else "action"
        self.delta = {action: [i / fps for i in range(50)]}
        for cam in self.meta.camera_keys:
            self.delta[cam] = [-1 / fps, 0.0]


COLLECT = True
"""``gc.collect()`` before every timed window (module docstring); off with ``--quick``, whose
numbers are not read and where the collections (about 80 ms each) were half the test's time."""


def _drain(loader, warmup: int, batches: int, first: list[int] | None = None) -> float:
    """Frames per second of ``batches`` batches after ``warmup`` batches; ``first`` gets the
    ``index`` of the first timed frame appended (where the timed window began)."""
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    if COLLECT:
        gc.collect()  # start-up's pending full collection, not the timed window's (docstring)
    frames = 0
    t = time.perf_counter()
    for k in range(batches):
        b = next(it)
        frames += len(b["index"])
        if k == 0 and first is not None:
            first.append(int(b["index"][0]))
    dt = time.perf_counter() - t
    del it
    return frames / dt


def run_robo(
    case: Case,
    workers: int,
    delta: bool,
    dtype: str,
    warmup: int,
    batches: int,
    one_camera: bool = False,
    plain: bool = False,
    start: int = 0,
    first: list[int] | None = None,
    tuning: dict | None = None,
):
    """robo_resume's frames/s; ``one_camera``: every camera but the first left out with
    ``features=`` (never opened or decoded), as for a policy that uses one camera; ``plain``:
    through ``torch.utils.data.DataLoader(ds, batch_size=32, num_workers=workers)`` instead of
    ``ds.dataloader()``. The loader starts at batch ``start`` of epoch 0 (the dataset's own
    resume, ``resume_step=start * 32``: nothing before it is read) and the ``warmup`` batches
    are discarded from there. ``first``: as in :func:`_drain`. ``tuning``: ``StreamTuning``
    keyword arguments (``--tuning``; None: the defaults)."""
    import torch

    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    dropped = case.meta.camera_keys[1:] if one_camera else ()
    window = {k: v for k, v in case.delta.items() if k not in dropped}
    ds = ChunkedEpisodeDataset(
        case.root,
        batch_size=BATCH,
        episodes=case.episodes,
        features={k: None for k in dropped} or None,
        delta_timestamps=window if delta else None,
        image_dtype=dtype,
        infinite=True,
        resume_step=start * BATCH,
        tuning=StreamTuning(**tuning) if tuning else None,
    )
    if plain:
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers)
    else:
        loader = ds.dataloader(num_workers=workers)
    return _drain(loader, warmup, batches, first)


def run_lerobot(case: Case, workers: int, delta: bool, warmup: int, batches: int):
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(
        "local/bench",
        root=case.root,
        episodes=case.episodes,
        delta_timestamps=case.delta if delta else None,
        video_backend="pyav",
    )
    from robo_resume import worker_context

    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        # this process decodes too (the ceiling): fork would inherit FFmpeg's threads
        multiprocessing_context=worker_context() if workers else None,
    )
    return _drain(loader, warmup, batches)


def ceiling_episodes(case: Case, repeat: int, repeats: int) -> list[int]:
    """The episodes in the order the ceiling of repeat ``repeat`` (of ``repeats``) decodes them:
    the selected episodes rotated by ``repeat * len(episodes) // repeats``, so that each repeat
    starts at another part of the dataset (as its robo_resume measurements start at another
    part of the epoch, :func:`window_starts`)."""
    eps = list(case.episodes or [e.episode_index for e in case.meta.episodes])
    k = repeat * len(eps) // repeats
    return eps[k:] + eps[:k]


def run_ceiling(case: Case, frames: int, episodes: list[int] | None = None) -> float:
    """Frames (all cameras) per second of a plain sequential decode of the case's videos.

    The same content as the loaders see: every selected episode's video (the mp4 its frames
    are in) contributes its share of ``frames``, decoded from the start of the episode's range
    in the file, in order (``episodes``, default the selection's order), to RGB uint8 arrays,
    no dataset around. One FFmpeg thread per decoder, like robo_resume's decoders: PyAV 15.1
    decoders with FFmpeg frame threads deadlocked here when closed in the middle of a stream.
    """
    import av

    eps = episodes or case.episodes or [e.episode_index for e in case.meta.episodes]
    share = -(-frames // len(eps))
    if COLLECT:
        gc.collect()  # as before every loader's timed window
    t = time.perf_counter()
    done = 0
    for e in eps:
        for ref in case.meta.episode(e).videos.values():
            with av.open(str(case.root / ref.path)) as c:
                s = c.streams.video[0]
                s.thread_count = 1
                if ref.from_timestamp > 0:
                    c.seek(int(ref.from_timestamp / s.time_base), stream=s)
                left = share
                for fr in c.decode(s):
                    if fr.time < ref.from_timestamp - 1e-4:
                        continue
                    fr.to_ndarray(format="rgb24")
                    left -= 1
                    if left == 0:
                        break
        done += share
    return done / (time.perf_counter() - t)


def window_starts(epoch_batches: int, need: int, repeats: int) -> list[int]:
    """The batch of epoch 0 at which each repeat's loaders start (``resume_step`` = that x 32).

    Spread evenly so that the repeats' windows of ``need`` batches (warm-up and timed) cover
    the whole epoch: the first starts at batch 0, the last ends at the epoch's last batch. An
    epoch shorter than ``need`` (``--quick`` datasets) puts the starts at ``r / repeats`` of
    it; the windows then run on into epoch 1 (the loader is infinite).
    """
    if repeats == 1:
        return [0]
    room = epoch_batches - need
    if room < 0:
        return [r * epoch_batches // repeats for r in range(repeats)]
    return [round(r * room / (repeats - 1)) for r in range(repeats)]


def epoch_batches(case: Case, workers: int, delta: bool, tuning: dict | None = None) -> int:
    """Batches in one epoch of the cell's loader (``ds.batches_per_epoch(workers)``)."""
    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    ds = ChunkedEpisodeDataset(
        case.root,
        batch_size=BATCH,
        episodes=case.episodes,
        delta_timestamps=case.delta if delta else None,
        infinite=True,
        tuning=StreamTuning(**tuning) if tuning else None,
    )
    return ds.batches_per_epoch(workers)


# ratio -> (numerator, denominator): measured next to each other in every repeat (see measure)
PAIRED = {
    "robo_u8_over_ceiling": ("robo_u8", "ceiling"),
    "robo_f32_over_ceiling": ("robo_f32", "ceiling"),
    "plain_u8_over_robo": ("plain_u8", "robo_u8"),
    "plain_f32_over_robo": ("plain_f32", "robo_f32"),
}


def measure(case: Case, args) -> list[dict]:
    """The cells of one dataset: workers x (without, with delta windows), ``args.repeats`` each.

    One repeat measures, in this order: plain u8, robo u8, ceiling, robo f32, plain f32, then
    1 cam and lerobot; so each ratio of :data:`PAIRED` divides two adjacent measurements of the
    same repeat, and the cell reports the median of those per-repeat ratios and their range.
    Repeat ``r``'s loaders all start at ``window_starts(...)[r]`` and its ceiling at
    ``ceiling_episodes(case, r, repeats)[0]``.
    """
    rows = []
    frames = args.batches * BATCH
    several = len(case.meta.camera_keys) > 1
    for workers, delta in itertools.product(args.workers, (False, True)):
        t_cell = time.perf_counter()
        samples: dict[str, list[float]] = {"robo_u8": [], "robo_f32": [], "lerobot": []}
        samples["ceiling"], samples["robo_u8_1cam"] = [], []
        samples["plain_u8"], samples["plain_f32"] = [], []
        n_batches = epoch_batches(case, workers, delta, args.tuning)
        starts = window_starts(n_batches, args.warmup + args.batches, args.repeats)
        first_episodes: list[int] = []
        first_index: dict[str, list[int]] = {"robo_u8": [], "robo_f32": []}
        for r, start in enumerate(starts):
            order = ceiling_episodes(case, r, args.repeats)
            first_episodes.append(order[0])
            progress(
                f"({case.name}) workers={workers} delta={delta} repeat {r + 1}/{args.repeats}: "
                f"loaders from batch {start} of {n_batches}, ceiling from episode {order[0]}"
            )
            robo = functools.partial(
                run_robo,
                case,
                workers,
                delta,
                warmup=args.warmup,
                batches=args.batches,
                start=start,
                tuning=args.tuning,
            )
            if not args.u8_only:
                samples["plain_u8"].append(robo("uint8", plain=True))
            samples["robo_u8"].append(robo("uint8", first=first_index["robo_u8"]))
            samples["ceiling"].append(
                run_ceiling(case, max(frames, args.ceiling_frames), episodes=order)
            )
            if not args.u8_only:
                samples["robo_f32"].append(robo("float32", first=first_index["robo_f32"]))
                samples["plain_f32"].append(robo("float32", plain=True))
            if several and not args.u8_only:
                samples["robo_u8_1cam"].append(robo("uint8", one_camera=True))
            if not args.no_lerobot and (r == 0 or not args.quick):  # quick: once per cell
                samples["lerobot"].append(
                    run_lerobot(case, workers, delta, args.warmup, args.lerobot_batches)
                )
        progress(
            f"({case.name}) workers={workers} delta={delta}: {args.repeats} repeats in "
            f"{time.perf_counter() - t_cell:.1f} s"
        )
        med = {k: statistics.median(v) if v else None for k, v in samples.items()}
        ratios = {  # (--u8-only measures no float32 or plain loader: those ratios are absent)
            name: [a / b for a, b in zip(samples[num], samples[den], strict=True)]
            for name, (num, den) in PAIRED.items()
            if samples[num]
        }
        row = {
            "dataset": case.name,
            "num_workers": workers,
            "delta_timestamps": delta,
            "fps": med,
            "samples": samples,
            "epoch_batches": n_batches,
            "starts": starts,  # batch of epoch 0 each repeat's loaders start at (then warm-up)
            "first_timed_index": first_index,  # per repeat: the timed window's first frame
            "ceiling_first_episode": first_episodes,
            "ratios": ratios,  # per repeat, PAIRED
            "ratio_ranges": {k: [min(v), max(v)] for k, v in ratios.items()},
            # ratios of the medians (measured apart within a repeat)
            "robo_f32_over_lerobot": med["robo_f32"] / med["lerobot"]
            if med["lerobot"] and med["robo_f32"]
            else None,
            "robo_u8_over_lerobot": med["robo_u8"] / med["lerobot"] if med["lerobot"] else None,
            "one_camera_over_all": med["robo_u8_1cam"] / med["robo_u8"]
            if med["robo_u8_1cam"]
            else None,
        }
        row.update({k: statistics.median(ratios[k]) if k in ratios else None for k in PAIRED})
        row["tuning"] = args.tuning or {}
        rows.append(row)
    return rows


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def _fmt_paired(row: dict, name: str) -> str:
    """A :data:`PAIRED` ratio: median of the repeats' ratios, then their range ("-": not
    measured)."""
    if row[name] is None:
        return "-"
    low, high = row["ratio_ranges"][name]
    if len(row["ratios"][name]) == 1:
        return f"{row[name]:.2f}"
    return f"{row[name]:.2f} ({low:.2f}-{high:.2f})"


def verdicts(rows: list[dict]) -> list[dict]:
    """Each target against the measured ratios: lerobot's with float32 images (what lerobot
    delivers; ratio of the medians), the ceiling's with uint8 images (what the ceiling
    delivers; median of the per-repeat ratios, ``range`` their min and max)."""
    out = []
    for row in rows:
        lr_min, ceil_min = TARGETS[row["dataset"]]
        if lr_min is not None and row["robo_f32_over_lerobot"] is not None:
            out.append(
                {
                    "target": f">= {lr_min}x lerobot (f32)",
                    "dataset": row["dataset"],
                    "num_workers": row["num_workers"],
                    "delta_timestamps": row["delta_timestamps"],
                    "ratio": row["robo_f32_over_lerobot"],
                    "met": row["robo_f32_over_lerobot"] >= lr_min,
                }
            )
        if ceil_min is not None:
            out.append(
                {
                    "target": f">= {ceil_min}x ceiling (u8)",
                    "dataset": row["dataset"],
                    "num_workers": row["num_workers"],
                    "delta_timestamps": row["delta_timestamps"],
                    "ratio": row["robo_u8_over_ceiling"],
                    "range": row["ratio_ranges"]["robo_u8_over_ceiling"],
                    "met": row["robo_u8_over_ceiling"] >= ceil_min,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="a,b,c,d", help="which of a,b,c,d (default all)")
    p.add_argument("--workers", default="0,2", help="num_workers values (default 0,2)")
    p.add_argument("--repeats", type=int, help="measurements per cell (default 3; 1 with --quick)")
    p.add_argument("--batches", type=int, default=40, help="timed batches of robo_resume")
    p.add_argument("--lerobot-batches", type=int, default=15, help="timed batches of lerobot")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--ceiling-frames", type=int, default=2000, help="least frames per ceiling measurement"
    )
    p.add_argument("--data-dir", type=Path, default=REPO / "out" / "bench_data")
    p.add_argument("--no-lerobot", action="store_true", help="skip the lerobot measurements")
    p.add_argument(
        "--quick", action="store_true", help="tiny datasets, one repeat unless --repeats (tests)"
    )
    p.add_argument(
        "--tuning",
        type=json.loads,
        help="StreamTuning keyword arguments for every robo_resume loader, as JSON (default: the "
        "defaults), e.g. a diverse setting against the ceiling",
    )
    p.add_argument(
        "--u8-only",
        action="store_true",
        help="measure robo_resume uint8, the ceiling and lerobot only (no float32, plain, 1 cam)",
    )
    p.add_argument("--json", type=Path, help="write all numbers here")
    args = p.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",")]
    if args.quick:
        args.batches, args.lerobot_batches, args.warmup = 4, 2, 1
        global COLLECT
        COLLECT = False
        args.ceiling_frames = 0
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # workers: lerobot's torchvision notice
    logging.getLogger("robo_resume").setLevel(logging.WARNING)

    from robo_resume import StreamTuning

    wide = StreamTuning(**(args.tuning or {})).interleave >= BATCH
    if wide and not args.quick and (args.warmup < 8 or args.batches < 128):
        progress(
            f"note: interleave >= batch size {BATCH} reads ahead (up to 16 frames of an open "
            "chunk per visit): frames decoded during a short warm-up serve the first timed "
            "batches and flatter the setting; --warmup 8 --batches 128 time whole read-ahead "
            "periods (docs/interleave-order.md, 'Batch diversity')"
        )
    info = machine()
    print(describe_machine(info))
    cases = []
    for name in args.datasets.split(","):
        if name in FACTORY:
            cases.append(Case(name, factory_root(name, args.data_dir, args.quick), None))
        elif name == "d":
            if not (OPEN50 / "meta" / "info.json").is_file():
                progress(f"skipping (d): {OPEN50} is absent")
                continue
            eps = OPEN50_WITH_VIDEO[:6] if args.quick else OPEN50_WITH_VIDEO
            cases.append(Case("d", OPEN50, eps))
        else:
            p.error(f"unknown dataset {name!r}; expected a subset of a,b,c,d")

    rows = []
    for case in cases:
        rows.extend(measure(case, args))
        if args.json:  # partial results survive an interrupted run
            write_json(args.json, {"machine": info, "batch_size": BATCH, "rows": rows})

    table = [
        [
            f"({r['dataset']}) {DESCRIPTION[r['dataset']]}",
            r["num_workers"],
            "yes" if r["delta_timestamps"] else "no",
            _fmt(r["fps"]["robo_u8"]),
            _fmt(r["fps"]["robo_f32"]),
            _fmt(r["fps"]["lerobot"]),
            _fmt(r["fps"]["ceiling"]),
            _fmt(r["robo_f32_over_lerobot"], ".1f"),
            _fmt_paired(r, "robo_u8_over_ceiling"),
            _fmt_paired(r, "robo_f32_over_ceiling"),
            _fmt(r["one_camera_over_all"], ".2f"),
            _fmt_paired(r, "plain_u8_over_robo"),
            _fmt_paired(r, "plain_f32_over_robo"),
        ]
        for r in rows
    ]
    print()
    print(
        f"frames/s delivered to the loop, batch {BATCH}, median of {args.repeats} repeats; "
        "u8/ceiling, f32/ceiling and plain/robo: median of the repeats' own ratios (min-max)"
        + (f"; robo_resume with StreamTuning(**{args.tuning})" if args.tuning else "")
    )
    print_table(
        [
            "dataset",
            "workers",
            "delta",
            "robo u8",
            "robo f32",
            "lerobot",
            "ceiling",
            "f32/lerobot",
            "u8/ceiling",
            "f32/ceiling",
            "1 cam/all",
            "plain/robo u8",
            "plain/robo f32",
        ],
        table,
    )
    print(
        "1 cam/all: frames/s (uint8) with features= keeping the first camera only, over all "
        "cameras: the decoding a policy that uses one camera saves (left-out cameras are never "
        "opened)"
    )
    print(
        "plain/robo: frames/s of torch.utils.data.DataLoader(ds, batch_size=32, num_workers=W) "
        "over ds.dataloader(num_workers=W), same image dtype (target 0.8x)"
    )
    checks = verdicts(rows)
    if checks:
        print()
        print_table(
            ["target", "dataset", "workers", "delta", "ratio", "min-max", "result"],
            [
                [
                    c["target"],
                    c["dataset"],
                    c["num_workers"],
                    "yes" if c["delta_timestamps"] else "no",
                    f"{c['ratio']:.2f}",
                    "{:.2f}-{:.2f}".format(*c["range"]) if "range" in c else "-",
                    "PASS" if c["met"] else "MISS",
                ]
                for c in checks
            ],
        )
    if args.json:
        write_json(
            args.json,
            {
                "machine": info,
                "batch_size": BATCH,
                "args": vars(args),
                "rows": rows,
                "targets": checks,
            },
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
