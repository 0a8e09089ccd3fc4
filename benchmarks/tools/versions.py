"""No regression, shown: throughput and resume cost of this checkout against an older commit.

Both versions are measured in one run, alternating (old, new, old, new, ...) so that the load of
a shared machine falls on both alike: ``--rounds`` rounds of ``throughput.py --no-lerobot``
(robo_resume uint8 and float32 frames/s per dataset, workers and window) and of
``resume.py --quick`` (time to the first batch at each resume position). The old commit is
checked out into a temporary git worktree beside this checkout (removed at the end), or
``--old-tree`` names a checkout that exists already; each version runs its own
``benchmarks/throughput.py`` and ``benchmarks/resume.py`` with its own code first on
``PYTHONPATH``, in the same interpreter (this one). Prints, per cell, the median of each version
and new/old: throughput ratios above 1 and resume ratios below 1 are improvements; within about
0.9-1.1 is the noise of a shared machine. ``--batches`` (timed batches per throughput cell,
default 120): at 40, an A/A run (one checkout against itself) on a quiet 2-core machine spread
0.83-1.16 on open50's throughput cells; at 120 an old/new run there stayed within 0.95-1.02.

Run: ``python benchmarks/tools/versions.py --old 765e96e [--rounds 3] [--datasets a,d]
[--json out/versions.json]``; ``--quick`` (the tests) runs one round of open50 with 0 workers
and throughput's and resume's own quick modes, e.g. ``--old-tree . --quick`` (A/A).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _common import describe_machine, machine, print_table, progress, write_json

REPO = Path(__file__).resolve().parents[2]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"


def _run(tree: Path, script: str, args: list[str], out: Path) -> dict:
    """Run ``benchmarks/<script>`` of ``tree`` with that tree's package first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--json", str(out)]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} failed in {tree}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return json.loads(out.read_text())


def _throughput_cells(data: dict) -> dict[str, float]:
    cells = {}
    for r in data["rows"]:
        delta = "yes" if r["delta_timestamps"] else "no"
        where = f"({r['dataset']}) W={r['num_workers']} delta={delta}"
        for kind in ("robo_u8", "robo_f32"):
            cells[f"throughput {where} {kind[5:]}"] = r["fps"][kind]
    return cells


def _resume_cells(data: dict) -> dict[str, float]:
    cells = {}
    for name, part in data["first_batch"].items():
        for r in part["rows"]:
            cells[f"resume first batch ({name}) position {r['position']}"] = r["robo_resume_s"]
    return cells


def _measure(old: Path, new: Path, args: argparse.Namespace, tmp: Path) -> dict:
    """Per cell and version (``"old"``, ``"new"``), the values of every round."""
    tp_args = ["--no-lerobot", "--batches", str(args.batches), "--repeats", "1"]
    tp_args += ["--datasets", args.datasets, "--workers", args.workers]
    tp_args += ["--data-dir", str(args.data_dir)] + (["--quick"] if args.quick else [])
    rs_args = ["--quick", "--open50", str(OPEN50)]
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for r in range(args.rounds):
        for label, tree in (("old", old), ("new", new)):
            progress(f"round {r + 1}/{args.rounds}: {label} ({tree})")
            cells = _throughput_cells(_run(tree, "throughput.py", tp_args, tmp / "tp.json"))
            cells |= _resume_cells(_run(tree, "resume.py", rs_args, tmp / "rs.json"))
            for k, v in cells.items():
                samples[label].setdefault(k, []).append(v)
    return samples


def _rows(samples: dict[str, dict[str, list[float]]]) -> list[dict]:
    """One row per cell both versions measured: the medians and new/old."""
    rows = []
    for key, new_values in samples["new"].items():
        if key not in samples["old"]:
            continue
        o, n = statistics.median(samples["old"][key]), statistics.median(new_values)
        unit = "s" if key.startswith("resume") else "frames/s"
        rows.append({"cell": key, "unit": unit, "old": o, "new": n, "new_over_old": n / o})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--old", help="the commit to compare with (e.g. 765e96e)")
    which.add_argument("--old-tree", type=Path, help="a checkout to compare with, as it is")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--datasets", default="a,d", help="throughput datasets (default a,d)")
    p.add_argument("--workers", default="0,2", help="throughput num_workers (default 0,2)")
    p.add_argument(
        "--batches", type=int, default=120, help="timed batches per throughput cell (default 120)"
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / "out" / "bench_data",
        help="factory datasets, written once and shared by both versions",
    )
    p.add_argument("--quick", action="store_true", help="one round, open50, 0 workers (tests)")
    p.add_argument("--json", type=Path, help="write all numbers here")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.datasets, args.workers = 1, "d", "0"
    if args.old_tree is not None and not (args.old_tree / "benchmarks" / "resume.py").is_file():
        p.error(
            f"--old-tree {args.old_tree}: expected a robo_resume checkout with "
            "benchmarks/resume.py, found none; pass the checkout's root folder"
        )
    info = machine()
    print(describe_machine(info))
    with tempfile.TemporaryDirectory() as tmp:
        if args.old_tree is not None:
            samples = _measure(args.old_tree.resolve(), REPO, args, Path(tmp))
        else:
            # beside this checkout, so that its benchmarks find ../shared/datasets like ours
            old = REPO.parent / f".robo_resume_old_{os.getpid()}"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), args.old],
                check=True,
            )
            try:
                samples = _measure(old, REPO, args, Path(tmp))
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)])
    rows = _rows(samples)
    old_name = args.old or str(args.old_tree)
    print()
    print(f"median of {args.rounds} alternating rounds; old = {old_name}, new = this checkout")
    print_table(
        ["cell", "old", "new", "new/old"],
        [
            [
                r["cell"],
                _fmt(r["old"], r["unit"]),
                _fmt(r["new"], r["unit"]),
                f"{r['new_over_old']:.2f}",
            ]
            for r in rows
        ],
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "versions",
                "machine": info,
                "old": old_name,
                "new": str(REPO),
                "rounds": args.rounds,
                "quick": args.quick,
                "rows": rows,
            },
        )
    return 0


def _fmt(value: float, unit: str) -> str:
    return f"{value * 1e3:.1f} ms" if unit == "s" else f"{value:.0f}"


if __name__ == "__main__":
    sys.exit(main())
