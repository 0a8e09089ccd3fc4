"""The memory benchmark runs (``--quick``) and writes complete JSON with real RSS numbers.

Nothing about the sizes is asserted beyond "positive and present" (the machine may be busy and
allocators differ); only that every measurement reports each worker's peak RSS. The script's
``main`` runs in this process (it only writes the datasets and starts one fresh process per
measurement, as from the command line), which saves starting Python and torch once more.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "memory.py"
MACHINE_KEYS = {"cores", "memory_gb", "cpu", "python", "torch", "av"}


def positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``python benchmarks/memory.py ARGV`` in this process: (exit code, stdout).

    What the script sets for its own process is put back afterwards: the ``sys.path`` entry of
    benchmarks/ (for its ``_common``) and the level of the ``robo_resume`` logger (pytest puts
    the warning filters back itself).
    """
    path, level = list(sys.path), logging.getLogger("robo_resume").level
    try:
        spec = importlib.util.spec_from_file_location("robo_resume_bench_memory", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        code = module.main(argv)
    finally:
        sys.path[:] = path
        logging.getLogger("robo_resume").setLevel(level)
    return code, capsys.readouterr().out


@pytest.mark.slow(24)
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_memory_benchmark_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "memory.json"
    argv = ["--quick", "--json", str(out), "--data-dir", str(tmp_path / "data")]
    code, stdout = run_main(argv, capsys)
    assert code == 0, f"memory.py failed:\n{stdout}"
    assert stdout.startswith("machine: "), stdout[:200]
    assert "conclusion: " in stdout and "MB per extra open chunk" in stdout

    data = json.loads(out.read_text())
    assert {"benchmark", "quick", "machine", "batch_size", "num_workers", "batches"} <= set(data)
    assert {"experiments", "conclusion", "runs"} <= set(data)
    assert data["benchmark"] == "memory" and data["quick"] is True
    assert MACHINE_KEYS <= set(data["machine"])
    assert data["batch_size"] == 32 and data["num_workers"] == 2

    exp = data["experiments"]
    assert {"reference", "interleave", "cameras", "dataset_size"} <= set(exp)
    assert [r["interleave"] for r in exp["interleave"]["rows"]] == [1, 3]
    assert [r["cameras"] for r in exp["cameras"]["rows"]] == [1, 2]
    for key in ("mb_per_open_chunk", "intercept_mb"):
        assert math.isfinite(exp["interleave"][key])
    assert math.isfinite(exp["cameras"]["mb_per_camera"])
    for row in exp["interleave"]["rows"] + exp["cameras"]["rows"]:
        for key in ("baseline_mb", "peak_mb", "max_peak_mb"):
            assert positive(row[key]), (key, row)
    checks = exp["dataset_size"]["checks"]
    assert checks and all(isinstance(c["pass"], bool) for c in checks)
    assert all(positive(c["ratio"]) and c["large_episodes"] > c["small_episodes"] for c in checks)
    assert set(data["conclusion"]) == {
        "mb_per_open_chunk",
        "mb_per_camera",
        "size_ratio_worst",
        "size_independent",
    }

    runs = data["runs"]
    assert len(runs) >= 4
    for run in runs:
        assert run["frames"] == run["batches"] * 32
        assert run["image_dtype"] == "torch.float32"
        assert len(run["workers"]) == 2
        assert len({w["pid"] for w in run["workers"]}) == 2
        for w in run["workers"]:
            for key in ("baseline_mb", "peak_mb", "end_rss_mb"):
                assert positive(w[key]), (key, w)
            assert w["peak_mb"] >= w["end_rss_mb"] - 1e-6
            assert w["growth_mb"] == pytest.approx(w["peak_mb"] - w["baseline_mb"])
        assert positive(run["main"]["peak_mb"]) and positive(run["main"]["before_mb"])
