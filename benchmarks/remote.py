"""Reading a dataset remotely: frames/s, bytes fetched per byte needed, and resume cost.

Measured side by side in one run, in alternating rounds (every side once per round, the
rounds ``--rounds`` times); each cell is the median of the rounds with their min-max. Every
loader delivers uint8 images in batches of 32 from 2 DataLoader workers:

- ``local``: ``ChunkedEpisodeDataset(root, batch_size=32, image_dtype="uint8", infinite=True)``
  and ``ds.dataloader(num_workers=2)`` (robo_resume's default order and tuning);
- ``http@0ms``, ``http@Lms``: the same on ``http://127.0.0.1:PORT``, a
  ``tests/remote_servers.py`` ``FolderServer`` of the same folder, without and with
  ``--latency-ms`` (default 20) added to every request (``Faults.latency``);
- ``lerobot@0ms``, ``lerobot@Lms``: lerobot 0.6.1's
  ``lerobot.datasets.streaming_dataset.StreamingLeRobotDataset("bench/NAME",
  revision=COMMIT, return_uint8=True)`` (its defaults otherwise: shuffle, a 1000-frame buffer,
  up to 16 shards) on a ``HubServer`` endpoint (``HF_ENDPOINT``), in a
  ``torch.utils.data.DataLoader(batch_size=32, num_workers=2)`` whose workers are spawned (the
  trainer's default). The revision is the server's commit: lerobot's default, its codebase
  version tag, is not a ref of the loopback Hub. It decodes with torchcodec, hard-wired in
  0.6.1 (it has no ``video_backend`` argument); the output says whether torchcodec loads. Its
  parquet goes through ``datasets`` streaming, one shard per data file: with one data file
  only one of the two workers gets a shard (the other ends at once), which is how lerobot
  runs it. It looks frames up at the dataset-global ``index / fps`` and fails on datasets of
  several video files such as open50 (lerobot issue #4524): that row then shows the error.

Each frames/s measurement builds the dataset and loader and discards ``--warmup`` batches
(worker start, the first opens; lerobot's first batch waits for its shuffle buffer), then
times ``--batches`` batches of robo_resume (``--peer-batches`` of lerobot, which stops after
``--peer-seconds``; a lerobot batch that takes longer than ``--peer-timeout`` fails its row).
Targets: ``http@Lms / local >= 0.8`` and ``http@Lms / lerobot@Lms >= 10``, each the median of
the per-round ratios.

Bytes (fetched / needed). Fetched: the body bytes the server sent while the dataset was
built, read and shut down (``Faults.bytes_sent``, every file, ``meta/`` included, a fresh
metadata cache per run). Needed: computed from the items the loop consumed, on the local
copy, as the sum of

- video chunks: for each camera, worker (the batch cursor's stream; lerobot: one group) and
  video file, each maximal run of consecutive frames consumed from that file (frames in file
  order; the order they were emitted in does not matter) costs
  ``SampleTable.frame_range_bytes(first, stop)`` of ``read_sample_table`` (from the keyframe
  at or before the run through its last sample plus the reorder depth);
- open: once per worker and video file it touched, the bytes FFmpeg reads to open it
  (``SampleTable.open_spans()``: the head, the moov, the first packets) that none of that
  worker's chunks holds (every worker process opens its files itself); a worker's runs
  sharing bytes (a keyframe's lead-in) count them once, two workers' twice;
- parquet: once per worker and data file it touched, the compressed bytes of the row groups
  holding a row that worker consumed (every column) plus the footer (its metadata, length and
  magic);
- meta: every file under ``meta/``.

The target, ``<= 1.15``, is read off one whole epoch per remote dataset at 0 ms, consumed to
its end (``infinite=False``): a run stopped after some batches has read ahead of what it
consumed, so the timed runs' ratios (also printed) are higher than an epoch's.

Resume: the time from ``ChunkedEpisodeDataset(..., resume_step=S * 32)`` (a fresh metadata
cache for the remote one) to its loader's first batch, at 5% and at 90% of an epoch (batch
``S`` of epoch 0), locally and at ``http@Lms``, alternating; the late/early ratio reads off
whether the cost is flat in the position (a resume that replays would grow with it).

Datasets: (f) factory, 2 cameras 96x96, AV1 with a keyframe every 2 frames (lerobot's
default encoding), 20 episodes of 300 frames, all in one data file and one mp4 per camera
(the layout lerobot's streaming dataset can read), written once to ``--data-dir``; (g) the
same layout with one 480x640 camera, 10 episodes of 200 frames (frames the size of real
recordings, which lerobot's streaming dataset can read, unlike open50); (d)
``../shared/datasets/open50`` read in place (the 43 episodes with video, 480x640 mpeg4, GOP 12).

Run: ``python benchmarks/remote.py [--datasets f,g,d] [--rounds 3] [--latency-ms 20] [--json
out/remote.json]``; ``--quick`` runs every row tiny (one round, a few batches, (f) with 4
episodes of 64 frames, open50 with 3 episodes; lerobot at the added latency only, resumes over
HTTP only), as tests/test_benchmarks_remote.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # remote_servers.py
from _common import describe_machine, machine, print_table, progress, write_json
from remote_servers import COMMIT, FolderServer, HubServer, free_port
from throughput import BATCH, OPEN50, OPEN50_WITH_VIDEO, REPO

WORKERS = 2
TARGET_LOCAL = 0.8  # http@L / local
TARGET_PEER = 10.0  # http@L / lerobot@L
TARGET_BYTES = 1.15  # fetched / needed over an epoch
FACTORY = dict(num_cameras=2, height=96, width=96, codec="av1", gop=2)
LARGE = dict(num_cameras=1, height=480, width=640, codec="av1", gop=2)
DESCRIPTION = {
    "f": "factory, 2 cams 96x96 AV1 gop 2, one file per camera",
    "g": "factory, 1 cam 480x640 AV1 gop 2, one file",
    "d": "open50, 480x640 mpeg4 gop 12",
}


# --------------------------------------------------------------------------- datasets


def factory_root(data_dir: Path, quick: bool, name: str = "f") -> Path:
    """(f) or (g), written once to ``data_dir``: every episode in one data file and one mp4 a
    camera (the layout lerobot's streaming dataset reads)."""
    from robo_resume.testing import make_dataset

    if name == "f":
        lengths, kw = ((64,) * 4 if quick else (300,) * 20), FACTORY
    else:
        lengths, kw = ((32,) * 2 if quick else (200,) * 10), LARGE
    root = data_dir / f"remote-{name}{'-quick' if quick else ''}"
    if not (root / "meta" / "info.json").is_file():
        progress(f"writing factory dataset ({name}) to {root}")
        make_dataset(
            root,
            fps=30,
            episode_lengths=lengths,
            episodes_per_file=len(lengths),
            overwrite=True,
            **kw,
        )
    return root


class Case:
    """One dataset: name, local root, selected episodes (None: all), frames and needs."""

    def __init__(self, name: str, root: Path, episodes: list[int] | None) -> None:
        from robo_resume import load_metadata

        self.name, self.root, self.episodes = name, root, episodes
        self.meta = load_metadata(root)
        eps = episodes if episodes is not None else [e.episode_index for e in self.meta.episodes]
        self.frames = sum(self.meta.episode(e).length for e in eps)
        self.steps = self.frames // BATCH
        self.needs = Needs(self.meta, root)
        self.description = f"{DESCRIPTION[name]}, {len(eps)} episodes, {self.frames} frames"


class Needs:
    """The bytes a reader needs for a set of consumed items (module docstring, "Bytes")."""

    def __init__(self, meta: Any, root: Path) -> None:
        self.meta, self.root = meta, root
        self._tables: dict[str, Any] = {}
        self._parquet: dict[str, Any] = {}
        self.meta_bytes = sum(p.stat().st_size for p in (root / "meta").rglob("*") if p.is_file())

    def table(self, rel: str) -> Any:
        """The sample table of the video file ``rel`` (read from the local copy, once)."""
        from robo_resume.format.mp4_ranges import read_sample_table

        if rel not in self._tables:
            data = (self.root / rel).read_bytes()
            self._tables[rel] = read_sample_table(
                lambda s, e: data[s:e], len(data), name=str(self.root / rel)
            )
        return self._tables[rel]

    def parquet(self, rel: str) -> tuple[Any, Any, Any, int]:
        """(index column, row-group starts, row-group compressed bytes, footer bytes) of ``rel``."""
        import numpy as np
        import pyarrow.parquet as pq

        if rel not in self._parquet:
            path = self.root / rel
            md = pq.ParquetFile(path).metadata
            index = pq.read_table(path, columns=["index"]).column("index").to_numpy()
            rows = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            starts = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.int64)
            sizes = np.array(
                [
                    sum(
                        md.row_group(i).column(c).total_compressed_size
                        for c in range(md.num_columns)
                    )
                    for i in range(md.num_row_groups)
                ],
                dtype=np.int64,
            )
            self._parquet[rel] = (index, starts, sizes, md.serialized_size + 8 + 4)
        return self._parquet[rel]

    def of(self, consumed: dict[str, Any]) -> dict[str, int]:
        """Needed bytes by part for ``consumed`` (arrays ``index``, ``episode_index``,
        ``frame_index`` and ``group``, one entry per item consumed)."""
        import numpy as np

        from robo_resume.format.ranged_file import merge_spans

        index = np.asarray(consumed["index"], dtype=np.int64)
        episode = np.asarray(consumed["episode_index"], dtype=np.int64)
        frame = np.asarray(consumed["frame_index"], dtype=np.int64)
        group = np.asarray(consumed["group"], dtype=np.int64)
        fps = float(self.meta.fps)
        chunks = opens = parquet = 0
        files: dict[str, list[int]] = {}
        for e in np.unique(episode):
            files.setdefault(self.meta.episode(int(e)).data_path, []).append(int(e))
        for rel, eps in files.items():
            col, starts, sizes, footer = self.parquet(rel)
            order = np.argsort(col, kind="stable")
            for g in np.unique(group):  # each worker reads the rows it consumes itself
                wanted = index[np.isin(episode, eps) & (group == g)]
                if not len(wanted):
                    continue
                rows = order[np.searchsorted(col, wanted, sorter=order)]
                if not np.array_equal(col[rows], wanted):
                    raise RuntimeError(f"{rel}: consumed indices missing from the data file")
                touched = np.unique(np.searchsorted(starts, rows, side="right") - 1)
                parquet += int(sizes[touched].sum()) + footer
        for cam in self.meta.camera_keys:
            per_file: dict[str, list[tuple[int, int]]] = {}  # path -> [(group, frame in file)]
            for e in np.unique(episode):
                ref = self.meta.episode(int(e)).videos[cam]
                st = self.table(ref.path)
                sel = episode == e
                t = ref.from_timestamp + frame[sel] / fps
                times = st.frame_times
                j = np.clip(np.searchsorted(times, t), 1, len(times) - 1)
                j = np.where(np.abs(times[j - 1] - t) <= np.abs(times[j] - t), j - 1, j)
                if np.any(np.abs(times[j] - t) > 0.5 / fps):
                    raise RuntimeError(f"{ref.path}: a consumed frame has no frame in the file")
                pairs = zip(group[sel].tolist(), j.tolist(), strict=True)
                per_file.setdefault(ref.path, []).extend(pairs)
            for rel, seen in per_file.items():
                st = self.table(rel)
                spans_open = merge_spans(st.open_spans())
                for g in {g for g, _ in seen}:
                    fr = np.unique([f for gg, f in seen if gg == g])
                    breaks = np.flatnonzero(np.diff(fr) != 1) + 1
                    spans = [
                        st.frame_range_bytes(int(run[0]), int(run[-1]) + 1)
                        for run in np.split(fr, breaks)
                    ]
                    mine = merge_spans(spans)  # a group's runs may share a keyframe's lead-in
                    chunks += _length(mine)
                    # each worker opens the file itself: its head and moov, less what its
                    # chunks hold
                    opens += _length(spans_open) - _overlap(spans_open, mine)
        total = chunks + opens + parquet + self.meta_bytes
        return {
            "video_chunks": chunks,
            "open": opens,
            "parquet": parquet,
            "meta": self.meta_bytes,
            "total": total,
        }


