"""The diversity benchmark runs (``--quick``) and writes complete JSON.

Timings are never asserted (the machine may be busy): only that every setting's diversity, the
uniform and lerobot references and the frames/s of the default and of ``interleave=32`` were
measured, and that the printed tables are there. The script's ``main`` runs in this process
(``--quick`` measures with 0 workers, in its own process: it starts none), which saves starting
Python and importing torch once more.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import run_benchmark_here

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_diversity_benchmark_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "diversity.json"
    code, stdout = run_benchmark_here(
        "diversity.py",
        "--quick",
        "--data-dir",
        str(tmp_path / "data"),
        "--json",
        str(out_json),
        capsys=capsys,
    )
    assert code == 0, stdout[-3000:]
    assert "batch 16, diversity" in stdout and "frames/s, float32" in stdout
    data = json.loads(out_json.read_text())
    (case,) = data["cases"]
    res = case["batches"]["16"]
    default, wide = res["fast (interleave=4)"], res["interleave=32"]
    shuffled = res["default (shuffle)"]
    assert default["interleave"] == 4 and wide["interleave"] == 32
    assert shuffled["interleave"] is None  # the shuffle order has windows, not open chunks
    assert shuffled["w0"][0] > default["w0"][0] and shuffled["w0"][1] < default["w0"][1]
    for key in (default, wide, shuffled):
        for workers in ("w0", "w2"):
            distinct, consecutive = key[workers]
            assert 1 <= distinct <= 16 and 0 <= consecutive <= 15
    # more open chunks: more episodes per batch, fewer consecutive-frame neighbours
    assert wide["w0"][0] > default["w0"][0] and wide["w0"][1] < default["w0"][1]
    for ref in ("uniform", "lerobot"):
        assert 1 <= res[ref][0] <= 16 and 0 <= res[ref][1] <= 15
    for name, by_workers in case["speed_diversity"].items():  # beside frames/s, per row
        ratio, consecutive = by_workers["w0"]
        assert 0 < ratio <= 1.2 and 0 <= consecutive <= 15, name
    assert "episodes /uniform" in stdout
    (speed,) = case["speed"].values()
    assert set(speed) == {"fast (interleave=4)", "default (shuffle)", "interleave=32"}
    for runs in case["speed"].values():
        for ms in runs.values():
            assert ms and all(math.isfinite(m["fps"]) and m["fps"] > 0 for m in ms)
            assert all(m["rss_mb"] > 0 for m in ms)
