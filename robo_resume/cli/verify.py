"""``robo-resume verify``: the overlap audit (crash, resume, count replayed and lost frames)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from .common import FAILED, OK, emit, parse_episodes


def cmd_verify(args: argparse.Namespace) -> int:
    """The overlap audit with real DataLoaders; exit 1 if robo_resume replays or loses a frame."""
    from ..audit import audit

    results = []
    consumed: dict[int, dict[str, Counter]] = {}  # crash step -> scenario -> index counts
    full_all: dict[int, Counter] = {}
    crashes = [int(x) for x in str(args.crash_at).split(",")]
    episodes = parse_episodes(args.episodes, args.root)
    for crash in crashes:
        for rank in range(args.world_size):
            full, res = audit(
                args.root,
                num_workers=args.num_workers,
                batch_size=args.batch_size,
                crash_at=crash,
                epochs=args.epochs,
                seed=args.seed,
                chunk_frames=args.chunk_frames,
                episodes=episodes,
                on_error=args.on_error,
                rank=rank,
                world_size=args.world_size,
                keep_order=True,
            )
            full_all.setdefault(crash, Counter()).update(full)
            for r in res:
                results.append({"crash_at": crash, "rank": rank, **r.as_dict()})
                consumed.setdefault(crash, {}).setdefault(r.scenario, Counter()).update(r.order)
    for row in results:
        row.pop("order", None)
    ok = all(
        r["replayed"] == 0 and r["lost"] == 0 and r["same_order"]
        for r in results
        if r["scenario"] in ("arithmetic", "cursor")
    )
    report = {
        "root": str(args.root),
        "num_workers": args.num_workers,
        "batch_size": args.batch_size,
        "world_size": args.world_size,
        "results": results,
        "ok": ok,
    }
    if args.plot:
        from ..format.metadata import load_metadata
        from ..plot import Panel, plot_consumption
        from ..splits import select_episodes

        meta = load_metadata(args.root)
        chosen = set(select_episodes(meta, episodes))
        plot_consumption(
            args.plot,
            [
                Panel(f"crash at step {crash}", full_all[crash], consumed[crash])
                for crash in crashes
            ],
            title=(
                f"{Path(args.root).name}: {args.num_workers} workers, batch {args.batch_size}, "
                f"{args.world_size} rank(s), {len(chosen)} of {meta.num_episodes} episodes"
            ),
            num_frames=max(e.dataset_to_index for e in meta.episodes),
            excluded=[
                (e.dataset_from_index, e.dataset_to_index)
                for e in meta.episodes
                if e.episode_index not in chosen
            ],
        )
        report["plot"] = str(args.plot)
        report["plot_panels"] = [f"crash at step {crash}" for crash in crashes]
    head = ("step", "rank", "scenario", "consumed", "replayed", "lost", "same order")
    rows = [
        (
            r["crash_at"],
            r["rank"],
            r["scenario"],
            r["consumed"],
            r["replayed"],
            r["lost"],
            "yes" if r["same_order"] else "no",
        )
        for r in results
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)) for row in rows]
    lines.append("robo_resume: exactly once" if ok else "robo_resume: FAILED")
    if args.plot:
        lines.append(f"plot: {args.plot}")
    emit(args, report, "\n".join(lines))
    return OK if ok else FAILED
