"""The resume and open-cost benchmarks run (``--quick``) and write complete JSON.

Timings are never asserted (the machine may be busy); only that every number is there and
positive, and that the target lines are printed. The resume benchmark's ``main`` runs in this
process (it starts no process: one stream, ``num_workers=0``), which saves starting Python and
importing torch once more; the open-cost benchmark measures its own process's memory and keeps
one of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_benchmark, run_benchmark_here

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
MACHINE_KEYS = {"cores", "memory_gb", "cpu", "python", "torch", "av"}


def run(script: str, json_path: Path) -> tuple[dict, str]:
    proc = run_benchmark(script, "--quick", "--json", str(json_path), timeout=120)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith("machine: "), proc.stdout[:200]
    return json.loads(json_path.read_text()), proc.stdout


def positive(row: dict, *keys: str) -> None:
    for key in keys:
        assert isinstance(row[key], float) and row[key] > 0, (key, row)


def test_resume_benchmark_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    json_path = tmp_path / "resume.json"
    code, out = run_benchmark_here("resume.py", "--quick", "--json", str(json_path), capsys=capsys)
    assert code == 0, f"resume.py failed:\n{out}"
    assert out.startswith("machine: "), out[:200]
    data = json.loads(json_path.read_text())
    assert data["benchmark"] == "resume" and data["quick"] is True
    assert MACHINE_KEYS <= set(data["machine"])
    assert data["positions"] == [0, 992, 10**9]

    arith = data["arithmetic"]
    assert [r["position"] for r in arith["rows"]] == data["positions"]
    assert arith["rows"][-1]["mode"] == "infinite"  # 10^9 is past one epoch
    for row in arith["rows"]:
        positive(row, "robo_resume_s", "robo_resume_ratio", "resume_point_s", "ff_loop_s")
    assert arith["rows"][-1]["ff_loop_extrapolated"] is True

    factory = data["first_batch"]["factory"]
    assert [r["position"] for r in factory["rows"]] == data["positions"]
    for row in factory["rows"]:
        positive(row, "robo_resume_s", "robo_resume_ratio", "ff_loop_s", "replay_s")
        assert row["chunks_read"] >= 1
    replayed = [r for r in factory["rows"] if not r["replay_extrapolated"]]
    assert [r["position"] for r in replayed] == [0, 992]
    assert all(r["same_batch_as_replay"] for r in replayed)
    assert "open50" in data["first_batch"]

    targets = {t["dataset"]: t for t in data["targets"]}
    assert "factory" in targets
    assert targets["factory"]["ratio"] > 0 and isinstance(targets["factory"]["pass"], bool)
    assert data["ff_loop_linearity"]["extrapolated_1e9_s"] > 0
    assert "resume to first batch at 10^9 within 1.2x of position 0 [factory]: " in out
    assert "PASS" in out or "MISS" in out


def test_open_cost_benchmark_quick(tmp_path: Path) -> None:
    data, out = run("open_cost.py", tmp_path / "open_cost.json")
    assert data["benchmark"] == "open_cost" and data["quick"] is True
    assert MACHINE_KEYS <= set(data["machine"])
    rows = {r["dataset"]: r for r in data["rows"]}
    synthetic = rows["synthetic 10,000 episodes"]
    assert synthetic["episodes"] == 10_000 and synthetic["version"] == "v3.0"
    for row in rows.values():
        positive(row, "load_metadata_s", "construct_s", "construct_with_meta_s")
        assert row["frames"] > 0 and row["chunks"] > 0
    assert "load_metadata" in out
    (decade,) = data["growth_per_decade"]  # 10^3 -> 10^4 episodes
    assert decade[0] == "1,000 -> 10,000" and "Growth per decade" in out
    assert synthetic["meta_rss_retained_bytes"] is None or synthetic["meta_rss_peak_bytes"] > 0


def test_common_helpers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import _common as C
    finally:
        sys.path.remove(str(BENCH))
    assert C.median_time(lambda: None, 3) >= 0
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        C.median_time(lambda: None, 0)
    C.print_table(["a", "bb"], [["x", 1], ["yy", 22]])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["a   bb", "--  --", "x    1", "yy  22"]
    C.write_json(tmp_path / "x" / "out.json", {"t": 1.5, "p": tmp_path})
    assert json.loads((tmp_path / "x" / "out.json").read_text()) == {"t": 1.5, "p": str(tmp_path)}
    assert MACHINE_KEYS <= set(C.machine())
    assert C.fmt_time(0.0123) == "12.30 ms"
