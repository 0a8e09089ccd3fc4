"""benchmarks/tools/remote_clients.py runs (``--quick``): every client reads the same ranges.

Timings are never asserted; only that each client's reads were checked against the file's
bytes (the script asserts that itself and would exit non-zero), that obstore, boto3 and
fsspec measured both range sizes on their store, and that the JSON holds the printed rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_benchmark


@pytest.mark.slow(15)
@pytest.mark.timeout(300)
def test_remote_clients_quick(tmp_path: Path) -> None:
    out = tmp_path / "clients.json"
    proc = run_benchmark("tools/remote_clients.py", "--quick", "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "10 ranged reads per row" in proc.stdout
    data = json.loads(out.read_text())
    rows = {(r["store"], r["client"], r["range_kib"]): r for r in data["rows"]}
    for store, client in [
        ("S3", "obstore (robo_resume)"),
        ("S3", "boto3 get_object"),
        ("HTTP", "obstore (robo_resume)"),
        ("HTTP", "fsspec cat_file"),
    ]:
        for kib in (64, 1024):
            row = rows[(store, client, kib)]
            assert row["cpu_ms"] >= 0 and row["wall_ms"] > 0, row
            assert f"{row['wall_ms']:.2f}" in proc.stdout
