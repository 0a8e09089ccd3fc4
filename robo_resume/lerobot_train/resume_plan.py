"""``robo-resume plan --config_path``: the ``resume:`` lines that ``robo-resume train
--resume=true`` logs when it resumes from a checkpoint, computed without training.

The run's datasets are built as the resumed run builds them (:func:`.setup.build_dataset`
with the checkpoint's ``train_config.json``, data state and saved ``--stream.*`` options, one
dataset per rank), and each stream's start is turned into its ``resume:`` line by the
function the streams log with (:func:`robo_resume.index.start.resume_at`); nothing is read
but metadata and mp4 indexes. ``--num_workers``, ``--batch_size`` and ``--world_size`` given
for the resume plan an elastic resume, as they would run one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import describe
from .options import StreamOptions, TrainSetupError

__all__ = ["checkpoint_dir", "checkpoint_of_step", "checkpoint_step", "plan_resume"]

_FIX = (
    "pass --config_path=OUTPUT_DIR/checkpoints/STEP/pretrained_model/train_config.json, the "
    "checkpoint folder OUTPUT_DIR/checkpoints/STEP, or the output dir (its checkpoints/last)"
)


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint folder ``--config_path`` names: a ``train_config.json`` (its
    checkpoint's), a ``pretrained_model`` folder, a checkpoint folder, or a run's output dir
    (its ``checkpoints/last``). Raises :class:`TrainSetupError` naming what was found."""
    p = Path(path)
    if p.is_file() and p.name.endswith(".json"):
        ckpt = p.parent.parent
    elif p.is_dir() and p.name == "pretrained_model":
        ckpt = p.parent
    elif p.is_dir() and (p / "checkpoints").is_dir():
        ckpt = p / "checkpoints" / "last"
        if not ckpt.exists():
            names = sorted(x.name for x in (p / "checkpoints").iterdir())
            raise TrainSetupError(
                describe(
                    "The run has no complete checkpoint yet",
                    expected=f"{ckpt} (written with the first checkpoint)",
                    found=f"{p / 'checkpoints'} holds: {', '.join(names) or 'nothing'}",
                    fix=_FIX,
                )
            )
    else:
        ckpt = p
    if not (ckpt / "training_state").is_dir() or not (ckpt / "pretrained_model").is_dir():
        raise TrainSetupError(
            describe(
                "--config_path names no robo-resume train checkpoint",
                expected="a folder with pretrained_model/ and training_state/ (or a file or "
                "run folder leading to one)",
                found=f"{p}" + ("" if p.exists() else " does not exist"),
                fix=_FIX,
            )
        )
    return ckpt.resolve()


def checkpoint_step(ckpt: Path) -> int:
    """The step a checkpoint was saved at (lerobot's ``training_state/training_step.json``)."""
    path = ckpt / "training_state" / "training_step.json"
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainSetupError(
            describe(
                "The checkpoint's step cannot be read",
                expected='{"step": N}',
                found=f"{type(exc).__name__}: {exc}",
                file=path,
                fix="point --config_path at a complete checkpoint (`ls OUTPUT_DIR/checkpoints`)",
            )
        ) from exc


def checkpoint_of_step(ckpt: Path, step: int) -> Path:
    """The checkpoint of ``step`` beside ``ckpt`` (in the same ``checkpoints`` folder): a run
    resumes at a step it saved, so that is where ``--step`` leads."""
    if checkpoint_step(ckpt) == step:
        return ckpt
    steps = {int(p.name): p for p in ckpt.parent.iterdir() if p.name.isdigit() and p.is_dir()}
    if step not in steps:
        raise TrainSetupError(
            describe(
                f"The run has no checkpoint of step {step}: robo-resume train resumes at a "
                "step it saved",
                expected=f"a folder {ckpt.parent}/{step:06d}",
                found="checkpoints of steps " + (", ".join(map(str, sorted(steps))) or "none"),
                fix="pass --step with one of those steps, or leave --step out for the "
                "checkpoint --config_path names",
            )
        )
    return steps[step].resolve()


