"""``robo-resume train``'s loop: lerobot-train's, with robo_resume's data path and checkpoints."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from pprint import pformat
from typing import Any

import torch

from ..keys import CURSOR_KEY
from .checkpoints import gather_rng, read_saved, remove_leftovers, restore_rng, save_atomic
from .data_flags import DataOptions
from .lock import RunLock
from .options import (
    DATA_DIR,
    INDEX_LOG_ENV,
    MixOptions,
    StreamOptions,
    TrainSetupError,
    resolve_stream,
    stream_line,
)
from .record import RunHeader, StepRecord
from .setup import (
    build_dataset,
    camera_keys,
    check_files_at_start,
    check_worker_context,
    counts,
    eval_loader,
    eval_split,
    evaluate,
    log_indices,
    policy_metadata,
    processors,
    resolve_data,
    resolve_mix,
    streamed_meta,
    validate,
    worker_logging,
)


# -- the pipeline ----------------------------------------------------------------------------
def train(
    cfg: Any,
    mix: MixOptions | None = None,
    stream: StreamOptions | None = None,
    data: DataOptions | None = None,
) -> None:
    """Run lerobot's training pipeline for ``cfg`` with robo_resume's data path (see module);
    ``mix``, ``stream`` and ``data``: the ``--mix.*``, ``--stream.*`` and ``--data.*`` flags
    (None: not given)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    from lerobot.common.train_utils import (
        get_step_checkpoint_dir,
        load_training_state,
        should_save_checkpoint,
    )
    from lerobot.optim.factory import make_optimizer_and_scheduler
    from lerobot.policies import make_policy
    from lerobot.scripts.lerobot_train import update_policy
    from lerobot.utils.logging_utils import AverageMeter, MetricsTracker
    from lerobot.utils.random_utils import set_seed
    from lerobot.utils.utils import format_big_number, init_logging, inside_slurm
    from tqdm import tqdm

    validate(cfg, mix)
    ddp_kwargs = DistributedDataParallelKwargs(find_unused_parameters=True)
    active = cfg.trainable_config
    precisions: dict[Any, str] = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}
    mixed = precisions.get(getattr(active, "dtype", None))
    accelerator = Accelerator(
        step_scheduler_with_optimizer=False,
        mixed_precision=mixed,
        kwargs_handlers=[ddp_kwargs],
        cpu=active.device == "cpu",
    )
    init_logging(accelerator=accelerator)
    log = logging.getLogger("robo_resume.train")
    main_process = accelerator.is_main_process
    rank, world = accelerator.process_index, accelerator.num_processes
    if main_process:
        logging.info("robo-resume train: lerobot's pipeline, robo_resume's data path")
        logging.info(pformat(cfg.to_dict()))
    lock = take_lock(Path(cfg.output_dir), main_process, world, log)  # before the policy
    if cfg.seed is not None:
        set_seed(cfg.seed, accelerator=accelerator)

    resume_dir = Path(cfg.checkpoint_path) if cfg.resume else None
    saved = read_saved(resume_dir) if resume_dir is not None else {}
    mix = resolve_mix(mix, saved.get("options"))
    check_worker_context(cfg, mix)  # fork and a remote dataset: refused before anything is built
    source_meta = streamed_meta(cfg) if mix is None else None  # meta/ only, cached
    if main_process and source_meta is not None:
        log.info(streaming_line(source_meta))
    data, overridden = (data or DataOptions()).resumed((saved.get("options") or {}).get("data"))
    if main_process:
        for note in overridden:
            log.info("resume: %s", note)
    mix = resolve_data(cfg, mix, data, log if main_process else None, source_meta)
    if main_process and mix is not None:
        logging.info(f"mix of {len(mix.sources())} datasets: {mix.to_dict()}")
    tuning = resolve_stream(stream, saved.get("options"), cfg.batch_size)
    if main_process:
        logging.info(stream_line(tuning))

    meta = policy_metadata(cfg, mix, data, source_meta)
    policy = make_policy(cfg=cfg.policy, ds_meta=meta, rename_map=cfg.rename_map)
    if cfg.peft is not None:
        from lerobot.utils.import_utils import require_package

        require_package("peft", extra="peft")
        policy = policy.wrap_with_peft(peft_cli_overrides=dataclasses.asdict(cfg.peft))
    accelerator.wait_for_everyone()
    preprocessor, postprocessor = processors(cfg, policy, meta, accelerator.device)
    optimizer, lr_scheduler = make_optimizer_and_scheduler(cfg, policy)

    step = 0
    if resume_dir is not None:
        step, optimizer, lr_scheduler = load_training_state(resume_dir, optimizer, lr_scheduler)
        if main_process:
            logging.info(f"Resuming from {resume_dir} at step {step}")
    drop_n = getattr(active, "drop_n_last_frames", 0) or 0
    if drop_n and main_process:
        log.warning(
            "the policy's drop_n_last_frames=%d is not applied: robo_resume streams every frame "
            "of every episode (action windows past an episode's end are padded, with "
            "<key>_is_pad set), while lerobot's sampler would leave the last %d frames of each "
            "episode out",
            drop_n,
            drop_n,
        )

    train_episodes, eval_episodes = eval_split(cfg, meta)
    if train_episodes is not None and eval_episodes is not None and main_process:
        logging.info(
            f"Train/eval split: {len(train_episodes)} train, {len(eval_episodes)} eval "
            f"(eval_split={cfg.dataset.eval_split})"
        )
    dataset, data_note = build_dataset(
        cfg,
        mix,
        meta,
        saved.get("data_state"),
        resume_dir,
        train_episodes,
        tuning,
        data,
        source_meta=source_meta,
    )
    if data.on_error == "raise":
        check_files_at_start(dataset)  # a missing file: refused now, not at step 2 in a worker
    if main_process:
        if data_note:
            log.warning(data_note)
        logging.info(f"Dataset: {dataset!r}")
    workers = cfg.num_workers
    loader_kw: dict[str, Any] = {
        "pin_memory": accelerator.device.type == "cuda",
        # the iterator's base seed comes from this generator, not from the global RNG (see 3.)
        "generator": torch.Generator().manual_seed(cfg.seed or 0),
        # lerobot 0.6 starts workers with spawn by default: they need their own log handler
        # for the streams' resume lines
        "worker_init_fn": worker_logging,
    }
    if workers > 0:
        loader_kw["prefetch_factor"] = cfg.prefetch_factor
        loader_kw["persistent_workers"] = cfg.persistent_workers
        if cfg.dataloader_multiprocessing_context:
            loader_kw["multiprocessing_context"] = cfg.dataloader_multiprocessing_context
    loader = dataset.dataloader(num_workers=workers, **loader_kw)
    tracker = dataset.tracker()
    record = None  # the per-step record (robo-resume audit); a mix has none
    if mix is None:
        loaded = StepRecord.load(resume_dir / "training_state" / DATA_DIR) if resume_dir else None
        record = loaded or StepRecord([], [])
        record.begin(
            RunHeader.of_run(
                dataset,
                first_step=step + 1,
                first_row=len(record.rows),
                num_workers=workers,
                tuning=tuning,
                resumed_from=resume_dir,
                start_state=saved.get("data_state"),
            )
        )
    # The loader is left out on purpose: the dataset is rank-aware already (see 1.)
    policy, optimizer, lr_scheduler = accelerator.prepare(policy, optimizer, lr_scheduler)
    batches = iter(loader)

    num_frames, num_episodes = counts(dataset)
    if main_process:
        n_learn = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        logging.info(f"Output dir: {cfg.output_dir}")
        logging.info(f"cfg.steps={cfg.steps} ({format_big_number(cfg.steps)})")
        logging.info(f"dataset.num_frames={num_frames} ({format_big_number(num_frames)})")
        logging.info(f"dataset.num_episodes={num_episodes}")
        logging.info(f"Effective batch size: {cfg.batch_size} x {world} = {cfg.batch_size * world}")
        logging.info(f"num_learnable_params={n_learn} ({format_big_number(n_learn)})")

    metrics = {
        "loss": AverageMeter("loss", ":.3f", reduction="mean"),
        "grad_norm": AverageMeter("grdn", ":.3f"),
        "lr": AverageMeter("lr", ":0.1e"),
        "update_s": AverageMeter("updt_s", ":.3f", reduction="max"),
        "dataloading_s": AverageMeter("data_s", ":.3f", reduction="max"),
        "samples_per_s": AverageMeter("smp/s", ":.0f"),
    }
    train_tracker = MetricsTracker(
        cfg.batch_size,
        num_frames,
        num_episodes,
        metrics,
        initial_step=step,
        accelerator=accelerator,
    )
    # lerobot counts samples as step * batch_size * processes, wrong once a resume changed the
    # batch size or the number of processes: count the frames trained instead, across resumes
    samples = samples_before(saved.get("options"), step, cfg.batch_size, world)
    set_progress(train_tracker, samples, num_frames, num_episodes)
    cameras = tuple(camera_keys(dataset))
    held_out = None
    if eval_episodes is not None and cfg.eval_steps > 0:
        held_out = eval_loader(cfg, meta, eval_episodes, rank, world, source_meta)
    index_log = os.environ.get(INDEX_LOG_ENV)
    if resume_dir is not None:
        restore_rng(resume_dir, rank, world, log)  # the last thing before the first step (3.)
    progbar = None
    if main_process:
        progbar = tqdm(
            total=cfg.steps - step, desc="Training", unit="step", disable=inside_slurm(), leave=True
        )
        logging.info(
            "Start offline training on a fixed dataset, with effective batch size: "
            f"{cfg.batch_size * world}"
        )
    while step < cfg.steps:
        start = time.perf_counter()
        raw = next(batches)
        if record is not None:
            record.add(step + 1, rank, raw[CURSOR_KEY])
        batch = tracker.consume(raw)
        # frames this step trained on (short with on_error skip); the ranks' batches are equal
        samples += (len(batch["index"]) if "index" in batch else cfg.batch_size) * world
        if index_log:
            log_indices(index_log, step + 1, rank, batch)
        for key in cameras:
            if key in batch and batch[key].dtype == torch.uint8:
                batch[key] = batch[key].to(dtype=torch.float32) / 255.0
        batch = preprocessor(batch)
        train_tracker.dataloading_s = time.perf_counter() - start
        train_tracker, _ = update_policy(
            train_tracker,
            policy,
            batch,
            optimizer,
            cfg.optimizer.grad_clip_norm,
            accelerator=accelerator,
            lr_scheduler=lr_scheduler,
        )
        step += 1
        if progbar is not None:
            progbar.update(1)
        train_tracker.step()
        set_progress(train_tracker, samples, num_frames, num_episodes)
        if cfg.log_freq > 0 and step % cfg.log_freq == 0:
            train_tracker.reduce_across_ranks()
            if main_process:
                t = train_tracker.update_s.avg + train_tracker.dataloading_s.avg
                if t > 0:
                    train_tracker.samples_per_s = cfg.batch_size * world / t
                logging.info(train_tracker)
            train_tracker.reset_averages()
        if held_out is not None and step % cfg.eval_steps == 0:
            eval_loss = evaluate(policy, held_out, preprocessor, cameras, accelerator)
            if main_process:
                logging.info(f"step {step}: eval_loss={eval_loss:.4f}")
        if cfg.save_checkpoint and should_save_checkpoint(step, cfg.save_freq, cfg.steps):
            data_state = tracker.state_dict()  # a collective under DDP: every rank calls it
            rng = gather_rng(world)
            files = record.files(world) if record is not None else None  # a collective too
            if main_process:
                logging.info(f"Checkpoint policy after step {step}")
                final = get_step_checkpoint_dir(cfg.output_dir, cfg.steps, step)
                save_atomic(
                    final,
                    step=step,
                    cfg=cfg,
                    policy=accelerator.unwrap_model(policy),
                    optimizer=optimizer,
                    scheduler=lr_scheduler,
                    preprocessor=preprocessor,
                    postprocessor=postprocessor,
                    world=world,
                    data_state=data_state,
                    rng=rng,
                    mix=mix,
                    stream=tuning,
                    files=files,
                    samples=samples,
                    data=data.to_saved(),
                )
            accelerator.wait_for_everyone()
    if progbar is not None:
        progbar.close()
    if main_process:
        logging.info("End of training")
        if getattr(active, "push_to_hub", False):
            unwrapped = accelerator.unwrap_model(policy)
            unwrapped.push_model_to_hub(cfg)
            preprocessor.push_to_hub(active.repo_id)
            postprocessor.push_to_hub(active.repo_id)
    del batches  # stop the workers before the process group goes
    accelerator.wait_for_everyone()
    if lock is not None:
        lock.release()
    accelerator.end_training()


