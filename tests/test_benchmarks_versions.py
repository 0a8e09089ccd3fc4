"""benchmarks/tools/versions.py runs (``--quick``): an old and a new checkout, alternating.

Timings are never asserted (the machine may be busy); only that both versions measured the same
cells of throughput and of resume cost, every value is positive, new/old is the ratio of the
medians, and the JSON holds what the table printed. The old side is this checkout again
(``--old-tree``, an A/A run), so that the test needs no git worktree of another commit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import run_benchmark

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"


@pytest.mark.slow(70)
@pytest.mark.timeout(300)
def test_versions_tool_quick(tmp_path: Path) -> None:
    assert (OPEN50 / "meta" / "info.json").is_file(), f"{OPEN50} is missing (../shared)"
    out_json = tmp_path / "versions.json"
    proc = run_benchmark(
        "tools/versions.py",
        "--old-tree",
        str(REPO),
        "--quick",
        "--data-dir",
        str(tmp_path / "data"),
        "--json",
        str(out_json),
        timeout=280,
    )
    assert proc.returncode == 0, f"versions.py failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith("machine: "), proc.stdout[:200]
    assert f"median of 1 alternating rounds; old = {REPO}, new = this checkout" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["benchmark"] == "versions" and data["quick"] is True and data["rounds"] == 1
    cells = {r["cell"]: r for r in data["rows"]}
    # open50 with 0 workers, with and without windows, uint8 and float32
    throughput = sorted(c for c in cells if c.startswith("throughput "))
    assert throughput == [
        f"throughput (d) W=0 delta={d} {kind}" for d in ("no", "yes") for kind in ("f32", "u8")
    ]
    resume = [c for c in cells if c.startswith("resume first batch ")]
    assert any("(factory)" in c for c in resume) and any("(open50)" in c for c in resume), resume
    for cell, r in cells.items():
        assert r["unit"] == ("s" if cell.startswith("resume") else "frames/s"), r
        assert r["old"] > 0 and r["new"] > 0, r
        assert math.isclose(r["new_over_old"], r["new"] / r["old"], rel_tol=1e-9), r
        assert f"{r['new_over_old']:.2f}" in proc.stdout


def test_versions_tool_names_a_folder_without_the_benchmarks(tmp_path: Path) -> None:
    proc = run_benchmark("tools/versions.py", "--old-tree", str(tmp_path), timeout=120)
    assert proc.returncode != 0
    assert f"--old-tree {tmp_path}: expected a robo_resume checkout" in proc.stderr