def _train_config(ckpt: Path) -> Any:
    """lerobot's ``TrainPipelineConfig`` of the checkpoint (its policy configs registered)."""
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.scripts import lerobot_train  # registers the policy, env and optimizer configs
    from lerobot.utils.import_utils import register_third_party_plugins

    del lerobot_train
    register_third_party_plugins()
    return TrainPipelineConfig.from_pretrained(ckpt / "pretrained_model")


def plan_resume(
    ckpt: Path,
    *,
    stream: StreamOptions | None = None,
    num_workers: int | None = None,
    batch_size: int | None = None,
    world_size: int | None = None,
) -> dict[str, Any]:
    """What ``robo-resume train --resume=true --config_path=CKPT`` logs about its data.

    ``stream``, ``num_workers``, ``batch_size``, ``world_size``: the resume's flags (None: the
    checkpoint's values, as the resumed run takes them). Returns a JSON-safe report:
    ``checkpoint``, ``step``, the saved and the resume ``topology`` (``batch_size``,
    ``num_workers``, ``world_size``), ``stream`` (the ``StreamTuning`` values the run uses),
    ``note`` (the warning a checkpoint without a data state gets, else None) and ``streams``:
    per rank, new worker and (in a mix) source, where the stream starts (``rank``, ``worker``,
    ``source``, ``stream``, ``epoch``, ``position``, ``chunk``, ``episode``, ``frame``) and its
    ``line``, the ``resume:`` log line. Errors are the resumed run's own (a refused data state,
    an infeasible elastic split).
    """
    from ..index.schedule import Topology
    from ..index.start import resume_at
    from .checkpoints import read_saved
    from .options import resolve_stream
    from .setup import build_dataset, eval_split, policy_metadata, resolve_mix

    cfg = _train_config(ckpt)
    step_file = json.loads((ckpt / "training_state" / "training_step.json").read_text())
    saved_topology = {
        "batch_size": int(step_file.get("batch_size", cfg.batch_size)),
        "num_workers": int(cfg.num_workers),
        "world_size": int(step_file.get("num_processes", 1)),
    }
    if batch_size is not None:
        cfg.batch_size = batch_size
    if num_workers is not None:
        cfg.num_workers = num_workers
    world = saved_topology["world_size"] if world_size is None else world_size
    nw = cfg.num_workers
    saved = read_saved(ckpt)
    options = saved.get("options")
    state = saved.get("data_state")
    mix = resolve_mix(None, options)
    tuning = resolve_stream(stream, options, cfg.batch_size)
    meta = policy_metadata(cfg, mix)
    train_episodes, _ = eval_split(cfg, meta)
    topo = Topology(world, nw)
    wp = topo.workers_per_rank
    rows: list[dict[str, Any]] = []
    note = None
    for rank in range(world):
        ds, note = build_dataset(
            cfg, mix, meta, state, ckpt, train_episodes, tuning, rank=rank, world_size=world
        )
        if state is None:  # the data starts anew: no stream logs a resume line
            break
        rotation, starts, _ = ds.start_point(nw)
        for worker in range(wp):
            role = (worker + rotation) % wp
            g = topo.stream_id(rank, role)
            places: list[tuple[int | None, Any, Any]]
            if mix is None:
                places = [(None, ds, starts[role])]
            else:
                _, _, positions = starts[role]
                places = [(i, d, positions[i]) for i, d in enumerate(ds.datasets)]
            for source, d, (epoch, position) in places:
                at = resume_at(d.layout(nw).view(epoch, g), g, epoch, position)
                rows.append(
                    {
                        "rank": rank,
                        "worker": worker,
                        "source": source,
                        "stream": g,
                        "epoch": at.epoch,
                        "position": at.position,
                        "chunk": at.chunk,
                        "episode": at.episode,
                        "frame": at.frame,
                        "line": at.line() + ("" if source is None else ds.resume_label(source)),
                    }
                )
    return {
        "checkpoint": str(ckpt),
        "step": checkpoint_step(ckpt),
        "saved": saved_topology,
        "resume": {"batch_size": cfg.batch_size, "num_workers": nw, "world_size": world},
        "stream": tuning,
        "mix": mix.to_dict() if mix is not None else None,
        "note": note,
        "streams": rows,
    }
