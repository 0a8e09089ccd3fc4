"""``robo-resume demo``: the README's main job."""

from __future__ import annotations

import argparse

from .common import FAILED, OK, emit, parse_episodes


def cmd_demo(args: argparse.Namespace) -> int:
    """Train a tiny policy, SIGKILL it, resume from its checkpoint, check exactly-once."""
    from ..demo import run_demo

    if args.root or args.episodes != "readable":  # a generated dataset: resolved in run_demo
        args.episodes = parse_episodes(args.episodes, args.root)
    r = run_demo(args)
    ok = r["frames_replayed"] == 0 and r["frames_lost"] == 0 and r["order_identical"]
    text = "\n".join(
        [
            f"dataset: {r['dataset']}",
            f"training: batch {r['batch_size']}, {r['num_workers']} DataLoader workers, "
            f"{r['epochs']} epochs = {r['steps_uninterrupted']} steps, "
            f"{len(r['episodes'])} episodes",
            *([f"skipped (--on-error skip): {r['skip_summary']}"] if r["skip_summary"] else []),
            f"killed with SIGKILL at step {r['killed_at_step']}; resumed from the checkpoint of "
            f"step {r['resumed_from_checkpoint_step']}",
            f"frames replayed: {r['frames_replayed']}",
            f"frames lost: {r['frames_lost']}",
            f"order identical to an uninterrupted run: {'yes' if r['order_identical'] else 'NO'}",
            f"resume: {r['resume_to_first_batch_s']:.2f}s from dataset construction to the first "
            f"batch ({r['resumed_process_wall_s']:.1f}s for the whole resumed process)",
            f"throughput after resume: {r['throughput_frames_per_s']} frames/s (training included)",
            "result: " + ("exactly once" if ok else "FAILED"),
        ]
    )
    emit(args, {**r, "ok": ok}, text)
    return OK if ok else FAILED