def streaming_line(meta: Any) -> str:
    """The log line of a streamed dataset (``meta``: its ``DatasetMeta``): its URL (without
    credentials), the commit it is read at (Hub), where ``meta/`` is cached, and that nothing
    else is downloaded."""
    commit = getattr(meta.files, "revision", None)
    at = f" at commit {commit}" if commit else ""
    return (
        f"streaming {meta.files.shown}{at}: meta/ cached in {meta.root}, data and video "
        "files read as byte ranges (nothing else is downloaded)"
    )


def take_lock(output_dir: Path, main_process: bool, world: int, log: logging.Logger):
    """The main process takes ``output_dir``'s lock (:mod:`.lock`) and removes what saves of
    dead runs left in its checkpoints folder; every rank raises its refusal. Returns the lock
    (None on the other ranks)."""
    lock, error = None, None
    if main_process:
        try:
            lock = RunLock.acquire(output_dir)
        except TrainSetupError as exc:
            error = str(exc)
    if world > 1:  # the other ranks stop too, with the same message
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error], from_process=0)[0]
    if error is not None:
        raise TrainSetupError(error)
    if lock is None:
        return None
    if not lock.supported:
        log.warning(
            "the filesystem of %s does not support file locks: a second run started into this "
            "--output_dir would not be detected",
            output_dir,
        )
    if lock.stale_note():
        log.warning(lock.stale_note())
    checkpoints = output_dir / "checkpoints"
    removed = remove_leftovers(checkpoints) if checkpoints.is_dir() else []
    if removed:
        log.warning(
            "removed what interrupted saves of dead runs left in %s: %s",
            checkpoints,
            ", ".join(removed),
        )
    return lock


def samples_before(options: dict[str, Any] | None, step: int, batch_size: int, world: int) -> int:
    """Samples (frames, all processes) trained before the first step of this run.

    ``options``: the resumed checkpoint's robo_resume options (None: a new run, 0 samples),
    whose ``samples`` every save records; a checkpoint without it (plain lerobot-train, or
    written before the count was saved) gets lerobot's ``step * batch_size * world``, which is
    right when its run kept one batch size and number of processes.
    """
    if options is None:
        return step * batch_size * world
    saved = options.get("samples")
    return int(saved) if isinstance(saved, int) else step * batch_size * world


def set_progress(tracker: Any, samples: int, num_frames: int, num_episodes: int) -> None:
    """Set lerobot's ``MetricsTracker`` counters (``smpl``, ``ep``, ``epch`` of the log line)
    from the frames trained: ``episodes = samples / mean episode length`` and ``epochs =
    samples / num_frames``, lerobot's definitions with the true sample count."""
    tracker.samples = samples
    tracker.episodes = samples * num_episodes / num_frames
    tracker.epochs = samples / num_frames
