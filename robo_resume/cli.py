"""The ``robo-resume`` command line.

Commands: ``demo`` (the README's main job), ``inspect``, ``plan``, ``verify``, ``bench``, and
``train`` (lerobot-train's pipeline with robo_resume's data path, :mod:`robo_resume.lerobot_train`;
it takes lerobot-train's own flags). Every command but ``train`` takes ``--json`` for scripts.
Exit codes: 0 ok, 1 a check found a failure (frames
replayed or lost, missing files), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .errors import RoboResumeError, describe

__all__ = ["build_parser", "main"]

OK, FAILED, USAGE = 0, 1, 2


EPISODES_HELP = (
    "episodes to use: indices and ranges (0-9,12), a slice string (train[:90%%]), or "
    "'readable' (the episodes whose files all exist and open); default: all"
)
ON_ERROR_HELP = (
    "raise (default): stop at the first missing or broken file with an error naming it; "
    "skip: skip the chunks whose files fail to read, and report them"
)


def _episodes(text: str | None, root: Any = None) -> list[int] | str | None:
    """``--episodes``: None, ``readable``, a slice string, or indices with ranges (``0-9,12``)."""
    if not text:
        return None
    text = text.strip()
    if text == "readable":
        from .files import readable_episodes

        if root is None:
            raise ValueError(describe("--episodes readable needs a dataset", found="no --root"))
        return list(readable_episodes(root))
    if "[" in text:
        return text
    out: list[int] = []
    try:
        for part in text.split(","):
            a, sep, b = part.strip().partition("-")
            out.extend(range(int(a), int(b) + 1) if sep and a else [int(part)])
    except ValueError:
        raise ValueError(
            describe(
                "--episodes is not an episode selection",
                expected="indices and ranges such as 0-9,12, a slice string such as "
                "'train[:90%]', or 'readable'",
                found=repr(text),
            )
        ) from None
    return out


def _message(exc: BaseException) -> str:
    """The error's own message on one line, without torch's worker traceback.

    An error raised in a DataLoader worker reaches the main process as ``Caught X in DataLoader
    worker process N. Original Traceback (most recent call last): ... X: <message>``; the
    message is the last line (our messages are one paragraph).
    """
    text = str(exc)
    if "Original Traceback" in text:
        name = type(exc).__name__
        lines = text.rstrip().splitlines()
        for i in range(len(lines) - 1, -1, -1):
            head, sep, rest = lines[i].partition(": ")
            if sep and head.rsplit(".", 1)[-1] == name:
                text = " ".join([rest, *lines[i + 1 :]])
                break
    text = " ".join(text.split())
    return text.replace("pass on_error='skip'", "pass --on-error skip (or --episodes readable)")


def _emit(args: argparse.Namespace, report: dict[str, Any], text: str) -> None:
    print(json.dumps(report, indent=2) if args.json else text)


# -- demo -------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """Train a tiny policy, SIGKILL it, resume from its checkpoint, check exactly-once."""
    from .demo import run_demo

    if args.root or args.episodes != "readable":  # a generated dataset: resolved in run_demo
        args.episodes = _episodes(args.episodes, args.root)
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
    _emit(args, {**r, "ok": ok}, text)
    return OK if ok else FAILED


# -- inspect ----------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    """Version, episodes, frames, fps, features, cameras with codec and keyframe interval."""
    import av

    from .files import check_files
    from .format.metadata import load_metadata

    meta = load_metadata(args.root)
    check = check_files(meta)
    missing = sorted(p.path for p in check.problems if p.problem == "missing")
    unreadable = {p.path: p.error for p in check.problems if p.problem == "unreadable"}
    bad = {p.path for p in check.problems}
    cams: dict[str, Any] = {}
    for cam in meta.camera_keys:
        declared = meta.features[cam].get("info", {}).get("video.codec")
        paths = sorted({e.videos[cam].path for e in meta.episodes} - bad)
        found = None
        for rel in paths[:1]:  # the first readable file describes the camera
            try:
                with av.open(str(meta.root / rel)) as c:
                    s = c.streams.video[0]
                    s.thread_count = 1
                    keys = [
                        float(p.pts * s.time_base)
                        for p in c.demux(s)
                        if p.is_keyframe and p.pts is not None
                    ]
                    gaps = [round((b - a) * meta.fps) for a, b in itertools.pairwise(sorted(keys))]
                    found = {
                        # the codec (e.g. av1), not the decoder that reads it (e.g. libdav1d)
                        "codec": s.codec_context.codec.canonical_name,
                        "decoder": s.codec_context.codec.name,
                        "size": [s.codec_context.height, s.codec_context.width],
                        "fps": round(float(s.average_rate or 0), 3),
                        "keyframe_interval": Counter(gaps).most_common(1)[0][0] if gaps else None,
                    }
            except Exception as exc:  # a file that opens but cannot be demuxed
                unreadable[rel] = f"{type(exc).__name__}: {exc}"
        cams[cam] = {
            "declared_codec": declared,
            "container": found,
            "agrees": bool(found) and found["codec"] == _codec_name(declared),
        }
    report = {
        "root": str(meta.root),
        "version": meta.version,
        "episodes": meta.num_episodes,
        "frames": meta.total_frames,
        "fps": meta.fps,
        "tasks": len(meta.tasks),
        "features": {k: v.get("dtype") for k, v in meta.features.items()},
        "cameras": cams,
        "missing_files": missing,
        "unreadable_files": unreadable,
        "readable_episodes": len(check.readable),
    }
    lines = [
        f"{report['root']}: LeRobot {meta.version}, {meta.num_episodes} episodes, "
        f"{meta.total_frames} frames at {meta.fps} fps, {len(meta.tasks)} task(s)"
    ]
    lines += [f"  feature {k}: {v}" for k, v in report["features"].items()]
    for cam, c in cams.items():
        if c["container"]:
            k = c["container"]
            note = "" if c["agrees"] else f"  (info.json says {c['declared_codec']})"
            lines.append(
                f"  camera {cam}: {k['codec']} {k['size'][1]}x{k['size'][0]}, keyframe "
                f"every {k['keyframe_interval']} frames{note}; decoder {k['decoder']}"
            )
        else:
            lines.append(f"  camera {cam}: no readable video")
    if missing:
        kinds = Counter(p.kind for p in check.problems if p.problem == "missing")
        lines.append(
            f"  missing files: {len(missing)} ("
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            + "): "
            + ", ".join(missing)
        )
    for rel, err in unreadable.items():
        lines.append(f"  unreadable: {rel}: {err}")
    if missing or unreadable:
        lines.append(
            f"  readable episodes: {len(check.readable)} of {meta.num_episodes} "
            "(select them with --episodes readable, or episodes=readable_episodes(root))"
        )
    _emit(args, report, "\n".join(lines))
    return FAILED if (missing or unreadable) else OK


def _codec_name(declared: Any) -> str | None:
    """info.json's ``video.codec`` as FFmpeg's codec name (``h265`` is ``hevc``)."""
    if not isinstance(declared, str):
        return None
    name = declared.strip().lower()
    return {"h265": "hevc", "x264": "h264", "avc": "h264", "x265": "hevc"}.get(name, name)


# -- plan -------------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    """Each stream's resume cursor after ``--step`` batches, computed without reading data."""
    from .dataset import ChunkedEpisodeDataset
    from .index.schedule import Topology

    streams = []
    episodes = _episodes(args.episodes, args.root)
    for rank in range(args.world_size):
        ds = ChunkedEpisodeDataset(
            args.root,
            batch_size=args.batch_size,
            seed=args.seed,
            chunk_frames=args.chunk_frames,
            episodes=episodes,
            resume_step=args.step * args.batch_size,
            infinite=args.infinite,
            rank=rank,
            world_size=args.world_size,
        )
        sched = ds.schedule(args.num_workers)
        rotation, starts, _ = ds.start_point(args.num_workers)
        wp = max(args.num_workers, 1)
        topo = Topology(args.world_size, args.num_workers)
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
                grp = sched.group(epoch, g, cur.group)
                j = int(grp.order[cur.offset])
                seg = grp.segments[j]
                entry.update(
                    chunk=seg.chunk_id, episode=seg.episode_index, frame=seg.start + cur.done[j]
                )
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


