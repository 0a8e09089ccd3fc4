"""A read design measured before it is built: batches gathered from held segment blocks.

Issue 15 items 3 and 4 miss in the same place: ``num_workers=0`` on small frames (96x96) with
delta windows, where one thread does all the work and the Python per read and per batch weighs
as much as the decoding. This script measures one structural answer without changing the
library, so that the next step is decided on numbers:

- **gather** (the sketch, :class:`Gather`): each open segment (chunk) of the stream's group
  owns a slot range of a held ring per camera (``max(block_frames, batch) + look-back +
  look-ahead`` frames) and of a held column table. When a batch needs a frame past what a
  segment holds, the segment's next frames are read in one read: the data columns with the
  library's own window arithmetic, the camera frames with one ``VideoReader.frames_at`` into
  the ring (each distinct frame once, the look-back frames kept from the last read). Every
  batch is then one fancy-indexed gather per camera (the windows' places included) and one
  per column, whatever the interleave.
- **loader**: ``ChunkedEpisodeDataset(...).dataloader(num_workers=0)``, the same tuning.
- **ceiling**: ``throughput.run_ceiling`` (the throughput table's: sequential PyAV decode to
  RGB uint8 of the same episodes).

The three alternate in one process, ``--rounds`` times (the machine has slow and fast phases
that separate runs mix); each prints its time per sample (median and best of the rounds) and
its ratio to the ceiling of the same round (median and range) and best over best; both
read paths start at the beginning of epoch 0 and are timed after :data:`WARMUP` batches.
``--check N`` first compares the sketch's first ``N`` batches with the loader's, key by key
(``task`` strings aside: the sketch compares before ``ItemBuilder.finish``), and exits 1 on
a difference: the numbers are only worth reading for the same batches.

It is a sketch, not a loader: stream 0 of ``num_workers=0``, epoch 0 from position 0, no
``on_error="skip"``, no cursors or resume state, no read in the background; it uses the
package's internals (``ds.schedule``, ``ds.items``, ``EpisodeRangeReader._windows`` and
``_columns``). Memory: the held ring keeps ``2 * interleave + 2`` slot ranges per camera (96x96,
interleave 32, batch 32, windows [-1, 0]: 66 ranges of 33 frames, about 60 MB per camera,
of which only the ranges in use are touched).

Run: ``python benchmarks/gather_design.py [--dataset a] [--tuning '{"interleave": 32,
"interleave_order": "spread"}'] [--rounds 8] [--batches 150] [--no-delta] [--check 180]``;
``--quick`` (the tests) checks and times a few batches of a small dataset.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput as T  # the ceiling and the factory datasets of the throughput table
from _common import progress


class Gather:
    """The sketch: stream 0's batches of epoch 0 (``num_workers=0``), each gathered at once.

    ``ds`` is a ``ChunkedEpisodeDataset``; ``raw``: yield numpy columns before
    ``ItemBuilder.finish`` (for the comparison), else what ``finish`` makes of them (uint8)."""

    def __init__(self, ds, *, raw: bool = False) -> None:
        self.ds, self.raw = ds, raw
        self.items = items = ds.items
        self.meta = ds.meta
        self.batch = ds.batch_size
        self.cams = list(self.meta.camera_keys)
        offsets = [items.window_offsets[c] for c in self.cams if c in items.window_offsets]
        self.before = max([0] + [-lo for _, lo, _ in offsets])  # look-back frames per camera
        self.after = max([0] + [hi for _, _, hi in offsets])
        self.span = max(ds.tuning.block_frames, self.batch)  # a read's frames (columns)
        self.slots = self.span + self.before + self.after  # held camera frames per segment
        self.regions = 2 * max(1, ds.tuning.interleave) + 2
        self.rings: dict[str, np.ndarray] = {}
        self.columns: dict[str, np.ndarray] = {}

    def batches(self, count: int):
        """The first ``count`` batches (fewer if epoch 0 ends first)."""
        groups = self.ds.schedule(0).iter_groups(0, 0, 0)
        held: dict[int, dict] = {}  # region -> segment, reader, what it holds, frames left
        free = list(range(self.regions))[::-1]
        queue_r: list[np.ndarray] = []
        queue_f: list[np.ndarray] = []
        queued = 0
        for _ in range(count):
            while queued < self.batch:
                nxt = next(groups, None)
                if nxt is None:
                    return
                group, offset = nxt
                order, segs = group.order, group.segments
                counts = np.bincount(order, minlength=len(segs))
                by = np.argsort(order, kind="stable")
                within = np.empty(len(order), dtype=np.int64)
                within[by] = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
                frame = np.array([s.start for s in segs], dtype=np.int64)[order] + within
                region = np.empty(len(segs), dtype=np.int64)
                for j, seg in enumerate(segs):
                    if not free:
                        free.append(self._grow())
                    region[j] = r = free.pop()
                    length = self.meta.episode(seg.episode_index).length
                    held[r] = {
                        "seg": seg,
                        "reader": None,
                        "cols": (0, 0),
                        "imgs": (0, 0),
                        "left": int(counts[j]),
                        "length": length,
                    }
                queue_r.append(region[order[offset:]])
                queue_f.append(frame[offset:])
                queued += len(order) - offset
            r_all, f_all = np.concatenate(queue_r), np.concatenate(queue_f)
            rb, fb = r_all[: self.batch], f_all[: self.batch]
            queue_r, queue_f = [r_all[self.batch :]], [f_all[self.batch :]]
            queued -= self.batch
            used, taken = np.unique(rb, return_counts=True)
            last = {r: int(f) for r, f in zip(rb.tolist(), fb.tolist(), strict=True)}
            for r in used.tolist():
                if last[r] >= held[r]["cols"][1]:
                    first = int(fb[rb == r][0])
                    self._read(r, held[r], first)
            yield self._gather(rb, fb, held)
            for r, n in zip(used.tolist(), taken.tolist(), strict=True):
                h = held[r]
                h["left"] -= n
                if h["left"] == 0:
                    if h["reader"] is not None:
                        h["reader"].close()
                    del held[r]
                    free.append(r)

    def _grow(self) -> int:
        """One more region in every ring and column table; its number."""
        r = self.regions
        self.regions += 1
        for c, ring in self.rings.items():
            self.rings[c] = np.concatenate([ring, np.empty_like(ring[: self.slots])])
        for k, col in self.columns.items():
            self.columns[k] = np.concatenate([col, np.empty_like(col[: self.span])])
        return r

    def _gather(self, rb: np.ndarray, fb: np.ndarray, held: dict) -> dict:
        items = self.items
        hs = [held[r] for r in rb.tolist()]
        last = np.array([h["length"] for h in hs])[:, None] - 1  # each row's episode's last frame
        start = np.array([h["imgs"][0] for h in hs])[:, None]  # first camera frame held
        out = {}
        for c in self.cams:
            d, _, _ = items.window_offsets.get(c, (np.zeros((1, 1), np.int64), 0, 0))
            q = np.clip(fb[:, None] + d, 0, last)
            g = self.rings[c][rb[:, None] * self.slots + (q - start)]
            out[c] = g if c in items.window_offsets else g[:, 0]
        start = np.array([h["cols"][0] for h in hs])
        at = rb * self.span + (fb - start)
        for k, col in self.columns.items():
            out[k] = col[at]
        return out if self.raw else items.finish(out, image_dtype="uint8")

    def _read(self, r: int, h: dict, first: int) -> None:
        """Segment ``h``'s frames from ``first`` on into region ``r``: columns for
        ``self.span`` frames, camera frames with their windows' look-back and look-ahead."""
        seg, items = h["seg"], self.items
        ep = self.meta.episode(seg.episode_index)
        if h["reader"] is None:
            h["reader"] = items.episode_reader(seg.episode_index, first, seg.stop)
        reader = h["reader"]
        stop = min(seg.stop, first + self.span)
        frames = np.arange(first, stop, dtype=np.int64)
        query, pads = reader._windows(frames)
        cols = reader._columns(frames, query, pads, {})
        if not self.columns:
            self.columns = {
                k: np.empty((self.regions * self.span, *v.shape[1:]), v.dtype)
                for k, v in cols.items()
            }
            self.rings = {
                c: np.empty((self.regions * self.slots, *self.items.camera_shape(c)[-3:]), np.uint8)
                for c in self.cams
            }
        base = r * self.span
        for k, v in cols.items():
            self.columns[k][base : base + len(v)] = v
        h["cols"] = (first, stop)
        lo, hi = max(0, first - self.before), min(ep.length, stop + self.after)
        was_lo, was_hi = h["imgs"]
        base = r * self.slots
        tol = items.options.tolerance_s
        for c in self.cams:
            ring = self.rings[c]
            need = np.arange(max(lo, was_hi), hi, dtype=np.int64)
            if was_hi > lo:  # the frames held already move to the front, not decoded again
                ring[base : base + was_hi - lo] = ring[base + lo - was_lo : base + was_hi - was_lo]
            if len(need):
                times = ep.videos[c].from_timestamp + reader.timestamps[need - reader.lo]
                reader._video(c).frames_at(
                    times,
                    tolerance_s=tol,
                    frame_numbers=need.tolist(),
                    channels_first=True,
                    out=ring,
                    rows=base + (need - lo),
                )
        h["imgs"] = (lo, hi)


