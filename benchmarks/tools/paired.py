"""Two checkouts of robo_resume against each other in one process: time per sample, paired.

On a shared machine, separate runs of the same code differ by up to 1.5x (measured 2026-11-27,
busy machine); numbers from different processes or times cannot show a 5% change. This
script imports the ``robo_resume/`` of checkout A and of checkout B side by side (each copied
to a temporary folder under its own package name; the package's imports are relative, so each
copy uses only its own modules), builds the same dataset with each, and times them in
alternating blocks of ``--block`` batches (A then B, then B then A, ...), so that both see the
same phases of the machine. It prints the total time per sample of each and their ratio, and
the median of the per-round ratios. An A/A run (the same checkout twice) shows the spread:
0.99-1.03 on this machine while other jobs ran.

``num_workers=0`` only (the main process does the work that is timed), uint8 images, batch 32.
A side's timed block ends when its reads in flight have ended (a stream reads its next block on
a decoding thread while the batch is used): otherwise that decoding would run on the other
side's clock, and a side that reads ahead would be timed as faster than one that does not (by
up to a block per round). ``--step-ms`` adds a simulated training step after every batch (a
loop of 256x256 matrix products on one torch thread, which runs without the GIL), the case
decoding in the background is made for.
Datasets: the factory datasets (a), (b), (c) of ``benchmarks/throughput.py`` and (d) open50;
``--tuning-a`` / ``--tuning-b`` give each side its own ``StreamTuning`` (JSON), e.g. one
decoding thread against two on the same checkout.

Run: ``git worktree add /tmp/base <rev>``, then ``python benchmarks/tools/paired.py . /tmp/base
[--datasets a,c] [--delta both] [--rounds 40] [--json out/paired.json]``; ``--quick`` runs a
small version (used by the tests).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _common import describe_machine, machine, print_table, progress, write_json
from throughput import OPEN50, OPEN50_WITH_VIDEO, REPO, Case, factory_root

BATCH = 32


def load_copy(checkout: Path, name: str, into: Path):
    """``checkout``'s robo_resume package imported as ``name`` (a copy under ``into``)."""
    source = checkout / "robo_resume"
    shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    return importlib.import_module(name)


def settle(pkg) -> None:
    """Wait until no read of ``pkg`` (a copy of robo_resume) runs on its decoding threads."""
    items = pkg.items
    for module in ("threads", "builder"):  # where settle_reads lives (older checkouts: builder)
        wait = getattr(getattr(items, module, None), "settle_reads", None)
        if wait is not None:
            wait()
            return  # a checkout without it (before reading ahead) has nothing in flight


def training_step(ms: float):
    """A function taking about ``ms`` milliseconds of one core without the GIL (torch matrix
    products on one thread; calibrated here), or None for 0."""
    if ms <= 0:
        return None
    import torch

    torch.set_num_threads(1)
    a, w = torch.randn(256, 256), torch.randn(256, 256)

    def run(n: int):
        x = a
        for _ in range(n):
            x = torch.tanh(x @ w)
        return x

    run(20)
    t = time.perf_counter()
    run(200)
    n = max(1, round(ms / ((time.perf_counter() - t) / 200 * 1e3)))
    return lambda: run(n)


