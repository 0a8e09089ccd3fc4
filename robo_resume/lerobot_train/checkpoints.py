"""Checkpoints of ``robo-resume train``: the robo_resume files beside lerobot's, every rank's
RNG state, and the atomic write (see :func:`save_atomic`)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..errors import ResumeStateError, describe
from ..state.resume import library_version as version
from .lock import LOCK_FILE, check_free, pid_alive
from .options import DATA_DIR, DATA_STATE, OPTIONS, RNG_RANK, MixOptions

SAVE_PAUSE_ENV = "ROBO_RESUME_TRAIN_SAVE_PAUSE"  # tests only: see pause_for_tests


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


LEFTOVER = re.compile(r"^\.(?:.+\.(?:partial|old)-|last\.)(\d+)$")  # names save_atomic hides


def leftover_pid(name: str) -> int | None:
    """The writer's PID in a hidden name :func:`save_atomic` makes (``.STEP.partial-PID``,
    ``.STEP.old-PID``, ``.last.PID``); None for any other name."""
    match = LEFTOVER.match(name)
    return int(match.group(1)) if match else None


def remove_leftovers(parent: Path) -> list[str]:
    """Remove what killed :func:`save_atomic` calls left in the checkpoints folder ``parent``;
    returns the names removed.

    Only the hidden names a save makes: ``.STEP.partial-PID`` and ``.STEP.old-PID`` folders and
    ``.last.PID`` links (never ``last``, which names a complete checkpoint), and only those of
    a dead writer or of this process. Call it only while holding the output directory's lock
    (:mod:`.lock`), which the main process, the only one that saves, takes before the first
    step: then a writer whose PID is dead cannot be writing. A name whose PID is alive and not
    this process's is left alone (a reused PID, or a run on another host whose lock was removed
    by hand).
    """
    removed = []
    for stale in sorted(parent.glob(".*")):
        pid = leftover_pid(stale.name)
        if pid is None or (pid != os.getpid() and pid_alive(pid)):
            continue
        if stale.is_symlink() or not stale.is_dir():
            stale.unlink(missing_ok=True)
        else:
            shutil.rmtree(stale, ignore_errors=True)
        removed.append(stale.name)
    return removed


def interrupted_first_save(output_dir: Path) -> list[str] | None:
    """The hidden names in ``output_dir/checkpoints`` if the folder holds no complete
    checkpoint: nothing in ``output_dir`` but its lock file and a ``checkpoints`` folder (if
    any) of hidden names a killed :func:`save_atomic` left. None otherwise (a checkpoint, a
    ``last`` link or any other file: a run that a new one would overwrite)."""
    names = []
    for entry in output_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.name != "checkpoints" or entry.is_symlink() or not entry.is_dir():
            return None
        for item in entry.iterdir():
            if leftover_pid(item.name) is None:
                return None
            names.append(item.name)
    return sorted(names)


@contextmanager
def fresh_start(cfg: Any) -> Iterator[None]:
    """Around lerobot's ``cfg.validate()``: a new run (``--resume`` false) into an existing
    ``--output_dir``.

    A live run's directory is refused naming that run (:func:`.lock.check_free`), before
    lerobot's check would advise resuming it. A directory holding no complete checkpoint (only
    the leftovers of a run killed during its first save, :func:`interrupted_first_save`) is
    accepted: lerobot refuses an existing directory so as not to overwrite a run, and there
    is none here to overwrite (the pipeline removes the leftovers once it holds the lock).
    lerobot's check is skipped by validating with no output directory, then putting it back
    (lerobot would otherwise choose a dated one, and nothing else in ``validate`` reads it).
    """
    out = cfg.output_dir
    if cfg.resume or not isinstance(out, Path) or not out.is_dir():
        yield
        return
    check_free(out)
    if interrupted_first_save(out) is None:
        yield  # lerobot refuses it: a run is there
        return
    cfg.output_dir = None
    try:
        yield
    finally:
        cfg.output_dir = out


def pause_for_tests(partial: Path) -> None:
    """Test hook, never set in normal use: with ``ROBO_RESUME_TRAIN_SAVE_PAUSE=PATH`` in the
    environment, a save stops once lerobot's files are in its partial folder ``partial``,
    prints ``save paused: PARTIAL`` to stderr and waits until the file ``PATH`` exists, then
    removes it and goes on. A test thereby holds a run mid-save (to start a second run
    beside it, or to kill it there) and releases one save per file it creates."""
    release = os.environ.get(SAVE_PAUSE_ENV)
    if not release:
        return
    print(f"save paused: {partial}", file=sys.stderr, flush=True)
    while not os.path.exists(release):
        time.sleep(0.02)
    os.unlink(release)


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
    files: dict[str, bytes] | None = None,
    samples: int | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """lerobot's ``save_checkpoint`` into a hidden sibling, then rename, then move ``last``.

    ``samples``: frames trained so far by all processes, across resumes (kept in the options
    file for the log's sample and epoch counts after a resume).
    ``data``: the ``--data.*`` flags a resume keeps (:meth:`.data_flags.DataOptions.to_saved`).

    Steps, each for a reason: (1) write everything into ``.STEP.partial-PID`` (a kill leaves
    only a hidden folder); (2) fsync every file and folder (the
    rename must not reach the disk before the data); (3) rename over an older ``STEP`` (a
    checkpoint of the same step, e.g. written again after a resume, is moved aside first);
    (4) replace ``last`` by renaming a new link over it (atomic, unlike unlink + symlink).
    A kill leaves at most hidden names behind: ``.STEP.partial-PID``, ``.STEP.old-PID`` (killed
    between the two renames of step 3; ``last`` still names an earlier, complete checkpoint)
    and ``.last.PID`` (killed before its rename); the run that next holds the output
    directory's lock removes those of dead writers, at its start and before every save
    (:func:`remove_leftovers`). ``files``: more files for ``training_state/robo_resume/``,
    name -> bytes (the per-step record, :mod:`.record`).
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
    pause_for_tests(tmp)
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
                "data": data,
            }
        )
    )
    for name, content in (files or {}).items():
        (ours / name).write_bytes(content)
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