# -- verify -----------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    """The overlap audit with real DataLoaders; exit 1 if robo_resume replays or loses a frame."""
    from .audit import audit

    results = []
    consumed: dict[int, dict[str, Counter]] = {}  # crash step -> scenario -> index counts
    full_all: dict[int, Counter] = {}
    crashes = [int(x) for x in str(args.crash_at).split(",")]
    episodes = _episodes(args.episodes, args.root)
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
    for r in results:
        r.pop("order", None)
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
        from .format.metadata import load_metadata
        from .plot import Panel, plot_consumption
        from .splits import select_episodes

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
    _emit(args, report, "\n".join(lines))
    return OK if ok else FAILED


# -- bench ------------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    """Quick throughput of this machine on a dataset: streaming vs a plain sequential decode."""
    import av

    from .dataset import ChunkedEpisodeDataset

    ds = ChunkedEpisodeDataset(
        args.root,
        batch_size=args.batch_size,
        seed=0,
        episodes=_episodes(args.episodes, args.root),
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
    _emit(args, report, text)
    return OK


# -- parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``robo-resume`` command."""
    p = argparse.ArgumentParser(
        prog="robo-resume",
        description="Stream LeRobot datasets in chunks and resume crashed training exactly.",
        epilog="exit codes: 0 ok, 1 a check failed, 2 usage or input error",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help_, func):
        c = sub.add_parser(name, help=help_, description=help_)
        c.add_argument("--json", action="store_true", help="print JSON instead of text")
        c.set_defaults(func=func)
        return c

    def data_opts(c, workers=2, batch=8):
        c.add_argument("--num-workers", type=int, default=workers)
        c.add_argument("--batch-size", type=int, default=batch)
        c.add_argument("--seed", type=int, default=0)
        c.add_argument("--chunk-frames", type=int, default=64)
        c.add_argument("--episodes", help=EPISODES_HELP)

    d = command(
        "demo",
        "train a tiny policy, SIGKILL it, resume from its checkpoint, check "
        "that no frame was replayed or lost",
        cmd_demo,
    )
    d.add_argument("--root", help="use this LeRobot dataset instead of generating one")
    d.add_argument("--out", help="folder for generated files (default: a temp folder)")
    d.add_argument("--batch-size", type=int, default=16)
    d.add_argument("--num-workers", type=int, default=2)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--epochs", type=int, default=2)
    d.add_argument("--chunk-frames", type=int, default=32)
    d.add_argument("--checkpoint-every", type=int, default=10)
    d.add_argument("--kill-seed", type=int, default=None, help="seed of the random kill step")
    d.add_argument("--episodes", help=EPISODES_HELP)
    d.add_argument("--on-error", choices=("raise", "skip"), default="raise", help=ON_ERROR_HELP)
    d.add_argument("--slow", type=float, default=0.01, help=argparse.SUPPRESS)

    i = command(
        "inspect",
        "summarise a dataset: version, episodes, cameras, codecs found in "
        "the containers, keyframe interval, missing or unreadable files",
        cmd_inspect,
    )
    i.add_argument("root")

    pl = command(
        "plan",
        "print each stream's resume cursor after --step batches, without reading data",
        cmd_plan,
    )
    pl.add_argument("root")
    pl.add_argument("--step", type=int, required=True, help="batches this rank delivered")
    data_opts(pl)
    pl.add_argument("--world-size", type=int, default=1)
    pl.add_argument("--infinite", action="store_true")

    v = command(
        "verify",
        "crash real DataLoaders and resume them; count replayed and lost frames per scenario",
        cmd_verify,
    )
    v.add_argument("root")
    data_opts(v)
    v.add_argument("--crash-at", default="5", help="step(s), comma-separated")
    v.add_argument("--world-size", type=int, default=1)
    v.add_argument("--epochs", type=int, default=1)
    v.add_argument("--plot", help="write a PNG of how often each frame was consumed")
    v.add_argument("--on-error", choices=("raise", "skip"), default="raise", help=ON_ERROR_HELP)

    b = command("bench", "quick throughput check of this machine on a dataset", cmd_bench)
    b.add_argument("root")
    b.add_argument("--num-workers", type=int, default=2)
    b.add_argument("--batch-size", type=int, default=32)
    b.add_argument("--batches", type=int, default=50)
    b.add_argument("--episodes", help=EPISODES_HELP)
    b.add_argument("--on-error", choices=("raise", "skip"), default="raise", help=ON_ERROR_HELP)

    # listed for --help only: main() hands `train ...` to lerobot's own parser
    sub.add_parser(
        "train",
        help="lerobot-train with robo_resume as its data path: lerobot-train's flags "
        "(--policy.type, --dataset.repo_id, --dataset.root, --batch_size, --steps, ...), exact "
        "and elastic --resume=true; `robo-resume train --help` lists them",
        add_help=False,
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``robo-resume`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from .lerobot_train import main as train_main

        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RoboResumeError, ValueError, FileNotFoundError) as exc:
        print(f"error: {_message(exc)}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