def _length(spans: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in spans)


def _overlap(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> int:
    """Bytes two lists of disjoint spans have in common."""
    return sum(max(0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


# --------------------------------------------------------------------------- servers


class FixedPortHub(HubServer):
    """A :class:`HubServer` on a given port: ``HF_ENDPOINT`` is read once, when
    huggingface_hub is imported, so every dataset's Hub is served at the same address."""

    def __init__(self, root: Path, repo_id: str, port: int) -> None:
        super().__init__(root, repo_id=repo_id)
        self.fixed_port = port

    async def _start(self) -> int:
        from aiohttp import web

        self._runner = web.AppRunner(
            self.app(), handle_signals=False, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.fixed_port).start()
        return self.fixed_port


def _fresh_cache(args: argparse.Namespace) -> None:
    """A new, empty robo_resume metadata cache for the next remote dataset built here."""
    os.environ["ROBO_RESUME_CACHE"] = tempfile.mkdtemp(dir=args.tmp, prefix="cache-")


def _served(server: Any) -> dict[str, int]:
    """Body bytes ``server`` sent since it was armed: in all and per top folder."""
    with server.faults.lock:
        sent = dict(server.faults.bytes_sent)
    out = {"total": sum(sent.values()), "videos": 0, "data": 0, "meta": 0, "other": 0}
    for path, n in sent.items():
        top = path.split("/", 1)[0]
        out[top if top in ("videos", "data", "meta") else "other"] += n
    return out


def _cold_lerobot_caches() -> None:
    """Empty lerobot's and huggingface's caches (this run's temporary folders): each lerobot
    run fetches its metadata, as robo_resume's runs do with their fresh cache."""
    for var in ("HF_HOME", "HF_LEROBOT_HOME"):
        shutil.rmtree(os.environ[var], ignore_errors=True)


def _arm(server: Any, latency_ms: float) -> None:
    server.faults.clear()  # zero counts (and latency)
    server.faults.latency = latency_ms / 1000.0


# --------------------------------------------------------------------------- loaders


def _shutdown(it: Any) -> None:
    shutdown = getattr(it, "_shutdown_workers", None)  # torch's iterator; private but stable
    if shutdown is not None:
        try:
            shutdown()
        except RuntimeError as exc:  # a torchcodec worker aborting at exit (benchmarks/peer.py)
            progress(f"note: a worker died while shutting down: {exc}")


def _take(consumed: dict[str, list], batch: Any, group: Any) -> int:
    n = len(batch["index"])
    for key in ("index", "episode_index", "frame_index"):
        consumed[key].extend(batch[key].tolist())
    consumed["group"].extend(group if group is not None else [0] * n)
    return n


def _drain(
    loader: Any, warmup: int, batches: int, max_seconds: float | None, cursor: bool
) -> dict[str, Any]:
    """Frames/s of up to ``batches`` batches after ``warmup``, and every item consumed.

    Stops at the loader's end (an epoch) when it comes first; ``batches=0``: read to the end.
    """
    consumed: dict[str, list] = {"index": [], "episode_index": [], "frame_index": [], "group": []}

    def group(b: Any) -> Any:
        return b["robo_resume_cursor"][:, 1].tolist() if cursor else None

    t0 = time.perf_counter()
    it = iter(loader)
    first_s = None
    frames = done = 0
    t = time.perf_counter()
    try:
        for _ in range(warmup):
            b = next(it)
            first_s = first_s or time.perf_counter() - t0
            _take(consumed, b, group(b))
        gc.collect()
        t = time.perf_counter()
        while batches == 0 or done < batches:
            b = next(it)
            frames += _take(consumed, b, group(b))
            done += 1
            if max_seconds is not None and time.perf_counter() - t > max_seconds:
                break
    except StopIteration:
        pass
    dt = time.perf_counter() - t
    _shutdown(it)
    del it, loader
    gc.collect()
    return {
        "frames_per_s": frames / dt if frames else None,
        "first_batch_s": first_s,
        "timed_batches": done,
        "seconds": dt,
        "consumed": consumed,
    }


def robo_dataset(source: str | Path, case: Case, **kw: Any) -> Any:
    """robo_resume's dataset of ``case`` at ``source`` (a folder or URL), uint8 images."""
    from robo_resume import ChunkedEpisodeDataset

    return ChunkedEpisodeDataset(
        source, batch_size=BATCH, image_dtype="uint8", episodes=case.episodes, **kw
    )


def run_robo(
    source: str | Path, case: Case, warmup: int, batches: int, *, infinite: bool = True
) -> dict[str, Any]:
    """robo_resume's frames/s (and items consumed) from ``source``."""
    ds = robo_dataset(source, case, infinite=infinite)
    return _drain(ds.dataloader(num_workers=WORKERS), warmup, batches, None, cursor=True)


def run_lerobot(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """lerobot's streaming dataset on the loopback Hub: frames/s, or the error it raised."""
    import torch
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

    try:
        ds = StreamingLeRobotDataset(
            f"bench/{case.name}", episodes=case.episodes, revision=COMMIT, return_uint8=True
        )
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=BATCH,
            num_workers=WORKERS,
            multiprocessing_context="spawn",
            timeout=args.peer_timeout,  # a batch not ready by then fails the row
        )
        return _drain(loader, args.warmup, args.peer_batches, args.peer_seconds, cursor=False)
    except Exception as e:  # lerobot's own failure (e.g. issue #4524 on open50) is the result
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")
        if not last.startswith(type(e).__name__):
            last = f"{type(e).__name__}: {last}"
        return {"error": "failed: " + last[:100]}


def first_batch_after_resume(source: str | Path, case: Case, step: int) -> float:
    """Seconds from constructing a dataset resumed at batch ``step`` to its first batch."""
    t0 = time.perf_counter()
    ds = robo_dataset(source, case, resume_step=step * BATCH)
    it = iter(ds.dataloader(num_workers=WORKERS))
    next(it)
    dt = time.perf_counter() - t0
    _shutdown(it)
    del it, ds
    gc.collect()
    return dt


# --------------------------------------------------------------------------- measurement


def _spread(xs: list[float]) -> dict[str, float | None]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def measure(case: Case, args: argparse.Namespace, hub_port: int) -> dict[str, Any]:
    """Every row of one dataset, its servers started here and stopped before returning."""
    lat = args.latency_ms
    sides = ["local", "http@0ms", f"http@{lat:g}ms", "lerobot@0ms", f"lerobot@{lat:g}ms"]
    if args.quick:  # the test: lerobot at the added latency only, resumes remote only
        sides.remove("lerobot@0ms")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    http = FolderServer(case.root)
    hub = FixedPortHub(case.root, f"bench/{case.name}", hub_port)
    resume: dict[str, dict[str, list[float]]] = {f"http@{lat:g}ms": {}}
    if not args.quick:
        resume = {"local": {}, **resume}
    steps = {"early": max(1, round(0.05 * case.steps)), "late": max(1, round(0.9 * case.steps))}
    try:
        http.start()
        hub.start()
        for r in range(args.rounds):
            for side in sides:
                progress(f"({case.name}) round {r + 1}/{args.rounds}: {side}")
                latency = lat if side.endswith(f"@{lat:g}ms") and lat else 0.0
                if side == "local":
                    out = run_robo(case.root, case, args.warmup, args.batches)
                elif side.startswith("http"):
                    _arm(http, latency)
                    _fresh_cache(args)
                    out = run_robo(http.url, case, args.warmup, args.batches)
                    out["fetched"] = _served(http)
                else:
                    _arm(hub, latency)
                    _cold_lerobot_caches()
                    out = run_lerobot(case, args)
                    out["fetched"] = _served(hub)
                if "consumed" in out:
                    consumed = out.pop("consumed")
                    if side != "local" and consumed["index"]:
                        out["needed"] = case.needs.of(consumed)
                        out["bytes_ratio"] = out["fetched"]["total"] / out["needed"]["total"]
                runs[side].append(out)
            for side in resume:
                for where, step in steps.items():
                    progress(f"({case.name}) round {r + 1}/{args.rounds}: resume {side} {where}")
                    if side == "local":
                        dt = first_batch_after_resume(case.root, case, step)
                    else:
                        _arm(http, lat)
                        _fresh_cache(args)
                        dt = first_batch_after_resume(http.url, case, step)
                    resume[side].setdefault(where, []).append(dt)
        progress(f"({case.name}) one epoch over http@0ms for the bytes")
        _arm(http, 0.0)
        _fresh_cache(args)
        epoch = run_robo(http.url, case, 1, 0, infinite=False)
        fetched = _served(http)
        needed = case.needs.of(epoch.pop("consumed"))
        epoch_bytes = {
            "items": epoch["timed_batches"],
            "fetched": fetched,
            "needed": needed,
            "ratio": fetched["total"] / needed["total"],
        }
    finally:
        http.stop()
        hub.stop()

    rate = {s: _spread([x.get("frames_per_s") for x in runs[s]]) for s in sides}
    errors = {s: x["error"] for s in sides for x in runs[s] if "error" in x}

    def paired(a: str, b: str) -> dict[str, float | None]:
        xs = [
            x["frames_per_s"] / y["frames_per_s"]
            for x, y in zip(runs[a], runs[b], strict=True)
            if x.get("frames_per_s") and y.get("frames_per_s")
        ]
        return _spread(xs)

    remote = f"http@{lat:g}ms"
    ratios = {
        f"{remote} / local": {**paired(remote, "local"), "target": TARGET_LOCAL},
        f"{remote} / lerobot@{lat:g}ms": {
            **paired(remote, f"lerobot@{lat:g}ms"),
            "target": TARGET_PEER,
        },
        "http@0ms / local": {**paired("http@0ms", "local"), "target": None},
    }
    for v in ratios.values():
        v["met"] = (
            None if v["median"] is None or v["target"] is None else v["median"] >= v["target"]
        )
    resume_rows = {}
    for side, by in resume.items():
        early, late = _spread(by["early"]), _spread(by["late"])
        late_over_early = [b / a for a, b in zip(by["early"], by["late"], strict=True)]
        resume_rows[side] = {
            "early": early,
            "late": late,
            "late_over_early": _spread(late_over_early),
        }
    return {
        "dataset": case.name,
        "description": case.description,
        "sides": sides,
        "frames_per_s": rate,
        "errors": errors,
        "ratios": ratios,
        "bytes": {
            "epoch": epoch_bytes,
            "runs": {
                s: _spread([x.get("bytes_ratio") for x in runs[s]]) for s in sides if s != "local"
            },
        },
        "resume_steps": steps,
        "resume_first_batch_s": resume_rows,
        "runs": runs,
    }


# --------------------------------------------------------------------------- output


def _f(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def _cell(s: dict[str, Any], spec: str = ",.0f") -> str:
    if s["median"] is None:
        return "-"
    return f"{_f(s['median'], spec)} [{_f(s['min'], spec)}-{_f(s['max'], spec)}]"


def _verdict(met: bool | None) -> str:
    return {True: "PASS", False: "MISS", None: "-"}[met]


def _mb(n: int | float) -> str:
    return f"{n / 1e6:.2f}"


def report(doc: dict[str, Any], args: argparse.Namespace) -> None:
    rows = doc["rows"]
    print()
    print(
        f"frames/s into the loop (uint8, batch {BATCH}, {WORKERS} workers): median [min-max] "
        f"of {args.rounds} alternating rounds"
    )
    print_table(
        ["dataset", "side", "frames/s", "first batch s", "note"],
        [
            [
                f"({r['dataset']}) {r['description']}",
                side,
                _cell(r["frames_per_s"][side]),
                _f(
                    _spread([x.get("first_batch_s") for x in r["runs"][side]])["median"],
                    ".2f",
                ),
                r["errors"].get(side, ""),
            ]
            for r in rows
            for side in r["sides"]
        ],
    )
    print()
    print("ratios of frames/s: median [min-max] of the per-round ratios")
    print_table(
        ["dataset", "ratio", "value", "target", "verdict"],
        [
            [
                f"({r['dataset']})",
                name,
                _cell(v, ".2f"),
                "-" if v["target"] is None else f">= {v['target']:g}",
                _verdict(v["met"]),
            ]
            for r in rows
            for name, v in r["ratios"].items()
        ],
    )
    print()
    print(
        "bytes fetched / bytes needed (MB; needed = video chunks + open + parquet + meta, "
        "see the docstring)"
    )

    def parts(fetched: dict[str, int] | None, needed: dict[str, int] | None) -> list[str]:
        if fetched is None or needed is None:
            return ["-"] * 6
        return [
            f"{_mb(fetched['total'])} ({_mb(fetched['videos'])}/{_mb(fetched['data'])}/"
            f"{_mb(fetched['meta'])}/{_mb(fetched['other'])})",
            *(_mb(needed[k]) for k in ("total", "video_chunks", "open", "parquet", "meta")),
        ]

    table = []
    for r in rows:
        e = r["bytes"]["epoch"]
        table.append(
            [
                f"({r['dataset']})",
                "one epoch, http@0ms",
                f"{e['ratio']:.3f}",
                *parts(e["fetched"], e["needed"]),
                f"<= {TARGET_BYTES:g}",
                _verdict(e["ratio"] <= TARGET_BYTES),
            ]
        )
        for side, s in r["bytes"]["runs"].items():
            last = next((x for x in reversed(r["runs"][side]) if "needed" in x), {})
            table.append(
                [
                    f"({r['dataset']})",
                    f"timed runs, {side}",
                    _cell(s, ".3f"),
                    *parts(last.get("fetched"), last.get("needed")),
                    "-",
                    "-",
                ]
            )
    print_table(
        [
            "dataset",
            "run",
            "fetched/needed",
            "fetched (videos/data/meta/other)",
            "needed",
            "video chunks",
            "open",
            "parquet",
            "meta",
            "target",
            "verdict",
        ],
        table,
    )
    print(
        "  (timed runs stop mid-stream: what the workers had read ahead is fetched, not "
        "consumed; ratio: median [min-max] of the rounds, MB columns: the last round)"
    )
    print()
    print(
        "first batch after a resume (s, constructing the dataset to its first batch; remote: "
        "a cold metadata cache): median [min-max]"
    )
    print_table(
        ["dataset", "side", "early step", "early s", "late step", "late s", "late/early"],
        [
            [
                f"({r['dataset']})",
                side,
                str(r["resume_steps"]["early"]),
                _cell(v["early"], ".2f"),
                str(r["resume_steps"]["late"]),
                _cell(v["late"], ".2f"),
                _cell(v["late_over_early"], ".2f"),
            ]
            for r in rows
            for side, v in r["resume_first_batch_s"].items()
        ],
    )


def torchcodec_error() -> str | None:
    """None if torchcodec and its FFmpeg libraries load, else the first line of the error."""
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception as e:  # ImportError, OSError or RuntimeError
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--datasets",
        default="f,g,d",
        help="which of f (factory 96x96), g (factory 480x640), d (open50)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=60, help="timed batches of robo_resume")
    p.add_argument("--peer-batches", type=int, default=40, help="timed batches of lerobot")
    p.add_argument("--peer-seconds", type=float, default=20.0, help="lerobot's timing cap")
    p.add_argument(
        "--peer-timeout",
        type=float,
        default=300.0,
        help="seconds lerobot's loader may take for one batch (its first fills a buffer)",
    )
    p.add_argument("--warmup", type=int, default=8, help="batches not timed (first included)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to every request")
    p.add_argument("--data-dir", type=Path, default=REPO / "out" / "bench_data")
    p.add_argument("--quick", action="store_true", help="every row, tiny (the test)")
    p.add_argument("--json", type=Path, help="write all numbers here")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.batches, args.peer_batches, args.warmup = 1, 2, 2, 1
    if min(args.rounds, args.batches, args.peer_batches, args.warmup) < 1:
        p.error("--rounds, --batches, --peer-batches and --warmup must be >= 1")
    if args.latency_ms < 0:
        p.error("--latency-ms must be >= 0")
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    logging.getLogger("robo_resume").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
        args.tmp = tmp
        # before huggingface_hub is imported (it reads these once): the loopback Hub, and
        # lerobot's and huggingface's caches in this run's temporary folder
        hub_port = free_port()
        os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{hub_port}"
        os.environ["HF_HOME"] = str(Path(tmp) / "hf")
        os.environ["HF_LEROBOT_HOME"] = str(Path(tmp) / "lerobot")
        os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
        info = machine()
        print(describe_machine(info))
        problem = torchcodec_error()
        print(
            "lerobot StreamingLeRobotDataset decodes with torchcodec (0.6.1 has no "
            + (
                "video_backend); torchcodec loads"
                if problem is None
                else f"video_backend); torchcodec does NOT load ({problem}): its rows fail"
            )
        )
        print(f"robo_resume with its default order; added latency {args.latency_ms:g} ms/request")
        cases = []
        for name in args.datasets.split(","):
            if name in ("f", "g"):
                cases.append(Case(name, factory_root(args.data_dir, args.quick, name), None))
            elif name == "d":
                if not (OPEN50 / "meta" / "info.json").is_file():
                    p.error(f"{OPEN50} is absent (../shared/datasets/open50)")
                eps = OPEN50_WITH_VIDEO[:3] if args.quick else OPEN50_WITH_VIDEO
                cases.append(Case("d", OPEN50, eps))
            else:
                p.error(f"unknown dataset {name!r}; expected a subset of f,g,d")
        doc: dict[str, Any] = {
            "machine": info,
            "batch_size": BATCH,
            "num_workers": WORKERS,
            "latency_ms": args.latency_ms,
            "torchcodec_error": problem,
            "targets": {
                "remote_over_local": TARGET_LOCAL,
                "remote_over_lerobot": TARGET_PEER,
                "bytes_ratio_max": TARGET_BYTES,
            },
            "args": {k: v for k, v in vars(args).items() if k != "tmp"},
            "rows": [],
        }
        for case in cases:
            doc["rows"].append(measure(case, args, hub_port))
            if args.json:  # partial results survive an interrupted run
                write_json(args.json, doc)
        report(doc, args)
    if args.json:
        write_json(args.json, doc)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
