"""The ``robo-resume`` command line.

Commands: ``demo`` (the README's main job), ``inspect``, ``plan``, ``verify``, ``audit`` (a
``robo-resume train`` run's checkpoints: every frame trained exactly once?), ``bench``, and
``train`` (lerobot-train's pipeline with robo_resume's data path, :mod:`robo_resume.lerobot_train`;
it takes lerobot-train's own flags). Every command but ``train`` takes ``--json`` for scripts.
Exit codes: 0 ok, 1 a check found a failure (frames
replayed or lost, missing files), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import RoboResumeError
from ..index.groups import INTERLEAVE_ORDERS
from ..stream.tuning import ORDERS
from .audit import cmd_audit
from .bench import cmd_bench
from .common import CHUNK_HELP, EPISODES_HELP, ON_ERROR_HELP, ORDER_HELP, USAGE, error_message
from .demo import cmd_demo
from .inspect import cmd_inspect
from .plan import cmd_plan
from .verify import cmd_verify

__all__ = ["build_parser", "main"]


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
        c.add_argument("--chunk-frames", type=int, default=None, help=CHUNK_HELP)
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
    d.add_argument("--chunk-frames", type=int, default=None, help=CHUNK_HELP)
    d.add_argument("--checkpoint-every", type=int, default=10)
    d.add_argument("--kill-seed", type=int, default=None, help="seed of the random kill step")
    d.add_argument("--episodes", help=EPISODES_HELP)
    d.add_argument("--on-error", choices=("raise", "skip"), default="raise", help=ON_ERROR_HELP)
    d.add_argument(
        "--resume-workers",
        type=int,
        default=None,
        help="resume with this many DataLoader workers (default: --num-workers); another "
        "topology resumes elastically",
    )
    d.add_argument(
        "--resume-batch-size",
        type=int,
        default=None,
        help="resume with this batch size (default: --batch-size)",
    )
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
        "print each stream's resume cursor after --step batches, without reading frames; "
        "with --config_path of a robo-resume train checkpoint, the resume: lines that "
        "`robo-resume train --resume=true` logs when it resumes from it",
        cmd_plan,
    )
    pl.set_defaults(parser=pl)
    pl.add_argument("root", nargs="?", help="the dataset (not with --config_path)")
    pl.add_argument(
        "--config_path",
        "--config-path",
        help="a robo-resume train checkpoint: OUTPUT_DIR/checkpoints/STEP/pretrained_model/"
        "train_config.json, the folder OUTPUT_DIR/checkpoints/STEP, or OUTPUT_DIR (its "
        "checkpoints/last); the dataset, seed, batch size, workers, processes and --stream.* "
        "values come from it",
    )
    pl.add_argument(
        "--step",
        type=int,
        default=None,
        help="batches this rank delivered (with --config_path: the checkpoint step to resume "
        "from, default the one --config_path names)",
    )
    pl.add_argument("--num-workers", "--num_workers", type=int, default=None, help="default 2")
    pl.add_argument("--batch-size", "--batch_size", type=int, default=None, help="default 8")
    pl.add_argument("--world-size", "--world_size", type=int, default=None, help="default 1")
    pl.add_argument("--seed", type=int, default=None, help="default 0")
    pl.add_argument("--chunk-frames", type=int, default=None, help=CHUNK_HELP)
    pl.add_argument("--episodes", help=EPISODES_HELP)
    pl.add_argument("--order", choices=ORDERS, default=None, help=ORDER_HELP)
    pl.add_argument("--shuffle-frames", type=int, default=None, help="frames per shuffle window")
    pl.add_argument("--interleave", type=int, default=None, help="open chunks (interleave order)")
    pl.add_argument(
        "--interleave-order", choices=INTERLEAVE_ORDERS, default=None, help="(interleave order)"
    )
    pl.add_argument("--infinite", action="store_true")
    pl.epilog = (
        "robo-resume train's --stream.order, --stream.shuffle_frames, --stream.interleave and "
        "--stream.interleave_order are taken too (the same as --order, --shuffle-frames, "
        "--interleave, --interleave-order)"
    )

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

    a = command(
        "audit",
        "prove from a robo-resume train run's last checkpoint (its per-step record of the "
        "stream positions consumed) that every frame of every epoch was trained exactly once; "
        "name the frames replayed or lost otherwise",
        cmd_audit,
    )
    a.add_argument("output_dir", help="the run's --output_dir")
    a.add_argument(
        "--checkpoint", default="last", help="checkpoint to audit (a step folder; default: last)"
    )
    a.add_argument(
        "--index-log",
        help="also compare every step with the index values the run logged to this "
        "ROBO_RESUME_TRAIN_INDEX_LOG path (default: that variable, if set)",
    )

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
        "and elastic --resume=true; `robo-resume train --help` lists them. Its own flags: "
        "--mix.roots/--mix.repo_ids/--mix.weights (several datasets), --stream.order="
        "shuffle|interleave and --stream.shuffle_frames (default: the shuffle order, windows of "
        "1024 frames), --stream.interleave and --stream.interleave_order (the interleave order)",
        add_help=False,
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``robo-resume`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from ..lerobot_train import main as train_main

        return train_main(argv[1:])
    stream = None
    if argv[:1] == ["plan"]:  # robo-resume train's --stream.* flags, parsed as train parses them
        from ..lerobot_train.options import split_stream_args

        try:
            stream, rest = split_stream_args(argv[1:])
        except RoboResumeError as exc:
            print(f"error: {error_message(exc)}", file=sys.stderr)
            return USAGE
        argv = ["plan", *rest]
    args = build_parser().parse_args(argv)
    args.stream = stream
    try:
        return args.func(args)
    except (RoboResumeError, ValueError, FileNotFoundError) as exc:
        print(f"error: {error_message(exc)}", file=sys.stderr)
        return USAGE