def _dataset(case, tuning: dict, delta: bool):
    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    return ChunkedEpisodeDataset(
        case.root,
        batch_size=T.BATCH,
        episodes=case.episodes,
        delta_timestamps=case.delta if delta else None,
        image_dtype="uint8",
        infinite=True,
        # the sketch reads the interleave order (each chunk forward): the fast order by default
        tuning=StreamTuning(**{"order": "interleave", **tuning}),
    )


def check(case, tuning: dict, delta: bool, batches: int) -> int:
    """Batches where the sketch differs from the loader (key by key, ``task`` aside)."""
    real = iter(_dataset(case, tuning, delta).dataloader(num_workers=0))
    bad, n = 0, 0
    for ours in Gather(_dataset(case, tuning, delta), raw=True).batches(batches):
        theirs = next(real)
        n += 1
        for k, v in ours.items():
            if k == "task":
                continue
            want = theirs[k].numpy() if hasattr(theirs[k], "numpy") else np.asarray(theirs[k])
            if want.shape != v.shape or not np.array_equal(want, v):
                print(f"batch {n - 1}: {k} differs", file=sys.stderr)
                bad += 1
                break
    print(f"check: {n} batches compared, {bad} differ")
    return bad


WARMUP = 3
"""Batches taken before timing (first opens and seeks), as ``throughput.py``'s ``--warmup``."""


