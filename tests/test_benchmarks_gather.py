"""benchmarks/gather_design.py runs (``--quick``), and its check catches a sketch that differs.

The script measures a read design against the loader; its numbers are only worth reading for
the same batches, which its ``--check`` compares key by key. Timings are never asserted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_benchmark_here

REPO = Path(__file__).resolve().parents[1]
SPREAD = '{"interleave": 32, "interleave_order": "spread"}'


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the quick factory dataset (a) is written once for the module's tests."""
    return tmp_path_factory.mktemp("gather_data")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tuning", ["{}", SPREAD])
def test_gather_design_quick(data_dir: Path, capsys: pytest.CaptureFixture[str], tuning) -> None:
    code, stdout = run_benchmark_here(
        "gather_design.py",
        "--quick",
        "--tuning",
        tuning,
        "--data-dir",
        str(data_dir),
        capsys=capsys,
    )
    assert code == 0, stdout[-3000:]
    assert "check: 12 batches compared, 0 differ" in stdout
    for name in ("ceiling", "loader", "gather"):
        assert f"\n{name} " in stdout, stdout


@pytest.mark.timeout(120)
def test_the_check_sees_one_wrong_window_frame(data_dir: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # put back after the test
    import gather_design as G
    import throughput as T

    case = T.Case("a", T.factory_root("a", data_dir, True), None)
    assert G.check(case, {}, True, 6) == 0
    gather = G.Gather._gather

    def off_by_one(self, rb, fb, held):  # every window shows the frame before: one off
        out = gather(self, rb, fb, held)
        cam = self.cams[0]
        out[cam] = np.ascontiguousarray(out[cam][:, [0, 0]])
        return out

    monkeypatch.setattr(G.Gather, "_gather", off_by_one)
    assert G.check(case, {}, True, 6) == 6
