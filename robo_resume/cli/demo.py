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
    audit, at_kill = r["audit"], r["audit_at_kill"]
    ok = (
        r["frames_replayed"] == 0
        and r["frames_lost"] == 0
        and r["order_identical"] is not False
        and audit["ok"]
        and at_kill["ok"]
    )
    resumed = r["resumed_with"]
    order = {True: "yes", False: "NO", None: "not compared (another topology: elastic resume)"}
    text = "\n".join(
        [
            f"dataset: {r['dataset']}",
            f"training: batch {r['batch_size']}, {r['num_workers']} DataLoader workers, "
            f"{r['epochs']} epochs = {r['steps_uninterrupted']} steps, "
            f"{len(r['episodes'])} episodes",
            *([f"skipped (--on-error skip): {r['skip_summary']}"] if r["skip_summary"] else []),
            f"killed with SIGKILL at step {r['killed_at_step']}; resumed from the checkpoint of "
            f"step {r['resumed_from_checkpoint_step']}"
            + (
                f" with {resumed['num_workers']} worker{'s' * (resumed['num_workers'] != 1)}, "
                f"batch {resumed['batch_size']}"
                if resumed["elastic"]
                else ""
            ),
            f"frames replayed: {r['frames_replayed']}",
            f"frames lost: {r['frames_lost']}",
            f"order identical to an uninterrupted run: {order[r['order_identical']]}",
            "audit of the checkpoint the kill left (step "
            f"{at_kill['step']}): {_audit_line(at_kill)}",
            f"audit of the final checkpoint (step {audit['step']}): {_audit_line(audit)}",
            f"resume: {r['resume_to_first_batch_s']:.2f}s from dataset construction to the first "
            f"batch ({r['resumed_process_wall_s']:.1f}s for the whole resumed process)",
            f"throughput after resume: {r['throughput_frames_per_s']} frames/s (training included)",
            "result: " + ("exactly once" if ok else "FAILED"),
        ]
    )
    emit(args, {**r, "ok": ok}, text)
    return OK if ok else FAILED


def _audit_line(audit: dict) -> str:
    """One line of an audit's counts (``RunAudit.to_dict()``), its problems after it."""
    epochs = audit["epochs"]
    trained = sum(e["once"] for e in epochs)
    pending = sum(e["pending"] for e in epochs)
    bad = sum(e["replayed"] + e["lost"] for e in epochs)
    head = f"{trained} frames trained exactly once" + (
        f", {pending} pending (the resume trains them)" if pending else ""
    )
    if audit["ok"]:
        return head + f", over {len(epochs)} epoch(s): ok"
    problems = "; ".join(audit["problems"][:3])
    return f"{head}, {bad} replayed or lost: FAILED" + (f" ({problems})" if problems else "")
