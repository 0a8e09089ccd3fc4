"""The throughput benchmark runs (``--quick``, open50 with 0 workers) and writes complete JSON.

Timings are never asserted (the machine may be busy); only that robo_resume, lerobot and the
ceiling were all measured, every ratio is there and positive, and the target lines are printed;
and, with two repeats, that each ceiling ratio is the median of the repeats' own ratios and that
the repeats timed different parts of the epoch. The full run (all four datasets, 0 and 2
workers) is in docs/performance.md. The script's ``main`` runs in this process
(``run_benchmark_here``): with 0 workers it starts no process, and the test saves starting
Python and importing torch and lerobot once more.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from conftest import run_benchmark_here

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"


@pytest.mark.slow(20)
@pytest.mark.timeout(300)
def test_throughput_benchmark_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (OPEN50 / "meta" / "info.json").is_file(), f"{OPEN50} is missing (../shared)"
    data, stdout = _quick_open50(tmp_path, capsys, "--repeats", "2")
    assert stdout.startswith("machine: "), stdout[:200]
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
        _check_repeats(row, repeats=2, window=1 + 4)  # --quick: 1 warm-up and 4 timed batches
    targets = data["targets"]
    assert {t["target"] for t in targets} == {">= 4.0x lerobot (f32)", ">= 0.9x ceiling (u8)"}
    assert len(targets) == 4
    assert "f32/lerobot" in stdout and "u8/ceiling" in stdout
    assert "plain/robo u8" in stdout and "plain/robo f32" in stdout
    assert all(("PASS" in line) != ("MISS" in line) for line in stdout.splitlines()[-6:-2])


def _quick_open50(tmp_path: Path, capsys, *args: str) -> tuple[dict, str]:
    """``throughput.py --quick`` on open50 with 0 workers and ``args``: (its JSON, its stdout)."""
    out_json = tmp_path / "throughput.json"
    code, stdout = run_benchmark_here(
        "throughput.py",
        "--quick",
        "--datasets",
        "d",
        "--workers",
        "0",
        *args,
        "--json",
        str(out_json),
        capsys=capsys,
    )
    assert code == 0, f"throughput.py failed:\n{stdout}"
    return json.loads(out_json.read_text()), stdout


def _check_repeats(row: dict, repeats: int, window: int) -> None:
    """Per-repeat ratios of adjacent measurements, their median and range reported; each repeat
    at its own place in epoch 0 (loaders) and in the episode order (ceiling)."""
    samples = row["samples"]
    for name, (num, den) in {
        "robo_u8_over_ceiling": ("robo_u8", "ceiling"),
        "robo_f32_over_ceiling": ("robo_f32", "ceiling"),
        "plain_u8_over_robo": ("plain_u8", "robo_u8"),
        "plain_f32_over_robo": ("plain_f32", "robo_f32"),
    }.items():
        ratios = row["ratios"][name]
        assert len(ratios) == len(samples[num]) == len(samples[den]) == repeats, (name, row)
        assert ratios == pytest.approx(
            [a / b for a, b in zip(samples[num], samples[den], strict=True)]
        )
        assert row[name] == pytest.approx(statistics.median(ratios)), (name, row)
        assert row["ratio_ranges"][name] == [min(ratios), max(ratios)], (name, row)
    # the frames/s columns stay medians
    assert row["fps"]["robo_u8"] == pytest.approx(statistics.median(samples["robo_u8"]))
    starts, epoch = row["starts"], row["epoch_batches"]
    assert len(starts) == repeats and starts[0] == 0, row
    assert len(set(starts)) == repeats, f"repeats started at the same batch: {starts}"
    assert all(s + window <= epoch for s in starts), (starts, epoch)
    assert starts[-1] + window == epoch, "the last window should end at the epoch's end"
    # what the loaders delivered: same place for u8 and f32 in a repeat, another one per repeat
    first = row["first_timed_index"]
    assert first["robo_u8"] == first["robo_f32"], first
    assert len(set(first["robo_u8"])) == repeats, first
    eps = row["ceiling_first_episode"]
    assert len(eps) == repeats and len(set(eps)) == repeats, eps


@pytest.mark.slow(8)
@pytest.mark.timeout(300)
def test_throughput_u8_only_with_a_tuning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--tuning`` reaches every robo_resume loader: the first frame each timed window got is
    the one a dataset built with that tuning yields there (and not the default's); ``--u8-only``
    measures robo_resume uint8 and the ceiling only, and the ratios it has no loader for are
    absent ("-"), not zero."""
    import sys

    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    sys.path.insert(0, str(REPO / "benchmarks"))
    from throughput import OPEN50_WITH_VIDEO

    tuning = {"interleave": 8, "interleave_order": "spread"}
    data, stdout = _quick_open50(
        tmp_path, capsys, "--no-lerobot", "--u8-only", "--tuning", json.dumps(tuning)
    )
    assert f"robo_resume with StreamTuning(**{tuning})" in stdout, stdout
    rows = data["rows"]
    assert len(rows) == 2
    for row in rows:
        assert row["tuning"] == tuning
        assert row["fps"]["robo_u8"] > 0 and row["fps"]["ceiling"] > 0, row
        assert row["robo_u8_over_ceiling"] > 0, row
        for key in ("robo_f32", "plain_u8", "plain_f32", "robo_u8_1cam"):
            assert row["samples"][key] == [] and row["fps"][key] is None, (key, row)
        for key in ("robo_f32_over_ceiling", "plain_u8_over_robo", "plain_f32_over_robo"):
            assert row[key] is None, (key, row)
    table = [line for line in stdout.splitlines() if line.startswith("(d)")]
    assert len(table) == 2 and all(" - " in line for line in table), table

    def first_timed(tun: StreamTuning) -> int:  # --quick: 1 warm-up batch, then the window
        ds = ChunkedEpisodeDataset(
            OPEN50,
            batch_size=32,
            episodes=OPEN50_WITH_VIDEO[:6],
            image_dtype="uint8",
            infinite=True,
            tuning=tun,
        )
        it = iter(ds.dataloader(num_workers=0))
        next(it)
        return int(next(it)["index"][0])

    got = rows[0]["first_timed_index"]["robo_u8"]
    assert got == [first_timed(StreamTuning(**tuning))], got
    # (StreamTuning.fast() differs from the tuning only in the interleave: the default, the
    # shuffle order, happens to give the same first frame there)
    assert got != [first_timed(StreamTuning.fast())], "the test cannot tell the tuning apart"
