"""The throughput benchmark runs (``--quick``, open50 with 0 workers) and writes complete JSON.

Timings are never asserted (the machine may be busy); only that robo_resume, lerobot and the
ceiling were all measured, every ratio is there and positive, and the target lines are printed.
The full run (all four datasets, 0 and 2 workers) is in the README's Performance section.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_benchmark

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"


@pytest.mark.slow(21)
@pytest.mark.timeout(300)
def test_throughput_benchmark_quick(tmp_path: Path) -> None:
    assert (OPEN50 / "meta" / "info.json").is_file(), f"{OPEN50} is missing (../shared)"
    out_json = tmp_path / "throughput.json"
    proc = run_benchmark(
        "throughput.py",
        "--quick",
        "--datasets",
        "d",
        "--workers",
        "0",
        "--json",
        str(out_json),
        timeout=280,
    )
    assert proc.returncode == 0, f"throughput.py failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith("machine: "), proc.stdout[:200]
    data = json.loads(out_json.read_text())
    rows = data["rows"]
    assert [(r["dataset"], r["num_workers"], r["delta_timestamps"]) for r in rows] == [
        ("d", 0, False),
        ("d", 0, True),
    ]
    for row in rows:
        for key in ("robo_u8", "robo_f32", "plain_u8", "plain_f32", "lerobot", "ceiling"):
            assert row["fps"][key] > 0, (key, row)
        for key in (
            "robo_f32_over_lerobot",
            "robo_u8_over_lerobot",
            "robo_f32_over_ceiling",
            "robo_u8_over_ceiling",
            "plain_u8_over_robo",
            "plain_f32_over_robo",
        ):
            assert row[key] > 0, (key, row)
    targets = data["targets"]
    assert {t["target"] for t in targets} == {">= 4.0x lerobot (f32)", ">= 0.9x ceiling (u8)"}
    assert len(targets) == 4
    assert "f32/lerobot" in proc.stdout and "u8/ceiling" in proc.stdout
    assert "plain/robo u8" in proc.stdout and "plain/robo f32" in proc.stdout
    assert all(("PASS" in line) != ("MISS" in line) for line in proc.stdout.splitlines()[-6:-2])
