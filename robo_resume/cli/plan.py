"""``robo-resume plan``: where each stream stands at a step, by arithmetic (no frame is read)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import OK, _emit, _episodes

if TYPE_CHECKING:
    from ..index.schedule import Schedule


def _schedule(args: argparse.Namespace, episodes: list[int] | str | None) -> Schedule:
    """The schedule ``ChunkedEpisodeDataset(args.root, ...).schedule(args.num_workers)`` gives
    (default StreamTuning, features all kept), computed from the same functions without the
    dataset class: no torch import (1.5 to 6 s of the command's cold start). Like the dataset,
    it reads the first camera's mp4 indexes to start chunks on keyframes when the GOPs are long
    (none when the videos are absent).
    tests/test_plan_cli.py checks that both give the same streams."""
    from ..format.keyframes import keyframe_cuts
    from ..format.metadata import load_metadata
    from ..index.plan import EpisodeSpans, make_chunks
    from ..index.schedule import Schedule, Topology
    from ..source import as_source
    from ..splits import select_episodes
    from ..state.records import check_resume_step
    from ..stream.tuning import StreamTuning

    src = as_source(
        args.root,
        {"episodes": episodes, "chunk_frames": args.chunk_frames},
        owner="ChunkedEpisodeDataset",
    )
    check_resume_step(args.step * args.batch_size, args.batch_size)
    given = {
        k: getattr(args, k, None)
        for k in ("order", "shuffle_frames", "interleave", "interleave_order")
    }
    tuning = StreamTuning(**{k: v for k, v in given.items() if v is not None})
    meta = load_metadata(src.root).select(src.selection())
    every = src.episodes is None  # all episodes: the metadata's columns as they are
    spans = EpisodeSpans(*meta.spans(None if every else select_episodes(meta, src.episodes)))
    config = tuning.schedule_config(seed=args.seed, batch_size=args.batch_size, drop_last=False)
    # the dataset's default StreamTuning(cut_at_keyframes=None): chunks start on the first
    # camera's keyframes when its GOPs are long (one small mp4 index read per file)
    cuts = keyframe_cuts(meta, spans.episode_index, auto=tuning.cut_at_keyframes is None)
    chunks = make_chunks(spans, tuning.chunk_frames(src.chunk_frames), cut_points=cuts)
    return Schedule(chunks, config, Topology(args.world_size, args.num_workers))


def cmd_plan(args: argparse.Namespace) -> int:
    """Each stream's resume cursor after ``--step`` batches, computed without reading frames
    (the metadata, and the first camera's mp4 indexes for keyframe cuts)."""
    from ..index.schedule import Topology
    from ..index.start import resume_point

    streams = []
    episodes = _episodes(args.episodes, args.root)
    # One schedule holds the plan, the same on every rank; each rank's start point is
    # resume_point() of it with its rank (what ChunkedEpisodeDataset.start_point does without
    # a resume state).
    sched = _schedule(args, episodes)
    wp = max(args.num_workers, 1)
    topo = Topology(args.world_size, args.num_workers)
    for rank in range(args.world_size):
        rp = resume_point(sched, args.step, infinite=args.infinite, rank=rank)
        rotation, starts = rp.rotation, [(s.epoch, s.position) for s in rp.starts]
        for worker in range(wp):
            role = (worker + rotation) % wp
            epoch, pos = starts[role]
            g = topo.stream_id(rank, role)
            entry = {
                "rank": rank,
                "worker": worker,
                "stream": g,
                "epoch": epoch,
                "position": pos,
                "chunk": None,
                "episode": None,
                "frame": None,
            }
            if pos < sched.length(g):
                cur = sched.locate(epoch, g, pos)
                seg, frame = sched.group(epoch, g, cur.group).frame(cur.offset)
                entry.update(chunk=seg.chunk_id, episode=seg.episode_index, frame=frame)
            streams.append(entry)
    report = {
        "step": args.step,
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "world_size": args.world_size,
        "batches_per_epoch_per_rank": sched.batches_per_rank,
        "frames_per_stream": sched.frames_per_stream,
        "streams": streams,
    }
    lines = [
        f"after step {args.step} (batch {args.batch_size}, {args.num_workers} workers x "
        f"{args.world_size} ranks; {sched.batches_per_rank} batches per epoch per rank):"
    ]
    for s in streams:
        where = (
            f"chunk {s['chunk']} (episode {s['episode']}, frame {s['frame']})"
            if s["chunk"] is not None
            else "epoch finished"
        )
        lines.append(
            f"  rank {s['rank']} worker {s['worker']} -> stream {s['stream']}: epoch "
            f"{s['epoch']}, position {s['position']}, {where}"
        )
    _emit(args, report, "\n".join(lines))
    return OK
