"""benchmarks/tools/paired.py runs (``--quick``): two checkouts side by side in one process.

Timings are never asserted (the machine may be busy); only that both sides were timed on every
row, the ratios are the totals' and positive, and the JSON holds what the table printed. Both
sides are this checkout, imported twice under other names, which must not touch the
``robo_resume`` package of this process.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from conftest import run_benchmark

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"


def test_paired_benchmark_quick(tmp_path: Path) -> None:
    # open50 (../shared): nothing to encode first, so the run is the measuring itself
    assert (OPEN50 / "meta" / "info.json").is_file(), f"{OPEN50} is missing (../shared)"
    out_json = tmp_path / "paired.json"
    proc = run_benchmark(
        "tools/paired.py",
        str(REPO),
        str(REPO),
        "--quick",
        "--datasets",
        "d",
        "--tuning-b",
        '{"camera_threads": 2}',
        "--step-ms",
        "1",
        "--data-dir",
        str(tmp_path / "data"),
        "--json",
        str(out_json),
        timeout=300,
    )
    assert proc.returncode == 0, f"paired.py failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith("machine: "), proc.stdout[:200]
    assert "A/B median round" in proc.stdout
    assert "a 1 ms training step after every batch" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["tunings"] == [{}, {"camera_threads": 2}]
    rows = data["rows"]
    assert [(r["dataset"], r["delta_timestamps"]) for r in rows] == [("d", False), ("d", True)]
    for r in rows:
        a, b = r["us_per_sample"]
        assert a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)
        assert math.isclose(r["a_over_b"], a / b, rel_tol=1e-9)
        assert len(r["round_ratios"]) == 2 and all(x > 0 for x in r["round_ratios"])
        assert f"{r['a_over_b']:.3f}" in proc.stdout


def test_paired_benchmark_names_a_folder_without_the_package(tmp_path: Path) -> None:
    proc = run_benchmark("tools/paired.py", str(REPO), str(tmp_path), timeout=120)
    assert proc.returncode != 0
    assert f"{tmp_path} has no robo_resume/ package (expected a checkout)" in proc.stderr
