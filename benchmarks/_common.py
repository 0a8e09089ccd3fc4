"""Shared helpers of the benchmark scripts: timing, tables, JSON output, machine description.

The scripts are run as ``python benchmarks/<name>.py`` (no package), so they import this module
as ``_common``. Public API, kept small:

- :func:`median_time`: median wall time of a callable over several calls.
- :func:`print_table`: a plain-text table on stdout.
- :func:`write_json`: write a JSON document atomically (numpy scalars and paths allowed).
- :func:`machine`: cores, memory, CPU model, Python, torch and PyAV versions;
  :func:`describe_machine` makes it one line (every script prints it first).
- :func:`progress`: a progress line on stderr.
- :func:`fmt_time`: seconds as a short human string (``"12.3 ms"``).
- :func:`write_synthetic_meta`: the ``meta/`` folder of a v3.0 dataset with many episodes,
  without data or video files (for benchmarks of metadata and arithmetic only).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "describe_machine",
    "fmt_time",
    "machine",
    "median_time",
    "print_table",
    "progress",
    "write_json",
    "write_synthetic_meta",
]


def median_time(fn: Callable[[], Any], repeats: int, *, warmup: int = 0) -> float:
    """Median wall time in seconds of ``fn()`` over ``repeats`` calls (after ``warmup`` calls).

    Everything ``fn`` does is timed; do setup that must not count outside of it.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; found {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fmt_time(seconds: float | None) -> str:
    """``seconds`` as a short string in s, ms or µs (``"-"`` for None)."""
    if seconds is None:
        return "-"
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows under headers on stdout, columns padded (first column left-aligned)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))
    sys.stdout.flush()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):  # numpy arrays
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` (via a temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=2, default=_json_default, allow_nan=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed or no __version__
        return None


def machine() -> dict[str, Any]:
    """What the numbers were measured on: cores, memory, CPU model and library versions."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cores": usable,
        "memory_gb": _memory_gb(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "av": _version("av"),
    }


def describe_machine(info: dict[str, Any] | None = None) -> str:
    """One line describing :func:`machine` (every script prints it first)."""
    m = info or machine()
    return (
        f"machine: {m['cores']} cores, {m['memory_gb']} GB, {m['cpu']}; {m['platform']}; "
        f"python {m['python']}, torch {m['torch']}, av {m['av']}"
    )


def progress(msg: str) -> None:
    """A progress line on stderr (tables go to stdout)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def factory_once(root: Path, label: str, **kwargs: Any) -> Path:
    """``root``, holding the factory dataset ``make_dataset(root, fps=30, episodes_per_file=5,
    **kwargs)``: written on the first call (announced with ``label``), reused after that."""
    from robo_resume.testing import make_dataset

    if not (root / "meta" / "info.json").is_file():
        progress(f"writing factory dataset {label} to {root}")
        make_dataset(root, fps=30, episodes_per_file=5, overwrite=True, **kwargs)
    return root


def write_synthetic_meta(
    root: str | Path,
    episode_lengths: Sequence[int],
    *,
    num_cameras: int = 0,
    episodes_per_file: int = 1000,
    files_per_chunk: int = 1000,
) -> Path:
    """Write the ``meta/`` folder of a v3.0 dataset with ``len(episode_lengths)`` episodes.

    The layout and every column mirror :func:`robo_resume.testing.make_dataset` (which is used
    to write a two-episode template, whose row is then repeated with the right indices, data
    and video file numbers and timestamps): ``meta/info.json``, ``meta/stats.json``,
    ``meta/tasks.parquet`` and ``meta/episodes/chunk-000/file-000.parquet`` with the
    per-episode ``stats/*`` columns. ``episodes_per_file`` consecutive episodes share a data
    file and an mp4 per camera. No ``data/`` or ``videos/`` files are written: loading the
    metadata and planning never open them, reading items would fail. Returns ``root``.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from robo_resume.testing import make_dataset

    root = Path(root)
    lengths = np.asarray(episode_lengths, dtype=np.int64)
    n = len(lengths)
    if n == 0 or lengths.min() <= 0:
        raise ValueError("episode_lengths must be a non-empty sequence of positive ints")
    with tempfile.TemporaryDirectory() as tmp:
        tpl = make_dataset(Path(tmp) / "template", episode_lengths=(3, 3), num_cameras=num_cameras)
        meta_tpl = tpl.root / "meta"
        table = pq.read_table(meta_tpl / "episodes" / "chunk-000" / "file-000.parquet")
        info = json.loads((meta_tpl / "info.json").read_text())
        stats = (meta_tpl / "stats.json").read_text()
        tasks = (meta_tpl / "tasks.parquet").read_bytes()
        task_names = list(tpl.tasks)

    episode = np.arange(n, dtype=np.int64)
    start = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    number = episode // episodes_per_file
    chunk, file = number // files_per_chunk, number % files_per_chunk
    first_of_file = number * episodes_per_file
    offset_in_file = start - start[first_of_file]
    fps = float(info["fps"])
    computed: dict[str, Any] = {
        "episode_index": episode,
        "tasks": [[task_names[e % len(task_names)]] for e in range(n)],
        "length": lengths,
        "data/chunk_index": chunk,
        "data/file_index": file,
        "dataset_from_index": start,
        "dataset_to_index": start + lengths,
    }
    for name in table.column_names:
        if name.startswith("videos/"):
            kind = name.rsplit("/", 1)[1]
            computed[name] = {
                "chunk_index": chunk,
                "file_index": file,
                "from_timestamp": offset_in_file / fps,
                "to_timestamp": (offset_in_file + lengths) / fps,
            }[kind]
    zeros = pa.array(np.zeros(n, dtype=np.int64))
    columns = []
    for field in table.schema:
        if field.name in computed:
            columns.append(pa.array(computed[field.name], type=field.type))
        else:  # stats/* and meta/episodes/*: the template's first row, repeated
            columns.append(table.column(field.name).combine_chunks().take(zeros))
    out = pa.Table.from_arrays(columns, schema=table.schema)

    meta = root / "meta"
    (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
    pq.write_table(out, meta / "episodes" / "chunk-000" / "file-000.parquet")
    (meta / "tasks.parquet").write_bytes(tasks)
    (meta / "stats.json").write_text(stats)
    info.update(
        total_episodes=n,
        total_frames=int(lengths.sum()),
        chunks_size=files_per_chunk,
        splits={"train": f"0:{n}"},
    )
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    return root


def write_synthetic_meta_v21(
    root: str | Path, episode_lengths: Sequence[int], *, num_cameras: int = 0
) -> Path:
    """Write the ``meta/`` folder of a v2.1 dataset with ``len(episode_lengths)`` episodes.

    ``meta/info.json``, ``meta/stats.json`` and ``meta/tasks.jsonl`` come from a two-episode
    :func:`robo_resume.testing.make_dataset` template (``version="v2.1"``);
    ``meta/episodes.jsonl`` holds one line ``{"episode_index", "tasks", "length"}`` per
    episode, as lerobot writes it. No data or video files: loading the metadata and planning
    never open them. Returns ``root``.
    """
    from robo_resume.testing import make_dataset

    root = Path(root)
    lengths = [int(n) for n in episode_lengths]
    if not lengths or min(lengths) <= 0:
        raise ValueError("episode_lengths must be a non-empty sequence of positive ints")
    with tempfile.TemporaryDirectory() as tmp:
        tpl = make_dataset(
            Path(tmp) / "template", version="v2.1", episode_lengths=(3, 3), num_cameras=num_cameras
        )
        meta_tpl = tpl.root / "meta"
        info = json.loads((meta_tpl / "info.json").read_text())
        stats = (
            (meta_tpl / "stats.json").read_text() if (meta_tpl / "stats.json").is_file() else None
        )
        tasks = (meta_tpl / "tasks.jsonl").read_text()
        task_names = list(tpl.tasks)
    meta = root / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    with open(meta / "episodes.jsonl", "w") as f:
        for e, n in enumerate(lengths):
            task = task_names[e % len(task_names)]
            f.write(json.dumps({"episode_index": e, "tasks": [task], "length": n}) + "\n")
    (meta / "tasks.jsonl").write_text(tasks)
    if stats is not None:
        (meta / "stats.json").write_text(stats)
    info.update(
        total_episodes=len(lengths),
        total_frames=sum(lengths),
        total_chunks=(len(lengths) + 999) // 1000,
        chunks_size=1000,
        splits={"train": f"0:{len(lengths)}"},
    )
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    return root
