"""``robo-resume bench``: frames per second of the stream on a dataset."""

from __future__ import annotations

import argparse
import time

from .common import OK, emit, parse_episodes


def cmd_bench(args: argparse.Namespace) -> int:
    """Quick throughput of this machine on a dataset: streaming vs a plain sequential decode."""
    import av

    from ..dataset import ChunkedEpisodeDataset

    ds = ChunkedEpisodeDataset(
        args.root,
        batch_size=args.batch_size,
        seed=0,
        episodes=parse_episodes(args.episodes, args.root),
        image_dtype="uint8",
        on_error=args.on_error,
    )
    t = time.perf_counter()
    frames = 0
    for k, batch in enumerate(ds.dataloader(num_workers=args.num_workers)):
        frames += len(batch["index"])
        if k + 1 >= args.batches:
            break
    stream_s = time.perf_counter() - t
    decoded, t = 0, time.perf_counter()
    budget = frames
    for e in ds.episodes:
        ep = ds.meta.episode(e)
        for ref in ep.videos.values():
            path = ds.meta.root / ref.path
            if not path.is_file():
                continue
            with av.open(str(path)) as c:
                s = c.streams.video[0]
                s.thread_count = 1  # FFmpeg frame threads can deadlock on close
                for fr in c.decode(s):
                    fr.to_ndarray(format="rgb24")
                    decoded += 1
                    if decoded >= budget * max(len(ds.meta.camera_keys), 1):
                        break
        if decoded >= budget * max(len(ds.meta.camera_keys), 1):
            break
    ceiling_s = time.perf_counter() - t
    cams = max(len(ds.meta.camera_keys), 1)
    report = {
        "root": str(args.root),
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "frames": frames,
        "stream_frames_per_s": round(frames / stream_s, 1),
        "sequential_decode_frames_per_s": round(decoded / cams / max(ceiling_s, 1e-9), 1)
        if ds.meta.camera_keys
        else None,
    }
    text = (
        f"robo_resume: {report['stream_frames_per_s']} frames/s ({frames} frames, batch "
        f"{args.batch_size}, {args.num_workers} workers, uint8, worker start-up included)"
    )
    if report["sequential_decode_frames_per_s"]:
        text += (
            f"\nsequential PyAV decode (one process, no dataset): "
            f"{report['sequential_decode_frames_per_s']} frames/s "
            f"({cams} camera(s) per frame)"
        )
    emit(args, report, text)
    return OK
