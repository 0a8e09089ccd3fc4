"""No regression, shown: throughput and resume cost of this checkout against an older commit.

Both versions are measured in one run, alternating (old, new, old, new, ...) so that the load of
a shared machine falls on both alike: ``--rounds`` rounds of ``throughput.py --no-lerobot``
(robo_resume uint8 and float32 frames/s per dataset, workers and window) and of
``resume.py --quick`` (time to the first batch at each resume position). The old commit is
checked out into a temporary git worktree beside this checkout (removed at the end); each
version runs with its own code first on ``PYTHONPATH``, in the same interpreter (this one).
Prints, per cell, the median of each version and new/old: throughput ratios above 1 and resume
ratios below 1 are improvements; within about 0.9-1.1 is the noise of this machine.

Run: ``python benchmarks/versions.py --old 765e96e [--rounds 3] [--datasets a,d]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, machine, print_table, progress

REPO = Path(__file__).resolve().parents[1]


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the commit to compare with (e.g. 765e96e)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--datasets", default="a,d", help="throughput datasets (default a,d)")
    p.add_argument("--workers", default="0,2", help="throughput num_workers (default 0,2)")
    p.add_argument("--batches", type=int, default=40, help="timed batches per throughput cell")
    args = p.parse_args(argv)
    print(describe_machine(machine()))
    data_dir = REPO / "out" / "bench_data"  # factory datasets shared by both versions
    tp_args = ["--no-lerobot", "--repeats", "1", "--batches", str(args.batches)]
    tp_args += ["--datasets", args.datasets, "--workers", args.workers, "--data-dir", str(data_dir)]
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        # beside this checkout, so that its benchmarks find ../shared/datasets like ours
        old = REPO.parent / f".robo_resume_old_{os.getpid()}"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), args.old],
            check=True,
        )
        try:
            for r in range(args.rounds):
                for label, tree in (("old", old), ("new", REPO)):
                    progress(f"round {r + 1}/{args.rounds}: {label} ({tree})")
                    cells = _throughput_cells(
                        _run(tree, "throughput.py", tp_args, Path(tmp) / "tp.json")
                    )
                    cells |= _resume_cells(
                        _run(
                            tree,
                            "resume.py",
                            [
                                "--quick",
                                "--open50",
                                str(REPO.parent / "shared" / "datasets" / "open50"),
                            ],
                            Path(tmp) / "rs.json",
                        )
                    )
                    for k, v in cells.items():
                        samples[label].setdefault(k, []).append(v)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)])
    rows = []
    for key in samples["new"]:
        if key not in samples["old"]:
            continue
        o, n = statistics.median(samples["old"][key]), statistics.median(samples["new"][key])
        unit = "s" if key.startswith("resume") else "frames/s"
        fmt = (lambda x: f"{x * 1e3:.1f} ms") if unit == "s" else (lambda x: f"{x:.0f}")
        rows.append([key, fmt(o), fmt(n), f"{n / o:.2f}"])
    print()
    print(f"median of {args.rounds} alternating rounds; old = {args.old}, new = this checkout")
    print_table(["cell", "old", "new", "new/old"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
