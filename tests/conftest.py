"""Shared fixtures: factory datasets (real files), a dataset written by lerobot, open50."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

# Before torch is imported: tests run torch in several processes at once (pytest-xdist,
# DataLoader workers, training and example subprocesses, which inherit this) on a 2-core
# machine, and OpenMP threads that busy-wait starve each other there (seen: a tiny policy's
# backward spinning for 20 CPU-minutes under load). One thread per process unless set.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No transparent huge pages for numpy's large arrays, in the processes tests start (scripts/test
# says why: on CI's virtual machines a fresh huge page costs milliseconds to zero).
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

import warnings
from pathlib import Path

import numpy as np
import pytest

import robo_resume.dataset
from robo_resume.testing import make_dataset

REPO = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/SCRIPT ARGS`` from the repository root (how docs/performance.md runs the
    benchmarks), stdout and stderr captured as text; the test asserts on the result."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_main_here(path: Path, argv: list[str] | None) -> object:
    """Run the script at ``path`` in this process, as ``python PATH ARGV`` would: its ``main``.

    Saves starting Python and importing torch (and lerobot) once more, for a script that runs
    start to end in one process (never a crash and a resume across processes: those keep their
    subprocesses). The script is loaded from its file under a name of its own, with its folder
    first on ``sys.path`` (as for ``python PATH``: the examples' ``tiny_policy``, the
    benchmarks' ``_common``). What a script sets for its own process is put back afterwards:
    ``sys.path``, ``os.environ`` (a benchmark sets ``PYTHONWARNINGS`` for its workers; the
    tests' later subprocesses must not inherit it), the levels of all loggers (the
    ``robo_resume`` logger's; benchmarks/resume.py quiets torchdata's) and ``logging.disable``
    (benchmarks/diversity.py disables INFO); pytest puts the warning filters back itself.
    Returns what ``main`` returned.
    """
    import importlib.util
    import logging

    path_, environ = list(sys.path), dict(os.environ)
    levels, disabled = _logger_levels(), logging.root.manager.disable
    try:
        sys.path.insert(0, str(path.parent))
        name = f"robo_resume_{path.parent.name}_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main(*([argv] if argv is not None else []))
    finally:
        sys.path[:] = path_
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        for name, level in _logger_levels().items():
            if levels.get(name, logging.NOTSET) != level:
                logging.getLogger(name).setLevel(levels.get(name, logging.NOTSET))
        logging.disable(disabled)


def _logger_levels() -> dict[str, int]:
    """The level of every logger created so far, by name."""
    import logging

    loggers = logging.root.manager.loggerDict.items()
    return {name: lg.level for name, lg in loggers if isinstance(lg, logging.Logger)}


def run_example(script: str, *args: object, capsys: pytest.CaptureFixture[str]) -> str:
    """``python examples/SCRIPT ARGS`` in this process (:func:`run_main_here`): what it printed."""
    run_main_here(REPO / "examples" / script, [str(a) for a in args] if args else None)
    return capsys.readouterr().out


def run_benchmark_here(
    script: str, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[object, str]:
    """``python benchmarks/SCRIPT ARGS`` in this process (:func:`run_main_here`): (exit code,
    what it printed to stdout)."""
    code = run_main_here(REPO / "benchmarks" / script, list(args))
    return code, capsys.readouterr().out


def interrupted_run(make, points, *, num_workers, epochs=1, loader_kwargs=None):
    """The training loop of :func:`robo_resume.audit.consume`, stopped after batch
    ``points[-1]``, with the tracker's state saved after each batch ``s`` in ``points``
    (ascending): ``([(role, index list)...], {s: state after batch s})``.

    One interrupted run for several crash points: the state after batch ``s`` (a deep copy:
    what a checkpoint at ``s`` holds) depends on the batches consumed up to then only, so a run
    stopped at ``s`` saves the same. Each resume from it is the caller's fresh dataset and loader.
    """
    import copy

    from robo_resume import CURSOR_KEY

    points = list(points)
    assert points == sorted(set(points)) and points[0] >= 1, points
    ds = make()
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=num_workers, **(loader_kwargs or {}))
    batches, states = [], {}
    for _ in range(epochs):
        for batch in loader:
            role = int(batch[CURSOR_KEY][0, 1])
            batch = tracker.consume(batch)
            batches.append((role, batch["index"].tolist()))
            if len(batches) in points:
                states[len(batches)] = copy.deepcopy(tracker.state_dict())
            if len(batches) == points[-1]:
                return batches, states
    raise AssertionError(f"crash point {points[-1]} is past the run's {len(batches)} batches")


OPEN50 = REPO.parent / "shared" / "datasets" / "open50"
OPEN50_MISSING_VIDEO = (1, 2, 7, 9, 25, 33, 34)
OPEN50_WITH_VIDEO = tuple(e for e in range(50) if e not in OPEN50_MISSING_VIDEO)
CONFORMANCE_STATS = {"items": 0, "max_image_diff": 0.0}

warnings.filterwarnings("ignore", message=".*video decoding and encoding capabilities.*")


# This pytest process decodes video and reads parquet itself (conformance and format tests)
# before it starts DataLoader workers; forking such a process can crash the workers, so the
# workers of in-process tests start from a forkserver. Subprocess tests use the default.
robo_resume.dataset.WORKER_START_METHOD = "forkserver"


@pytest.fixture(autouse=True)
def _no_realtime_scheduling():
    """Put the test process back on its normal CPU policy after each test.

    lerobot's writer encodes AV1 with SVT-AV1, which (as root) switches the calling thread to
    SCHED_FIFO 99; every DataLoader worker and subprocess forked afterwards would inherit it,
    and one spinning real-time process starves the machine. robo_resume's own factory restores
    the policy itself (robo_resume.testing.video); this covers the other writers.
    """
    _normal_policy()  # after session fixtures (set up first) that wrote with lerobot
    yield
    _normal_policy()


def _normal_policy() -> None:
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


@pytest.fixture(scope="session")
def open50() -> Path:
    """The real published dataset in ../shared/datasets/open50 (CI always has it)."""
    if not (OPEN50 / "meta" / "info.json").is_file():
        pytest.skip(f"{OPEN50} is absent: this checkout has no ../shared/datasets beside it")
    return OPEN50


@pytest.fixture(scope="session")
def factory(tmp_path_factory):
    """make_dataset(**kw) cached per keyword set for the whole session."""
    cache = {}

    def make(**kw):
        key = tuple(sorted(kw.items()))
        if key not in cache:
            root = tmp_path_factory.mktemp("factory") / "ds"
            cache[key] = make_dataset(root, **kw)
        return cache[key]

    return make


def write_with_lerobot(
    root: Path,
    lengths=(12, 25, 7, 18),
    *,
    fps: int = 15,
    cameras=("top", "wrist"),
    camera_dtype: str = "video",
    **create_kw,
) -> Path:
    """Write a v3.0 dataset at ``root`` with lerobot's own writer (create, add_frame,
    save_episode, finalize): episodes of ``lengths`` frames, 48x64 ``cameras`` (every frame
    other random 8x8 blocks; ``wrist`` is ``top`` upside down) stored as ``camera_dtype``
    features ("video": mp4s; "image": PNGs in the data parquet), tasks pick/place/push.
    ``create_kw`` goes to ``LeRobotDataset.create`` (e.g. ``video_files_size_in_mb=1e-6`` and
    ``data_files_size_in_mb=1e-6``: one data file and one mp4 per camera for each episode)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (3,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }
    for cam in cameras:
        features[f"observation.images.{cam}"] = {
            "dtype": camera_dtype,
            "shape": (48, 64, 3),
            "names": ["height", "width", "channels"],
        }
    ds = LeRobotDataset.create(
        "local/lerobot_written", fps=fps, features=features, root=root, use_videos=True, **create_kw
    )
    rng = np.random.default_rng(0)
    for ep, length in enumerate(lengths):
        for f in range(length):
            base = rng.integers(0, 255, size=(6, 8, 3), dtype=np.uint8)
            img = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))
            frame = {
                "observation.state": np.array([ep, f, rng.normal()], dtype=np.float32),
                "action": rng.normal(size=2).astype(np.float32),
                "task": ("pick", "place", "push")[ep % 3],
            }
            images = {"top": img, "wrist": img[::-1].copy()}
            for cam in cameras:
                frame[f"observation.images.{cam}"] = images[cam]
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


