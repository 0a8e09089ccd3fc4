"""Keyframe chunks (StreamTuning(cut_at_keyframes=None), the default) against even chunks
(cut_at_keyframes=False), side by side: frames/s over N batches after 3 warm-up batches,
alternating the two settings each round, for the throughput benchmark's datasets (a, c, d =
open50; run benchmarks/throughput.py once first to write a and c), 0 and 2 workers, with and
without delta windows. Prints each round's frames/s and the ratio keyframe / even, then the
median and spread of the ratios, and the same for the CPU time per frame of the process and
its workers (less sensitive to other load than wall time; lower is better). Decoded frames per
delivered frame (0 workers, the first N batches) are printed once per dataset and setting.

Usage: python benchmarks/keyframe_chunks.py [--rounds 3] [--batches 100] [--datasets a,c,d]
[--workers 0,2] [--data out/bench_data]
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput as T

from robo_resume import ChunkedEpisodeDataset, StreamTuning
from robo_resume.format import video as V

SETTINGS = {"keyframe": StreamTuning(), "even": StreamTuning(cut_at_keyframes=False)}


def case(name: str, data: Path):
    root = T.OPEN50 if name == "d" else data / name
    return T.Case(name, root, T.OPEN50_WITH_VIDEO if name == "d" else None)


def make(c, tuning, delta: bool):
    return ChunkedEpisodeDataset(
        c.root,
        batch_size=32,
        episodes=c.episodes,
        delta_timestamps=c.delta if delta else None,
        image_dtype="uint8",
        infinite=True,
        tuning=tuning,
    )


def rate(c, tuning, workers: int, delta: bool, n: int) -> tuple[float, float]:
    """(frames/s over ``n`` batches after 3, CPU us per frame of this process and its worker
    processes over the whole run, worker start and warm-up included)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    c0 = time.process_time()
    ds = make(c, tuning, delta)
    it = iter(ds.dataloader(num_workers=workers))
    for _ in range(3):
        next(it)
    t0 = time.perf_counter()
    for _ in range(n):
        next(it)
    out = n * 32 / (time.perf_counter() - t0)
    del it  # the workers exit: their CPU time is counted in RUSAGE_CHILDREN
    gc.collect()
    k = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - c0 + (k.ru_utime + k.ru_stime) - (kids.ru_utime + kids.ru_stime)
    return out, cpu / ((n + 3) * 32) * 1e6


def decoded_per_frame(c, tuning, n: int, delta: bool) -> tuple[float, int]:
    count = [0]
    orig = V.VideoReader._next_frame

    def counting(self):
        count[0] += 1
        return orig(self)

    V.VideoReader._next_frame = counting
    try:
        ds = make(c, tuning, delta)
        it = iter(ds.dataloader(num_workers=0))
        for _ in range(n):
            next(it)
    finally:
        V.VideoReader._next_frame = orig
    return count[0] / (n * 32 * len(c.meta.camera_keys)), len(ds.chunks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--datasets", default="a,c,d")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--data", type=Path, default=T.REPO / "out" / "bench_data")
    args = ap.parse_args()
    for name in args.datasets.split(","):
        c = case(name, args.data)
        for label, tuning in SETTINGS.items():
            d, chunks = decoded_per_frame(c, tuning, args.batches, False)
            w, _ = decoded_per_frame(c, tuning, args.batches, True)
            print(
                f"{name} {label}: {chunks} chunks, decoded per delivered frame {d:.3f} "
                f"(with delta windows, per delivered sample and camera: {w:.3f})",
                flush=True,
            )
        for workers in [int(w) for w in args.workers.split(",") if w]:
            for delta in (False, True):
                ratios, cpus = [], []
                for r in range(args.rounds):
                    order = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
                    got = {k: rate(c, SETTINGS[k], workers, delta, args.batches) for k in order}
                    ratios.append(got["keyframe"][0] / got["even"][0])
                    cpus.append(got["keyframe"][1] / got["even"][1])
                    print(
                        f"{name} workers={workers} delta={int(delta)} round {r}: frames/s "
                        f"keyframe {got['keyframe'][0]:.0f} even {got['even'][0]:.0f} (ratio "
                        f"{ratios[-1]:.2f}); CPU us/frame keyframe {got['keyframe'][1]:.0f} "
                        f"even {got['even'][1]:.0f} (ratio {cpus[-1]:.2f})",
                        flush=True,
                    )
                print(
                    f"{name} workers={workers} delta={int(delta)}: frames/s keyframe/even median "
                    f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max "
                    f"{max(ratios):.2f}); CPU per frame keyframe/even median "
                    f"{statistics.median(cpus):.2f} (min {min(cpus):.2f}, max {max(cpus):.2f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