def measure(packages, case: Case, delta: bool, tunings, args, step=None) -> dict:
    """Alternating blocks of both packages' batches on ``case``: times per sample and ratios."""
    iterators = []
    for pkg, tuning in zip(packages, tunings, strict=True):
        ds = pkg.ChunkedEpisodeDataset(
            case.root,
            batch_size=BATCH,
            episodes=case.episodes,
            delta_timestamps=case.delta if delta else None,
            image_dtype="uint8",
            infinite=True,
            tuning=pkg.StreamTuning(**tuning),
        )
        it = iter(ds.dataloader(num_workers=0))
        for _ in range(args.warmup):
            next(it)
        iterators.append(it)
    gc.collect()  # start-up's pending full collection, not one side's block (throughput.py)
    totals, ratios = [0.0, 0.0], []
    for r in range(args.rounds):
        spent = [0.0, 0.0]
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            t = time.perf_counter()
            for _ in range(args.block):
                next(iterators[side])
                if step is not None:
                    step()
            settle(packages[side])  # its reads in flight end on its own clock
            spent[side] = time.perf_counter() - t
            totals[side] += spent[side]
        ratios.append(spent[0] / spent[1])
    samples = args.rounds * args.block * BATCH
    return {
        "dataset": case.name,
        "delta_timestamps": delta,
        "us_per_sample": [totals[0] / samples * 1e6, totals[1] / samples * 1e6],
        "a_over_b": totals[0] / totals[1],
        "median_round_ratio": statistics.median(ratios),
        "round_ratios": ratios,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="checkout A (a folder holding robo_resume/)")
    p.add_argument("b", type=Path, help="checkout B")
    p.add_argument("--datasets", default="a,c", help="which of a,b,c,d (default a,c)")
    p.add_argument("--delta", choices=("no", "yes", "both"), default="both")
    p.add_argument("--rounds", type=int, default=40, help="rounds of one block per side")
    p.add_argument("--block", type=int, default=10, help="batches per block")
    p.add_argument("--warmup", type=int, default=30, help="batches per side before timing")
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="a simulated training step of about this many ms after every batch (default 0)",
    )
    p.add_argument("--tuning-a", default="{}", help="StreamTuning of A as JSON")
    p.add_argument("--tuning-b", default=None, help="StreamTuning of B as JSON (default: A's)")
    p.add_argument("--data-dir", type=Path, default=REPO / "out" / "bench_data")
    p.add_argument("--quick", action="store_true", help="tiny dataset, few rounds (tests)")
    p.add_argument("--json", type=Path, help="write all numbers here")
    args = p.parse_args(argv)
    for checkout in (args.a, args.b):
        if not (checkout / "robo_resume" / "__init__.py").is_file():
            p.error(f"{checkout} has no robo_resume/ package (expected a checkout)")
    if args.quick:
        args.rounds, args.block, args.warmup = 2, 2, 1
    tunings = [json.loads(args.tuning_a), json.loads(args.tuning_b or args.tuning_a)]
    warnings.filterwarnings("ignore")
    logging.getLogger("robo_resume").setLevel(logging.WARNING)
    info = machine()
    print(describe_machine(info))
    deltas = {"no": [False], "yes": [True], "both": [False, True]}[args.delta]
    step = training_step(args.step_ms)
    rows = []
    with tempfile.TemporaryDirectory(prefix="robo_resume_paired_") as tmp:
        sys.path.insert(0, tmp)
        try:
            packages = [
                load_copy(args.a.resolve(), "robo_resume_side_a", Path(tmp)),
                load_copy(args.b.resolve(), "robo_resume_side_b", Path(tmp)),
            ]
            for name in args.datasets.split(","):
                if name == "d":
                    case = Case("d", OPEN50, OPEN50_WITH_VIDEO)
                else:
                    case = Case(name, factory_root(name, args.data_dir, args.quick), None)
                for delta in deltas:
                    progress(
                        f"({name}) delta={delta}: {args.rounds} rounds of {args.block} batches"
                    )
                    rows.append(measure(packages, case, delta, tunings, args, step))
        finally:
            sys.path.remove(tmp)
    print(f"\nA = {args.a} {tunings[0]}\nB = {args.b} {tunings[1]}")
    print(
        f"time per sample, 0 workers, uint8, batch {BATCH}; "
        f"alternating blocks of {args.block} batches"
        + (f"; a {args.step_ms:g} ms training step after every batch" if args.step_ms else "")
    )
    print_table(
        ["dataset", "delta", "A us/sample", "B us/sample", "A/B total", "A/B median round"],
        [
            [
                r["dataset"],
                "yes" if r["delta_timestamps"] else "no",
                f"{r['us_per_sample'][0]:.1f}",
                f"{r['us_per_sample'][1]:.1f}",
                f"{r['a_over_b']:.3f}",
                f"{r['median_round_ratio']:.3f}",
            ]
            for r in rows
        ],
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "paired",
                "machine": info,
                "args": vars(args)
                | {
                    "a": str(args.a),
                    "b": str(args.b),
                    "data_dir": str(args.data_dir),
                    "json": str(args.json),
                },
                "tunings": tunings,
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