@pytest.fixture(scope="session")
def lerobot_written(tmp_path_factory) -> Path:
    """A v3.0 dataset written by lerobot's own writer (create/add_frame/save_episode/finalize)."""
    return write_with_lerobot(tmp_path_factory.mktemp("lerobot") / "ds")


@pytest.fixture(scope="session")
def script_zygote(tmp_path_factory):
    """A zygote (tests/train_zygote.py ``--scripts``: torch and robo_resume imported once) that
    forks the ``python examples/SCRIPT`` runs of the crash-and-resume tests, started on first use
    and ended with the session. A forked run starts from the files as a fresh process would
    (the zygote never runs an example itself) and saves the interpreter start and torch import
    (about 2.5 s of CPU per run)."""
    from train_zygote import Zygote

    base = tmp_path_factory.mktemp("script_zygote")
    zygote = Zygote(3, dict(os.environ), base / "zygote.err", scripts=True)
    try:
        yield zygote
    finally:
        zygote.close()


_SCRIPT_RUNS = itertools.count()  # numbers the forked runs' output files


def run_script(zygote, script: Path, *args: object, timeout: float = 240) -> tuple[int, str, str]:
    """``python SCRIPT ARGS`` forked from ``zygote`` (the :func:`script_zygote` fixture) with
    this process's environment: (exit code, stdout, stderr). After ``timeout`` seconds the run
    is killed (its code is then -9)."""
    n = next(_SCRIPT_RUNS)
    out, err = (zygote.errfile.with_name(f"run{n}.{kind}") for kind in ("out", "err"))
    pid = zygote.start("python", [str(script), *map(str, args)], dict(os.environ), out, err)
    code = zygote.wait(pid, timeout)
    return code, out.read_text(), err.read_text()


