"""Resume cost: time from "construct the resumed dataset" to the first batch, by resume position.

Measured at resume positions 0, 10^3, 10^6 and 10^9 samples (rounded down to a multiple of the
batch size, 32), one stream (``num_workers=0``), median of several repeats after a warm-up:

1. Arithmetic (no I/O) on a plan of 10^5 episodes (~3*10^7 frames; synthetic v3.0 ``meta/``
   without data or video files): ``ChunkedEpisodeDataset(..., resume_step=N)`` with the
   metadata already loaded, then ``start_point(0)`` and locating the first position in the
   schedule (everything the dataset does before it opens a file). Also ``resume_point()``
   alone. Positions past one epoch use ``infinite=True`` (in epoch mode ``resume_point`` reads
   a position past an epoch as "that many ``iter()`` restarts later", which is also O(1)).
2. First batch on real datasets: a factory dataset (``robo_resume.testing.make_dataset``, two
   96x96 AV1 cameras) and ``../shared/datasets/open50`` (the episodes whose videos exist) when
   present: construct with ``resume_step=N, infinite=True`` plus
   ``next(iter(ds.dataloader(num_workers=0)))``.

3. Resume at scale (``_resume_scale.py``): load, plan, the shared epoch layout and the 8
   streams' locate after a resume at step 10^6, at 10^3 to 10^6 episodes (``--quick``: 10^3,
   10^4), with the growth per decade. Synthetic ``meta/`` without data or video files: at
   10^6 episodes the first batch itself cannot be decoded, so this measures everything
   before the first file is opened.

Beside it, the alternatives at the same positions:

(a) The original design's frame-by-frame fast-forward: ``for _ in range(N): next(it)`` over an
    iterator that yields the schedule's (episode, frame) positions without any I/O, i.e. the
    cheapest possible skip loop. The column is robo_resume's time at position 0 plus that loop
    over N positions, measured at 10^3 and 10^6; 10^9 is extrapolated linearly from the
    per-frame cost at 10^6 (marked ``~``).
(b) torchdata's ``StatefulDataLoader`` with a non-stateful ``IterableDataset`` (no
    ``state_dict``): on ``load_state_dict`` it replays, calling ``next()`` once per batch
    already yielded, which reads and decodes every skipped frame (torchdata 0.11,
    ``_StatefulSingleProcessDataLoaderIter.load_state_dict``). Measured at 0 and 10^3;
    larger positions extrapolated from the per-sample cost (marked ``~``).

Targets printed: "resume to first batch at 10^9 within 1.2x of position 0" (PASS/MISS with the
ratio, per dataset) and whether the fast-forward loop grows linearly.

Run::

    python benchmarks/resume.py                  # full run (a few minutes)
    python benchmarks/resume.py --quick          # 10^3-episode plan, 0/10^3/10^9, under 30 s
    python benchmarks/resume.py --json out.json  # also write every number

Tables go to stdout, progress to stderr. Exit code 0 unless ``--strict`` and a target is missed.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _common as C
import _resume_scale as S
import torch

from robo_resume import ChunkedEpisodeDataset, load_metadata
from robo_resume.index.schedule import Schedule
from robo_resume.index.start import resume_point
from robo_resume.testing import make_dataset

BATCH = 32
POSITIONS = (0, 10**3, 10**6, 10**9)
QUICK_POSITIONS = (0, 10**3, 10**9)
FF_MEASURED_MAX = 10**6  # the skip loop runs for real up to here
REPLAY_MEASURED_MAX = 10**3  # StatefulDataLoader replays for real up to here
TARGET_RATIO = 1.2
OPEN50 = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "open50"


def rounded(n: int) -> int:
    """``n`` rounded down to a whole number of batches (resume_step must be one)."""
    return n // BATCH * BATCH


def label(n: int) -> str:
    exp = {10**k: f"10^{k}" for k in range(1, 13)}.get(n)
    name = exp or str(n)
    return name if rounded(n) == n else f"{name} ({rounded(n)})"


def ratio(t: float | None, t0: float | None) -> float | None:
    return None if t is None or not t0 else t / t0


def fmt_ratio(r: float | None, extrapolated: bool = False) -> str:
    if r is None:
        return "-"
    return f"{'~' if extrapolated else ''}{r:,.2f}x"


def fmt_t(t: float | None, extrapolated: bool = False) -> str:
    return "-" if t is None else ("~" if extrapolated else "") + C.fmt_time(t)


# -- the alternatives -----------------------------------------------------------------------------
def schedule_positions(sched: Schedule, stream: int = 0) -> Iterator[tuple[int, int]]:
    """Every (episode, frame) a stream emits, epoch after epoch, one at a time, without I/O."""
    for epoch in itertools.count():
        for group, _ in sched.iter_groups(epoch, stream):
            episode = [s.episode_index for s in group.segments]
            frame = [s.start for s in group.segments]
            for j in group.order.tolist():
                yield episode[j], frame[j]
                frame[j] += 1


def chunks_in_first_batch(ds: ChunkedEpisodeDataset) -> int:
    """Chunk pieces (segments) the first batch of a resumed single-stream dataset reads from.

    Explains differences between positions: a batch that starts at a group boundary reads
    ``interleave`` chunks, one that straddles two groups opens more readers.
    """
    _, starts, _ = ds.start_point(0)
    epoch, position = starts[0]
    sched = ds.schedule(0)
    need, seen = BATCH, set()
    while need > 0:
        for group, offset in sched.iter_groups(epoch, 0, position):
            labels = group.order[offset : offset + need]
            seen |= {(epoch, group.position, int(j)) for j in set(labels.tolist())}
            need -= len(labels)
            if need == 0:
                break
        epoch, position = epoch + 1, 0
    return len(seen)


class NonStateful(torch.utils.data.IterableDataset):
    """An IterableDataset without ``state_dict``: StatefulDataLoader can only replay it."""

    def __init__(self, inner: torch.utils.data.IterableDataset) -> None:
        super().__init__()
        self.inner = inner

    def __iter__(self):
        return iter(self.inner)


# -- measurements ---------------------------------------------------------------------------------
class Bench:
    """Runs the measurements; quick mode uses smaller data, fewer positions and repeats."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.quick = args.quick
        self.positions = QUICK_POSITIONS if args.quick else POSITIONS
        self.repeats = 3 if args.quick else 7
        self.warmup = 1
        self.ff_max = 10**3 if args.quick else FF_MEASURED_MAX
        # Replay decodes every skipped frame; on open50 (480x640) only in full runs.
        self.replay_on = {"factory"} if args.quick else {"factory", "open50"}

    def time(self, what: str, fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
        t0 = time.perf_counter()
        t = C.median_time(fn, repeats, warmup=warmup)
        C.progress(f"{what}: median {C.fmt_time(t)} ({time.perf_counter() - t0:.1f} s in all)")
        return t

    def skip_loops(self, name: str, sched: Schedule) -> dict[int, float]:
        """Median time of ``n`` ``next()`` calls of the (primed) position iterator, per ``n``."""
        it = schedule_positions(sched)
        next(it)  # fills the schedule's caches of epoch 0, as a real start would
        out = {}
        for p in POSITIONS:
            n = rounded(p)
            if not 0 < p <= self.ff_max:
                continue
            times = []
            for _ in range(3 if n >= 10**5 else self.repeats):
                it = schedule_positions(sched)
                next(it)
                t0 = time.perf_counter()
                for _ in range(n):
                    next(it)
                times.append(time.perf_counter() - t0)
            out[n] = statistics.median(times)
            C.progress(f"{name}: skip loop over {label(p)} positions: median {C.fmt_time(out[n])}")
        return out

    @staticmethod
    def add_fast_forward(rows: list[dict[str, Any]], loops: dict[int, float]) -> float:
        """ff(N) = robo_resume at 0 + the skip loop over N positions (measured or linear)."""
        far = max(loops)
        per_frame = loops[far] / far
        t0 = rows[0]["robo_resume_s"]
        for row in rows:
            n = row["position"]
            row["ff_loop_extrapolated"] = n > 0 and n not in loops
            row["ff_loop_s"] = t0 + (loops[n] if n in loops else n * per_frame)
        return per_frame

    # (1) arithmetic -------------------------------------------------------------------------
    def arithmetic(self, work: Path) -> dict[str, Any]:
        n_eps = 10**3 if self.quick else 10**5
        lengths = [50 + (i * 37) % 500 for i in range(n_eps)]
        root = work / f"plan-{n_eps}"
        C.progress(f"writing synthetic v3.0 meta/ with {n_eps} episodes to {root}")
        C.write_synthetic_meta(root, lengths)
        meta = load_metadata(root)
        probe = ChunkedEpisodeDataset(root, meta=meta, batch_size=BATCH, infinite=True)
        epoch_frames = probe.schedule(0).frames_per_stream
        out: dict[str, Any] = {
            "dataset": "synthetic v3.0 meta/ (no data or video files)",
            "episodes": n_eps,
            "frames": meta.total_frames,
            "chunks": len(probe.chunks),
            "frames_per_epoch": epoch_frames,
            "timed": "ChunkedEpisodeDataset(meta=..., resume_step=N) + start_point(0) + "
            "schedule.locate(first position)",
            "rows": [],
        }

        def resumed(n: int, infinite: bool) -> None:
            ds = ChunkedEpisodeDataset(
                root, meta=meta, batch_size=BATCH, resume_step=n, infinite=infinite
            )
            _, starts, _ = ds.start_point(0)
            sched = ds.schedule(0)
            epoch, position = starts[0]
            if position < sched.frames_per_stream:
                sched.locate(epoch, 0, position)

        repeats = 3 if self.quick else 5  # ~7 s per call on 10^5 episodes
        for p in self.positions:
            n = rounded(p)
            infinite = n >= epoch_frames
            t = self.time(
                f"arithmetic: robo_resume at {label(p)}",
                lambda n=n, i=infinite: resumed(n, i),
                repeats,
            )
            sched = probe.schedule(0)
            rp = C.median_time(
                lambda n=n, i=infinite, s=sched: resume_point(s, n // BATCH, infinite=i), 201
            )
            out["rows"].append(
                {
                    "position": n,
                    "requested": p,
                    "mode": "infinite" if infinite else "epoch",
                    "robo_resume_s": t,
                    "resume_point_s": rp,
                }
            )
        loops = self.skip_loops("arithmetic", probe.schedule(0))
        out["ff_loop_only_s"] = {str(n): t for n, t in sorted(loops.items())}
        out["ff_loop_per_frame_s"] = self.add_fast_forward(out["rows"], loops)
        _add_ratios(out["rows"], "robo_resume_s", "ff_loop_s")
        return out

    # (2) first batch ------------------------------------------------------------------------
    def first_batch(self, name: str, root: Path, episodes: list[int] | None) -> dict[str, Any]:
        meta = load_metadata(root)
        kw: dict[str, Any] = {"batch_size": BATCH, "infinite": True, "episodes": episodes}
        probe = ChunkedEpisodeDataset(root, **kw)
        out: dict[str, Any] = {
            "root": str(root),
            "episodes": len(probe.episodes),
            "frames": sum(meta.episode(e).length for e in probe.episodes),
            "cameras": list(meta.camera_keys),
            "timed": "ChunkedEpisodeDataset(root, resume_step=N, infinite=True) + "
            "next(iter(ds.dataloader(num_workers=0)))",
            "rows": [],
        }
        first: dict[int, torch.Tensor] = {}

        def resumed(n: int) -> None:
            ds = ChunkedEpisodeDataset(root, resume_step=n, **kw)
            batch = next(iter(ds.dataloader(num_workers=0)))
            first[n] = batch["index"]

        big = self.quick and name != "factory"  # open50 decodes 480x640 frames: few repeats
        repeats = 1 if big else self.repeats
        for p in self.positions:
            n = rounded(p)
            t = self.time(
                f"{name}: robo_resume first batch at {label(p)}", lambda n=n: resumed(n), repeats
            )
            chunks = chunks_in_first_batch(ChunkedEpisodeDataset(root, resume_step=n, **kw))
            out["rows"].append(
                {"position": n, "requested": p, "robo_resume_s": t, "chunks_read": chunks}
            )

        # (a) frame-by-frame fast-forward: first batch at 0 + the skip loop (no I/O).
        loops = self.skip_loops(name, probe.schedule(0))
        out["ff_loop_per_frame_s"] = self.add_fast_forward(out["rows"], loops)

        # (b) StatefulDataLoader replay of a non-stateful IterableDataset.
        if name in self.replay_on:
            replayed = self.replay(name, root, kw, out["rows"])
            for row in out["rows"]:
                if row["position"] in replayed:
                    same = torch.equal(first[row["position"]], replayed[row["position"]])
                    row["same_batch_as_replay"] = bool(same)
            out["replay_per_sample_s"] = self.replay_per_sample
        _add_ratios(out["rows"], "robo_resume_s", "ff_loop_s", "replay_s")
        return out

    def replay(
        self, name: str, root: Path, kw: dict[str, Any], rows: list[dict[str, Any]]
    ) -> dict[int, torch.Tensor]:
        """Time StatefulDataLoader's replay; fills ``replay_s`` of ``rows``, returns batches."""
        from torchdata.stateful_dataloader import StatefulDataLoader

        # It logs "naively fast-forwarding your dataset" on every resume.
        logging.getLogger("torchdata.stateful_dataloader.stateful_dataloader").setLevel(
            logging.ERROR
        )

        def loader() -> StatefulDataLoader:
            return StatefulDataLoader(NonStateful(ChunkedEpisodeDataset(root, **kw)), BATCH)

        measured: dict[int, float] = {}
        batches: dict[int, torch.Tensor] = {}
        for p in POSITIONS:
            n = rounded(p)
            if p > REPLAY_MEASURED_MAX:
                continue
            dl = loader()  # the interrupted run: n samples, then its state
            it = iter(dl)
            for _ in range(n // BATCH):
                next(it)
            state = dl.state_dict()

            def replay(n: int = n, state: dict[str, Any] = state) -> None:
                dl = loader()
                dl.load_state_dict(state)
                batches[n] = next(iter(dl))["index"]

            reps, warm = (2, 0) if self.quick else (5, 1)
            measured[n] = self.time(
                f"{name}: StatefulDataLoader replay to {label(p)}", replay, reps, warm
            )
        far = max(measured)
        self.replay_per_sample = max(measured[far] - measured[0], 0.0) / far
        for row in rows:
            n = row["position"]
            row["replay_extrapolated"] = n not in measured
            row["replay_s"] = measured.get(n, measured[0] + n * self.replay_per_sample)
        return batches


def _add_ratios(rows: list[dict[str, Any]], *keys: str) -> None:
    for key in keys:
        base = rows[0].get(key)
        for row in rows:
            if key in row:
                row[key.removesuffix("_s") + "_ratio"] = ratio(row[key], base)


def _print_rows(rows: list[dict[str, Any]], first_batch: bool) -> None:
    headers = ["position", "robo_resume", "ratio"]
    headers += ["chunks"] if first_batch else ["mode", "resume_point()"]
    headers += ["fast-forward loop", "ratio", "StatefulDataLoader replay", "ratio"]
    table = []
    for r in rows:
        ffx = r.get("ff_loop_extrapolated", False)
        rpx = r.get("replay_extrapolated", False)
        line = [
            label(r["requested"]),
            C.fmt_time(r["robo_resume_s"]),
            fmt_ratio(r["robo_resume_ratio"]),
        ]
        if first_batch:
            line += [str(r["chunks_read"])]
        else:
            line += [r["mode"], C.fmt_time(r["resume_point_s"])]
        line += [
            fmt_t(r.get("ff_loop_s"), ffx),
            fmt_ratio(r.get("ff_loop_ratio"), ffx),
            fmt_t(r.get("replay_s"), rpx) if first_batch else "n/a (no data)",
            fmt_ratio(r.get("replay_ratio"), rpx) if first_batch else "",
        ]
        table.append(line)
    C.print_table(headers, table)


def _targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    far = rounded(10**9)
    for name, part in result["first_batch"].items():
        rows = {r["position"]: r for r in part.get("rows", [])}
        if far in rows:
            r = rows[far]["robo_resume_ratio"]
            targets.append(
                {
                    "target": "resume to first batch at 10^9 within 1.2x of position 0",
                    "dataset": name,
                    "ratio": r,
                    "limit": TARGET_RATIO,
                    "pass": r <= TARGET_RATIO,
                }
            )
    return targets


def _linearity(arith: dict[str, Any]) -> dict[str, Any]:
    """Per-frame cost of the skip loop at each measured position (constant = linear growth)."""
    loops = {int(k): v for k, v in arith["ff_loop_only_s"].items() if int(k) > 0}
    per = {n: t / n for n, t in loops.items()}
    out: dict[str, Any] = {"per_frame_s": {str(n): v for n, v in per.items()}}
    if len(per) >= 2:
        lo, hi = min(per), max(per)
        growth = loops[hi] / loops[lo]
        out.update(
            positions=[lo, hi],
            time_growth=growth,
            position_growth=hi / lo,
            linear=0.5 <= per[hi] / per[lo] <= 2.0,
        )
    else:
        out["linear"] = None
    out["extrapolated_1e9_s"] = arith["ff_loop_per_frame_s"] * 10**9
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small and fast (under 30 s)")
    ap.add_argument("--json", type=Path, help="write all numbers to this file")
    ap.add_argument("--open50", type=Path, default=OPEN50, help="path of the open50 dataset")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)

    info = C.machine()
    print(C.describe_machine(info))
    bench = Bench(args)
    result: dict[str, Any] = {
        "benchmark": "resume",
        "machine": info,
        "quick": args.quick,
        "batch_size": BATCH,
        "num_workers": 0,
        "repeats": bench.repeats,
        "positions": [rounded(p) for p in bench.positions],
    }
    with tempfile.TemporaryDirectory(prefix="robo_resume_bench_") as tmp:
        work = Path(tmp)
        arith = bench.arithmetic(work)
        result["arithmetic"] = arith

        lengths = (
            tuple(40 + (i * 13) % 41 for i in range(6))
            if args.quick
            else tuple(60 + (i * 29) % 141 for i in range(24))
        )
        factory = work / "factory"
        C.progress(f"writing a factory dataset ({len(lengths)} episodes, 2 cameras 96x96)")
        make_dataset(factory, episode_lengths=lengths, num_cameras=2, height=96, width=96)
        result["first_batch"] = {"factory": bench.first_batch("factory", factory, None)}
        if args.open50.is_dir():
            meta = load_metadata(args.open50)
            with_video = [
                e.episode_index
                for e in meta.episodes
                if all((meta.root / v.path).is_file() for v in e.videos.values())
            ]
            part = bench.first_batch("open50", args.open50, with_video)
            part["skipped_episodes"] = sorted(
                {e.episode_index for e in meta.episodes} - set(with_video)
            )
            result["first_batch"]["open50"] = part
        else:
            C.progress(f"open50 not found at {args.open50}; skipped")
            result["first_batch"]["open50"] = {"skipped": f"not found at {args.open50}"}

        sizes = [10**3, 10**4] if args.quick else [10**3, 10**4, 10**5, 10**6]
        result["at_scale"] = S.measure(work, sizes, 1 if args.quick else 3)

    result["ff_loop_linearity"] = _linearity(arith)
    result["targets"] = _targets(result)
    _report(result)
    if args.json:
        C.write_json(args.json, result)
        C.progress(f"wrote {args.json}")
    missed = [t for t in result["targets"] if not t["pass"]]
    return 1 if args.strict and missed else 0


def _report(result: dict[str, Any]) -> None:
    S.report(result["at_scale"])
    a = result["arithmetic"]
    print()
    print(
        f"Arithmetic resume (no I/O): plan of {a['episodes']:,} episodes, {a['frames']:,} frames, "
        f"{a['chunks']:,} chunks; one epoch = {a['frames_per_epoch']:,} samples"
    )
    print(f"robo_resume = {a['timed']}")
    _print_rows(a["rows"], first_batch=False)
    for name, part in result["first_batch"].items():
        print()
        if "skipped" in part:
            print(f"First batch, {name}: skipped ({part['skipped']})")
            continue
        extra = (
            f", episodes {part['skipped_episodes']} left out (no video)"
            if part.get("skipped_episodes")
            else ""
        )
        print(
            f"First batch, {name}: {part['episodes']} episodes, {part['frames']:,} frames, "
            f"cameras {part['cameras']}{extra}"
        )
        print(f"robo_resume = {part['timed']}")
        print(
            "chunks = chunk pieces the first batch reads from; fast-forward loop = first batch at "
            "0 + skip loop over the schedule (no I/O); StatefulDataLoader = replay of a "
            "non-stateful IterableDataset"
        )
        _print_rows(part["rows"], first_batch=True)
        same = [r["same_batch_as_replay"] for r in part["rows"] if "same_batch_as_replay" in r]
        if same:
            print(f"replayed batch equals robo_resume's resumed batch: {all(same)}")
    print()
    print("~ = extrapolated linearly from the measured per-frame (per-sample) cost, not run")
    for t in result["targets"]:
        verdict = "PASS" if t["pass"] else "MISS"
        print(
            f"target: {t['target']} [{t['dataset']}]: {verdict} (ratio {t['ratio']:.2f}, "
            f"limit {t['limit']}x)"
        )
    lin = result["ff_loop_linearity"]
    if lin.get("linear") is None:
        print(
            "fast-forward loop: linearity needs two measured positions (full run); "
            f"10^9 would take ~{C.fmt_time(lin['extrapolated_1e9_s'])} (extrapolated)"
        )
    else:
        lo, hi = lin["positions"]
        print(
            f"fast-forward loop grows linearly: {'yes' if lin['linear'] else 'NO'} "
            f"(position x{lin['position_growth']:,.0f} -> loop time x{lin['time_growth']:,.0f}; "
            f"{lin['per_frame_s'][str(lo)] * 1e9:.0f} ns/frame at {label(lo)}, "
            f"{lin['per_frame_s'][str(hi)] * 1e9:.0f} ns/frame at {label(hi)}); "
            f"10^9 would take ~{C.fmt_time(lin['extrapolated_1e9_s'])} (extrapolated)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