def _time(it, batches: int) -> float:
    for _ in range(WARMUP):
        next(it)
    gc.collect()
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - t) / (batches * T.BATCH)


def measure(case, tuning: dict, delta: bool, rounds: int, batches: int) -> dict:
    """Seconds per sample of the ceiling, the loader and the sketch, per round."""
    out: dict[str, list[float]] = {"ceiling": [], "loader": [], "gather": []}
    for r in range(rounds):
        eps = T.ceiling_episodes(case, r, rounds)
        out["ceiling"].append(1 / T.run_ceiling(case, batches * T.BATCH, eps))
        loader = iter(_dataset(case, tuning, delta).dataloader(num_workers=0))
        out["loader"].append(_time(loader, batches))
        del loader
        sketch = Gather(_dataset(case, tuning, delta)).batches(WARMUP + batches)
        out["gather"].append(_time(sketch, batches))
        del sketch
        progress(f"round {r + 1}/{rounds} done")
    return out


def report(res: dict) -> list[str]:
    lines = []
    ceil = res["ceiling"]
    for k in ("ceiling", "loader", "gather"):
        v = res[k]
        line = f"{k:8s} {1e6 * statistics.median(v):6.0f} us/sample (best {1e6 * min(v):.0f})"
        if k != "ceiling":
            ratios = [c / x for c, x in zip(ceil, v, strict=True)]
            line += (
                f"  over the ceiling: {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}), best/best {min(ceil) / min(v):.2f}"
            )
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="a", choices=[*sorted(T.FACTORY), "d"])
    p.add_argument("--tuning", default="{}", help="StreamTuning keyword arguments as JSON")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--batches", type=int, default=150, help="timed batches per measurement")
    p.add_argument("--no-delta", action="store_true", help="without delta_timestamps")
    p.add_argument("--check", type=int, default=180, help="batches compared first (0: none)")
    p.add_argument("--data-dir", type=Path, default=T.REPO / "out" / "bench_data")
    p.add_argument("--quick", action="store_true", help="a small version (the tests)")
    args = p.parse_args(argv)
    tuning = json.loads(args.tuning)
    if args.quick:
        args.rounds, args.batches, args.check = 1, 4, 12
    if args.dataset == "d":
        case = T.Case("d", T.OPEN50, T.OPEN50_WITH_VIDEO)
    else:
        case = T.Case(args.dataset, T.factory_root(args.dataset, args.data_dir, args.quick), None)
    delta = not args.no_delta
    print(f"dataset ({case.name}), tuning {tuning or 'default'}, delta windows: {delta}")
    if args.check and check(case, tuning, delta, args.check):
        print("the sketch's batches differ from the loader's: timings not measured")
        return 1
    res = measure(case, tuning, delta, args.rounds, args.batches)
    print(f"{args.rounds} rounds of {args.batches} batches (batch {T.BATCH}), alternating:")
    print("\n".join(report(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