def _stats_file(pid: int) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"robo_resume_conformance_{pid}.jsonl"


def pytest_collection_modifyitems(config, items):
    """Run the files with tests marked ``slow(seconds)`` first, their longest tests first.

    scripts/test runs pytest-xdist with ``--dist worksteal``: each process starts on its half
    of this order and an idle one takes the other's pending tests from the back. With the long
    subprocess tests (lerobot-train, torchrun, examples) at the front, what is left to take at
    the end is short, and the run does not end with one process still inside a minute-long
    test while the other idles. A file's tests stay together (its module fixtures
    are built once per process); files are ordered by their longest test, longest first. The
    estimate is the test's time measured here. The order changes how the tests are spread over
    processes, never what a test checks.
    """

    def estimate(item) -> float:
        mark = item.get_closest_marker("slow")
        if mark is None:
            return 0.0
        return float(mark.args[0]) if mark.args else 10.0

    longest: dict[str, float] = {}
    for item in items:
        longest[item.fspath] = max(longest.get(item.fspath, 0.0), estimate(item))
    files = {path: i for i, path in enumerate(longest)}  # ties: file order
    items.sort(key=lambda item: (-longest[item.fspath], files[item.fspath], -estimate(item)))


def pytest_sessionfinish(session):
    """Under pytest-xdist, each worker hands its conformance counts to the controller."""
    if hasattr(session.config, "workerinput") and CONFORMANCE_STATS["items"]:
        import json

        with open(_stats_file(os.getppid()), "a") as f:
            f.write(json.dumps(CONFORMANCE_STATS) + "\n")


def pytest_terminal_summary(terminalreporter):
    """Print how many items the lerobot conformance tests compared (for the closing note)."""
    import json

    items, worst = CONFORMANCE_STATS["items"], CONFORMANCE_STATS["max_image_diff"]
    shared = _stats_file(os.getpid())
    if shared.is_file():  # the xdist workers' counts
        for line in shared.read_text().splitlines():
            stats = json.loads(line)
            items += stats["items"]
            worst = max(worst, stats["max_image_diff"])
        shared.unlink()
    if items:
        terminalreporter.write_line(
            f"lerobot conformance: {items} items compared, max image difference {worst}"
        )
