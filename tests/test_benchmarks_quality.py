"""The training-quality benchmark runs (``--quick``) and writes complete JSON; its loader check
can fail.

Timings and the ratios' values are never asserted (the machine may be busy, and a 40-step
training run says nothing about quality): only that every case and order was trained, with
finite positive losses at every checkpoint, that the uniform row is its own baseline (ratio
exactly 1.0), that the printed tables are there, and that the check against the real loader
compared batches. A second test shows that the check fails when the order or the rows differ
from what the loader yields. The script's ``main`` runs in this process (``run_benchmark_here``;
``--quick`` uses 0 DataLoader workers and two forked training processes).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_benchmark_here

from robo_resume.testing import make_dataset

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "quality.py"


def positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.mark.slow(30)
@pytest.mark.timeout(240)
def test_quality_benchmark_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "quality.json"
    code, stdout = run_benchmark_here(
        "quality.py",
        "--quick",
        "--data-dir",
        str(tmp_path / "data"),
        "--json",
        str(out_json),
        capsys=capsys,
    )
    assert code == 0, stdout[-3000:]
    assert stdout.startswith("machine: "), stdout[:200]
    data = json.loads(out_json.read_text())
    cases = {c["case"]: c for c in data["cases"]}
    assert set(cases) == {"open50", "reach-mlp", "reach-cnn"}, set(cases)
    for name, case in cases.items():
        assert f"## {name} (" in stdout and "lr constant, 0 workers, 40 steps, 1 seed" in stdout
        assert case["train_frames"] > 0 and case["val_frames"] > 0, case
        assert not set(case["train_episodes"]) & set(case["val_episodes"]), case
        # the real loader gave the scheduled batches with the training's rows: all 40 of them
        assert case["loader_check_batches"] == {"default": {"w0": 40}, "fast": {"w0": 40}}, name
        (tab,) = case["tables"]
        assert tab["lr"] == "constant" and tab["workers"] == 0
        assert set(tab["orders"]) == {"uniform", "default", "fast"}, tab["orders"].keys()
        for order, row in tab["orders"].items():
            (val,) = row["val"]  # one seed: a validation MSE per checkpoint
            assert len(val) == 3 and all(map(positive, val)), (name, order, val)
            assert all(map(positive, row["train"])) and all(map(positive, row["seconds"]))
            assert set(row["ratio"]) == {"25%", "50%", "100%"}
            for r in row["ratio"].values():
                assert all(map(positive, r["per_seed"])), (name, order, r)
        for r in tab["orders"]["uniform"]["ratio"].values():
            assert r["per_seed"] == [1.0] and r["mean"] == r["min"] == r["max"] == 1.0
        assert tab["orders"]["uniform"]["train_ratio"] == [1.0]
        lines = stdout.split(f"## {name} (", 1)[1].splitlines()[:8]  # the case's table
        for order in ("uniform", "default", "fast"):
            assert any(ln.startswith(order) for ln in lines), (order, lines)


def _load_quality():
    """benchmarks/quality.py as a module (its folder on sys.path for ``_common``)."""
    path = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("robo_resume_bench_quality", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


@pytest.mark.timeout(120)
def test_loader_check_fails_on_a_wrong_order_or_wrong_rows(tmp_path: Path) -> None:
    """The check that guards the benchmark compares real data: the schedule's own order with
    the in-memory rows passes; the same order shifted by one frame, a batch cut short, or one
    frame's image or action changed in memory, each raise ``LoaderMismatch``."""
    q = _load_quality()
    root = make_dataset(tmp_path / "ds", episode_lengths=(40, 35, 30, 45, 28), fps=10).root
    camera = "observation.images.cam0"
    case = q.Case("factory", root, "cnn", ("observation.state",), "action", camera=camera)
    q.load_frames(case)

    def check(expected):  # a new dataset each time: a dataset's loaders go on epoch after epoch
        ds = q.library_dataset(case, q.BASE_ORDERS["default"], seed=3)
        return q.check_loader(case, ds, 0, expected)

    order = q.schedule_order(q.library_dataset(case, q.BASE_ORDERS["default"], seed=3), 0, 8)
    assert sum(map(len, order)) > case.data["train_idx"].size  # into the second epoch
    assert check(order) == 8

    flat = np.concatenate(order)
    shifted = np.split(np.roll(flat, 1), np.cumsum([len(b) for b in order])[:-1])
    with pytest.raises(q.LoaderMismatch, match="index"):
        check(shifted)
    with pytest.raises(q.LoaderMismatch, match="index"):
        check([order[0], order[1][:-1]])

    frame = int(order[2][5])
    image = case.data["image"].copy()
    case.data["image"][frame, 0, 0, 0] ^= 1  # one bit of one pixel
    with pytest.raises(q.LoaderMismatch, match=f"batch 2: the loader's '{camera}'"):
        check(order)
    case.data["image"] = image
    action = case.data["raw"]["action"]
    case.data["raw"]["action"] = changed = action.copy()
    changed[frame, 0] += 1e-3  # in the action chunks of this frame and of the 15 before it
    with pytest.raises(q.LoaderMismatch, match="the loader's 'action'"):
        check(order)
    case.data["raw"]["action"] = action
    assert check(order) == 8


def test_skip_leaves_orders_out_but_never_the_reference() -> None:
    """``--skip`` drops named orders (a long run without ``fast``); the uniform order every
    ratio divides by, and names that are no order, are refused before any work."""
    quality = _load_quality()
    for bad, found in (("uniform", "['uniform']"), ("fats", "['fats']")):
        with pytest.raises(SystemExit) as e:
            quality.main(["--skip", bad, "--cases", "open50"])
        msg = str(e.value)
        assert msg.startswith("--skip takes order names other than 'uniform'"), msg
        assert "'fast'" in msg and msg.endswith(f"found {found}"), msg
