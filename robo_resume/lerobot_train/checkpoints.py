"""Checkpoints of ``robo-resume train``: the robo_resume files beside lerobot's, every rank's
RNG state, and the atomic write (see :func:`save_atomic`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..errors import ResumeStateError, describe
from ..state.resume import library_version as version
from .options import DATA_DIR, DATA_STATE, OPTIONS, RNG_RANK, MixOptions


def read_saved(ckpt: Path) -> dict[str, Any]:
    """The robo_resume files of a checkpoint (empty dict for a plain lerobot checkpoint)."""
    folder = ckpt / "training_state" / DATA_DIR
    out: dict[str, Any] = {}
    for key, name in (("data_state", DATA_STATE), ("options", OPTIONS)):
        path = folder / name
        if path.is_file():
            try:
                out[key] = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ResumeStateError(
                    describe(
                        "The checkpoint's robo_resume file is not valid JSON",
                        found=str(exc),
                        file=path,
                        fix="resume from an earlier checkpoint (checkpoints/<step>)",
                    )
                ) from exc
    return out


# -- randomness ----------------------------------------------------------------------------------
def gather_rng(world: int) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG state (python, numpy, torch), gathered on all ranks."""
    from lerobot.utils.random_utils import serialize_rng_state

    mine = serialize_rng_state()
    if world == 1:
        return [mine]
    import torch.distributed as dist

    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    return parts


def restore_rng(ckpt: Path, rank: int, world: int, log: logging.Logger) -> None:
    """Set this rank's RNG to what it was at the checkpoint (lerobot's file as a fallback)."""
    from lerobot.utils.random_utils import deserialize_rng_state, load_rng_state
    from safetensors.torch import load_file

    folder = ckpt / "training_state" / DATA_DIR
    mine = folder / RNG_RANK.format(rank=rank)
    saved_world = len(list(folder.glob(RNG_RANK.format(rank="*"))))
    if mine.is_file() and saved_world == world:
        deserialize_rng_state(load_file(mine))
        return
    load_rng_state(ckpt / "training_state")  # lerobot's: the main process's state
    if saved_world and saved_world != world and rank == 0:
        log.warning(
            "the checkpoint holds the RNG states of %d processes, this run has %d: every "
            "process continues from the main process's RNG state (dropout and noise draws "
            "are not those of an uninterrupted run; the data is still exactly once)",
            saved_world,
            world,
        )


# -- atomic checkpoints ---------------------------------------------------------------------------
def fsync_tree(folder: Path) -> None:
    for dirpath, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_leftovers(parent: Path) -> None:
    """Remove what killed :func:`save_atomic` calls left in the checkpoints folder ``parent``.

    Only the hidden names a save makes: ``.STEP.partial-PID`` and ``.STEP.old-PID`` folders and
    ``.last.PID`` links (never ``last``, which names a complete checkpoint). Only the main
    process saves, so none of them is in use.
    """
    for stale in (*parent.glob(".*.partial-*"), *parent.glob(".*.old-*"), *parent.glob(".last.*")):
        if stale.is_symlink() or not stale.is_dir():
            stale.unlink(missing_ok=True)
        else:
            shutil.rmtree(stale, ignore_errors=True)


def save_atomic(
    final: Path,
    *,
    step: int,
    cfg: Any,
    policy: Any,
    optimizer: Any,
    scheduler: Any,
    preprocessor: Any,
    postprocessor: Any,
    world: int,
    data_state: dict[str, Any],
    rng: list[dict[str, torch.Tensor]],
    mix: MixOptions | None,
    stream: dict[str, Any] | None = None,
    samples: int | None = None,
) -> None:
    """lerobot's ``save_checkpoint`` into a hidden sibling, then rename, then move ``last``.

    ``samples``: frames trained so far by all processes, across resumes (kept in the options
    file for the log's sample and epoch counts after a resume).

    Steps, each for a reason: (1) write everything into ``.STEP.partial-PID`` (a kill leaves
    only a hidden folder, removed by the next save); (2) fsync every file and folder (the
    rename must not reach the disk before the data); (3) rename over an older ``STEP`` (a
    checkpoint of the same step, e.g. written again after a resume, is moved aside first);
    (4) replace ``last`` by renaming a new link over it (atomic, unlike unlink + symlink).
    A kill leaves at most hidden names behind: ``.STEP.partial-PID``, ``.STEP.old-PID`` (killed
    between the two renames of step 3; ``last`` still names an earlier, complete checkpoint)
    and ``.last.PID`` (killed before its rename); every save first removes them all
    (:func:`remove_leftovers`).
    """
    from lerobot.common.train_utils import save_checkpoint
    from safetensors.torch import save_file

    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(parent)
    tmp = parent / f".{final.name}.partial-{os.getpid()}"
    save_checkpoint(
        checkpoint_dir=tmp,
        step=step,
        cfg=cfg,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        preprocessor=preprocessor,
        postprocessor=postprocessor,
        num_processes=world,
        batch_size=cfg.batch_size,
    )
    ours = tmp / "training_state" / DATA_DIR
    ours.mkdir(parents=True, exist_ok=True)
    (ours / DATA_STATE).write_text(json.dumps(data_state, indent=1))
    (ours / OPTIONS).write_text(
        json.dumps(
            {
                "mix": mix.to_dict() if mix else None,
                "stream": stream,
                "library": version(),
                "samples": samples,
            }
        )
    )
    for r, state in enumerate(rng):
        save_file({k: v.contiguous() for k, v in state.items()}, ours / RNG_RANK.format(rank=r))
    fsync_tree(tmp)
    if final.exists():
        old = parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(parent)
    link = parent / "last"
    new_link = parent / f".last.{os.getpid()}"
    if new_link.is_symlink() or new_link.exists():
        new_link.unlink()
    new_link.symlink_to(final.name)
    os.replace(new_link, link)
    fsync_dir(parent)
