"""``robo-resume plan``: where each stream stands at a step, by arithmetic (no frame is read).

Two ways in: a dataset and the run's settings (``ROOT --step S ...``, without torch), or a
``robo-resume train`` checkpoint (``--config_path``, :mod:`robo_resume.lerobot_train.resume_plan`),
whose settings all come from the checkpoint. Both print each stream's ``resume:`` line as the
resumed streams log it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import describe
from .common import OK, emit, parse_episodes

if TYPE_CHECKING:
    from ..index.schedule import Schedule

_ROOT_DEFAULTS = {"num_workers": 2, "batch_size": 8, "world_size": 1, "seed": 0}
_LEGACY_STREAM = ("order", "shuffle_frames", "interleave", "interleave_order")


def _stream_options(args: argparse.Namespace) -> Any:
    """The ``--stream.*`` flags, or plan's own ``--order ...`` spelling of them (not both)."""
    from ..lerobot_train.options import StreamOptions, TrainSetupError

    own = {k: getattr(args, k) for k in _LEGACY_STREAM if getattr(args, k, None) is not None}
    stream = getattr(args, "stream", None)
    if own and stream is not None:
        raise TrainSetupError(
            describe(
                "Both --stream.* and plan's --order/--shuffle-frames/--interleave flags given",
                found=f"--stream.* {stream.given()} and {own}",
                fix="give the order one way, e.g. --stream.order=interleave",
            )
        )
    return StreamOptions(**own) if own else stream


def _schedule(args: argparse.Namespace, episodes: list[int] | str | None) -> Schedule:
    """The schedule ``ChunkedEpisodeDataset(args.root, ...).schedule(args.num_workers)`` gives
    (``StreamTuning`` of the ``--stream.*`` flags as a new ``robo-resume train`` run resolves
    them, features all kept), computed from the same functions without the
    dataset class: no torch import (the largest part of a cold start). Like the dataset,
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
    from ..lerobot_train.options import resolve_stream

    # a new robo-resume train run's values (the library's default order, or the flags)
    tuning = StreamTuning(**resolve_stream(_stream_options(args), None, args.batch_size))
    meta = load_metadata(args.root).select(src.selection())  # cmd_plan checks ROOT is given
    every = src.episodes is None  # all episodes: the metadata's columns as they are
    spans = EpisodeSpans(*meta.spans(None if every else select_episodes(meta, src.episodes)))
    config = tuning.schedule_config(seed=args.seed, batch_size=args.batch_size, drop_last=False)
    # the dataset's default StreamTuning(cut_at_keyframes=None): chunks start on the first
    # camera's keyframes when its GOPs are long (one small mp4 index read per file)
    cuts = keyframe_cuts(meta, spans.episode_index, auto=tuning.cut_at_keyframes is None)
    chunk_frames = tuning.chunk_frames(src.chunk_frames, video=bool(meta.camera_keys))
    chunks = make_chunks(spans, chunk_frames, cut_points=cuts)
    return Schedule(chunks, config, Topology(args.world_size, args.num_workers))


def cmd_plan(args: argparse.Namespace) -> int:
    """Each stream's resume cursor after ``--step`` batches, computed without reading frames
    (the metadata, and the first camera's mp4 indexes for keyframe cuts); with
    ``--config_path``, those a ``robo-resume train`` checkpoint resumes from."""
    if args.config_path:
        return _cmd_plan_checkpoint(args)
    if args.root is None:
        args.parser.error("give a dataset ROOT, or --config_path of a robo-resume train checkpoint")
    if args.step is None:
        args.parser.error("the following arguments are required: --step")
    for key, value in _ROOT_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    from ..index.schedule import Topology
    from ..index.start import resume_at, resume_point

    streams = []
    episodes = parse_episodes(args.episodes, args.root)
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
            at = resume_at(sched, g, epoch, pos)
            streams.append(
                {
                    "rank": rank,
                    "worker": worker,
                    "stream": g,
                    "epoch": epoch,
                    "position": pos,
                    "chunk": at.chunk,
                    "episode": at.episode,
                    "frame": at.frame,
                    "line": at.line(),
                }
            )
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
    lines.append("the streams' resume: lines:")
    lines += [s["line"] for s in streams]
    emit(args, report, "\n".join(lines))
    return OK


def _cmd_plan_checkpoint(args: argparse.Namespace) -> int:
    """``plan --config_path``: the ``resume:`` lines of ``robo-resume train --resume=true``."""
    from ..lerobot_train.options import TrainSetupError, require_lerobot
    from ..lerobot_train.resume_plan import checkpoint_dir, checkpoint_of_step, plan_resume

    extra = [
        flag
        for flag, given in (
            ("ROOT", args.root is not None),
            ("--seed", args.seed is not None),
            ("--chunk-frames", args.chunk_frames is not None),
            ("--episodes", args.episodes is not None),
            ("--infinite", args.infinite),
        )
        if given
    ]
    if extra:
        raise TrainSetupError(
            describe(
                f"{', '.join(extra)} with --config_path",
                expected="the dataset, seed, episodes and chunks of the checkpoint's run "
                "(robo-resume train streams infinitely)",
                found=" ".join(extra),
                fix="leave them out; --step, --num_workers, --batch_size, --world_size and "
                "--stream.* say how the run resumes",
            )
        )
    require_lerobot()
    ckpt = checkpoint_dir(args.config_path)
    if args.step is not None:
        ckpt = checkpoint_of_step(ckpt, args.step)
    report = plan_resume(
        ckpt,
        stream=_stream_options(args),
        num_workers=args.num_workers,
        batch_size=args.batch_size,
        world_size=args.world_size,
    )
    saved, resume = report["saved"], report["resume"]

    def topo(t: dict[str, int]) -> str:
        return f"batch {t['batch_size']}, {t['num_workers']} workers x {t['world_size']} ranks"

    lines = [
        f"robo-resume train --resume=true from {report['checkpoint']} (step {report['step']}, "
        f"saved with {topo(saved)}; resumed with {topo(resume)}"
        + ("" if saved == resume else ": an elastic resume")
        + f"; stream order {report['stream']}) logs:"
    ]
    if report["note"]:
        lines.append(f"  no resume: lines: {report['note']}")
    for s in report["streams"]:
        src = "" if s["source"] is None else f" source {s['source']}"
        lines.append(f"rank {s['rank']} worker {s['worker']}{src}: {s['line']}")
    emit(args, report, "\n".join(lines))
    return OK
