"""``robo-resume train``: lerobot-train's pipeline with robo_resume as its data path.

What it keeps from lerobot (0.6.x, imported from the installed package, not copied): the
configuration (``TrainPipelineConfig`` and every ``--flag`` of ``lerobot-train``, parsed by
lerobot's own parser), the factories (policy, pre/post-processors, optimizer, scheduler),
``update_policy``, the metrics, logging and progress bar, and the checkpoint layout
(``OUTPUT_DIR/checkpoints/STEP/{pretrained_model,training_state}`` plus the ``last`` link), so
lerobot's own tools load what it writes.

What it replaces:

1. **The data path.** A :class:`~robo_resume.ChunkedEpisodeDataset` (or, with ``--mix.*``, a
   :class:`~robo_resume.mix.MixedDataset`) in infinite mode with ``image_dtype="uint8"`` (what
   lerobot's trainer asks of ``LeRobotDataset`` with ``return_uint8=True``), read through
   ``ds.dataloader()``. The loader is never passed to ``accelerator.prepare``: the dataset is
   already rank-aware (rank and world size from ``torch.distributed``), and accelerate's
   re-sharding of an iterable would lose frames.
2. **Resume.** Each checkpoint also holds ``training_state/robo_resume/``: the data state
   (the tracker's :class:`~robo_resume.ResumeState` of all ranks, or the mix state), the RNG
   state of every rank, and the data options. ``--resume=true`` continues the data exactly
   where the checkpoint's step left it; with another ``--num_workers``, ``--batch_size`` or
   number of processes the interrupted epoch's leftover is re-partitioned (elastic resume,
   :mod:`robo_resume.elastic`). A checkpoint written by plain ``lerobot-train`` resumes with a
   warning saying what is exact and what is not.
3. **Randomness.** lerobot restores the RNG state and then builds its DataLoader, whose
   iterator draws its base seed from the global torch RNG: the resumed run's dropout and VAE
   noise are then one draw off, and the final weights differ. Here the loader draws from its
   own generator, and every rank's RNG state is restored as the very last thing before the
   first resumed step, so a run killed and resumed on CPU ends with the same weights, bit for
   bit, as the uninterrupted run.
4. **Atomic checkpoints.** lerobot writes a checkpoint in place and then moves the ``last``
   link; a kill in between leaves a folder without ``train_config.json``. Here a checkpoint is
   written into a hidden sibling folder, flushed to disk, renamed into place, and only then
   ``last`` is replaced (an atomic rename of a new link), so ``last`` always names a complete
   checkpoint.

Flags of its own (everything else is lerobot-train's):

- ``--mix.roots=A,B`` (or ``--mix.repo_ids=x/a,y/b``) and ``--mix.weights=1,3``: train on
  several datasets at once, batches drawn by weight, each source resumed from its own cursors
  (lerobot refuses several datasets). The policy's features come from the first source; the
  normalisation statistics are aggregated over all sources (``aggregate_stats``). Give
  ``--dataset.repo_id`` as a name for the run (lerobot requires it).

For tests and audits, ``ROBO_RESUME_TRAIN_INDEX_LOG=PATH`` appends one JSON line per step and
rank with the ``index`` values the step trained on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from pprint import pformat
from typing import Any

import torch

from .errors import ResumeStateError, RoboResumeError, describe

__all__ = ["MixOptions", "TrainSetupError", "main", "split_args"]

DATA_DIR = "robo_resume"  # inside a checkpoint's training_state/
DATA_STATE = "data_state.json"
OPTIONS = "options.json"
RNG_RANK = "rng_state_rank{rank}.safetensors"
INDEX_LOG_ENV = "ROBO_RESUME_TRAIN_INDEX_LOG"
MIN_LEROBOT = (0, 6)
_OWN_PREFIX = "--mix."


class TrainSetupError(RoboResumeError, ValueError):
    """A ``robo-resume train`` invocation that cannot run: a flag, a checkpoint or the setup."""


@dataclasses.dataclass(frozen=True)
class MixOptions:
    """The ``--mix.*`` flags: several datasets, drawn by weight (empty: one dataset).

    Attributes:
        roots: dataset folders, one per source.
        repo_ids: Hub ids, one per source (instead of, or beside, ``roots``).
        weights: one positive weight per source (default: all 1).
    """

    roots: tuple[str, ...] = ()
    repo_ids: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        n = max(len(self.roots), len(self.repo_ids))
        for name, values in (("roots", self.roots), ("repo_ids", self.repo_ids)):
            if values and len(values) != n:
                raise TrainSetupError(
                    describe(
                        f"--mix.{name} gives {len(values)} sources",
                        expected=f"one entry per source ({n})",
                        found=",".join(values),
                        fix="give --mix.roots and --mix.repo_ids the same number of entries",
                    )
                )
        if self.weights and len(self.weights) != n:
            raise TrainSetupError(
                describe(
                    "--mix.weights needs one weight per source",
                    expected=f"{n} weights",
                    found=",".join(map(str, self.weights)),
                    fix="e.g. --mix.weights=1,3 for two sources",
                )
            )
        if self.weights and not self.roots and not self.repo_ids:
            raise TrainSetupError(
                describe(
                    "--mix.weights without sources",
                    fix="name the sources with --mix.roots=A,B (or --mix.repo_ids=x/a,y/b)",
                )
            )

    @property
    def enabled(self) -> bool:
        """True when the flags name sources (a mix), False for one dataset."""
        return bool(self.roots or self.repo_ids)

    def sources(self) -> list[dict[str, Any]]:
        """One ``{"root", "repo_id", "weight"}`` per source."""
        n = max(len(self.roots), len(self.repo_ids))
        return [
            {
                "root": self.roots[i] if self.roots else None,
                "repo_id": self.repo_ids[i] if self.repo_ids else None,
                "weight": float(self.weights[i]) if self.weights else 1.0,
            }
            for i in range(n)
        ]

    def to_dict(self) -> dict[str, list]:
        """JSON-safe form (saved in every checkpoint)."""
        return {
            "roots": list(self.roots),
            "repo_ids": list(self.repo_ids),
            "weights": list(self.weights),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MixOptions:
        """Inverse of :meth:`to_dict`."""
        return cls(
            roots=tuple(data.get("roots") or ()),
            repo_ids=tuple(data.get("repo_ids") or ()),
            weights=tuple(float(w) for w in data.get("weights") or ()),
        )


def split_args(argv: Sequence[str]) -> tuple[MixOptions | None, list[str]]:
    """Split ``argv`` into the ``--mix.*`` flags (None if absent) and lerobot-train's flags."""
    own: dict[str, str] = {}
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith(_OWN_PREFIX):
            name, eq, value = a[len(_OWN_PREFIX) :].partition("=")
            if not eq:
                if i + 1 >= len(args):
                    raise TrainSetupError(describe(f"{a} needs a value", fix=f"{a}=VALUE"))
                value, i = args[i + 1], i + 1
            if name not in ("roots", "repo_ids", "weights"):
                raise TrainSetupError(
                    describe(
                        f"Unknown flag {a.split('=')[0]}",
                        expected="--mix.roots, --mix.repo_ids or --mix.weights",
                        found=a,
                        fix="see `robo-resume train --help` and the README's lerobot section",
                    )
                )
            own[name] = value
        else:
            rest.append(a)
        i += 1
    if not own:
        return None, rest
    items = {k: tuple(x.strip() for x in v.split(",") if x.strip()) for k, v in own.items()}
    try:
        weights = tuple(float(w) for w in items.get("weights", ()))
    except ValueError:
        raise TrainSetupError(
            describe("--mix.weights must be numbers", found=own["weights"], fix="--mix.weights=1,3")
        ) from None
    if any(not w > 0 for w in weights):
        raise TrainSetupError(
            describe(
                "--mix.weights must be positive", found=own["weights"], fix="--mix.weights=1,3"
            )
        )
    return MixOptions(items.get("roots", ()), items.get("repo_ids", ()), weights), rest


# -- entry point ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``robo-resume train ARGS``: returns the exit code (0 done, 2 a setup or input error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        mix, lerobot_args = split_args(argv)
        _check_config_path(lerobot_args)
        _require_lerobot()
    except RoboResumeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from lerobot.configs import parser
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.scripts import lerobot_train  # registers the policy, env and optimizer configs
    from lerobot.utils.import_utils import register_third_party_plugins

    register_third_party_plugins()
    del lerobot_train

    def run(cfg):
        return train(cfg, mix)

    run.__annotations__ = {"cfg": TrainPipelineConfig}  # what lerobot's parser dispatches on
    saved_argv = sys.argv
    sys.argv = ["robo-resume train", *lerobot_args]  # lerobot's parser reads sys.argv
    try:
        parser.wrap()(run)()
    except RoboResumeError as exc:
        logging.getLogger(__name__).debug("setup error", exc_info=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved_argv
    return 0


def _check_config_path(args: Sequence[str]) -> None:
    """A local ``--config_path`` that does not exist: our error before lerobot's traceback."""
    value = None
    for i, a in enumerate(args):
        if a.startswith("--config_path="):
            value = a.split("=", 1)[1]
        elif a == "--config_path" and i + 1 < len(args):
            value = args[i + 1]
    if not value:
        return
    path = Path(value)
    local = path.is_absolute() or value.startswith(".") or value.endswith((".json", ".yaml"))
    if local and not path.exists():
        hint = ""
        for parent in path.parents:
            if parent.name == "checkpoints" and parent.is_dir():
                names = sorted(p.name for p in parent.iterdir() if not p.name.startswith("."))
                hint = f" ({parent} holds: {', '.join(names) or 'nothing'})"
                break
        raise TrainSetupError(
            describe(
                "Cannot resume: the checkpoint named by --config_path is missing",
                found=f"no file {path}{hint}",
                fix="pass --config_path=OUTPUT_DIR/checkpoints/last/pretrained_model/"
                "train_config.json of the run to resume (`ls OUTPUT_DIR/checkpoints`)",
            )
        )


def _require_lerobot() -> None:
    try:
        import lerobot
        import lerobot.datasets  # needs lerobot[dataset]
    except ImportError as exc:
        raise TrainSetupError(
            describe(
                "robo-resume train needs lerobot 0.6 with its dataset and training extras",
                found=f"ImportError: {exc}",
                fix='pip install "robo_resume[lerobot]" (lerobot[dataset,training]>=0.6.1,<0.7)',
            )
        ) from exc
    version = tuple(int(x) for x in lerobot.__version__.split(".")[:2] if x.isdigit())
    if version < MIN_LEROBOT:
        raise TrainSetupError(
            describe(
                "robo-resume train drives lerobot 0.6's trainer pieces",
                expected="lerobot >= 0.6",
                found=f"lerobot {lerobot.__version__}",
                fix='pip install "robo_resume[lerobot]"',
            )
        )


# -- the pipeline ----------------------------------------------------------------------------
def train(cfg: Any, mix: MixOptions | None = None) -> None:
    """Run lerobot's training pipeline for ``cfg`` with robo_resume's data path (see module)."""
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

    _validate(cfg, mix)
    ddp_kwargs = DistributedDataParallelKwargs(find_unused_parameters=True)
    active = cfg.trainable_config
    mixed = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}.get(
        getattr(active, "dtype", None)
    )
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
    if cfg.seed is not None:
        set_seed(cfg.seed, accelerator=accelerator)

    resume_dir = Path(cfg.checkpoint_path) if cfg.resume else None
    saved = _read_saved(resume_dir) if resume_dir is not None else {}
    mix = _resolve_mix(mix, saved.get("options"))
    if main_process and mix is not None:
        logging.info(f"mix of {len(mix.sources())} datasets: {mix.to_dict()}")

    meta = _policy_metadata(cfg, mix)
    policy = make_policy(cfg=cfg.policy, ds_meta=meta, rename_map=cfg.rename_map)
    if cfg.peft is not None:
        from lerobot.utils.import_utils import require_package

        require_package("peft", extra="peft")
        policy = policy.wrap_with_peft(peft_cli_overrides=dataclasses.asdict(cfg.peft))
    accelerator.wait_for_everyone()
    preprocessor, postprocessor = _processors(cfg, policy, meta, accelerator.device)
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

    train_episodes, eval_episodes = _eval_split(cfg, meta)
    if eval_episodes is not None and main_process:
        logging.info(
            f"Train/eval split: {len(train_episodes)} train, {len(eval_episodes)} eval "
            f"(eval_split={cfg.dataset.eval_split})"
        )
    dataset, data_note = _make_dataset(
        cfg, mix, meta, saved.get("data_state"), resume_dir, train_episodes
    )
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
        "worker_init_fn": _worker_logging,
    }
    if workers > 0:
        loader_kw["prefetch_factor"] = cfg.prefetch_factor
        loader_kw["persistent_workers"] = cfg.persistent_workers
        if cfg.dataloader_multiprocessing_context:
            loader_kw["multiprocessing_context"] = cfg.dataloader_multiprocessing_context
    loader = dataset.dataloader(num_workers=workers, **loader_kw)
    tracker = dataset.tracker()
    # The loader is left out on purpose: the dataset is rank-aware already (see 1.)
    policy, optimizer, lr_scheduler = accelerator.prepare(policy, optimizer, lr_scheduler)
    batches = iter(loader)

    num_frames, num_episodes = _counts(dataset)
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
    camera_keys = tuple(_camera_keys(dataset))
    eval_loader = None
    if eval_episodes is not None and cfg.eval_steps > 0:
        eval_loader = _eval_loader(cfg, meta, eval_episodes, rank, world)
    index_log = os.environ.get(INDEX_LOG_ENV)
    if resume_dir is not None:
        _restore_rng(resume_dir, rank, world, log)  # the last thing before the first step (3.)
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
        batch = tracker.consume(next(batches))
        if index_log:
            _log_indices(index_log, step + 1, rank, batch)
        for key in camera_keys:
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
        if cfg.log_freq > 0 and step % cfg.log_freq == 0:
            train_tracker.reduce_across_ranks()
            if main_process:
                t = train_tracker.update_s.avg + train_tracker.dataloading_s.avg
                if t > 0:
                    train_tracker.samples_per_s = cfg.batch_size * world / t
                logging.info(train_tracker)
            train_tracker.reset_averages()
        if eval_loader is not None and step % cfg.eval_steps == 0:
            eval_loss = _evaluate(policy, eval_loader, preprocessor, camera_keys, accelerator)
            if main_process:
                logging.info(f"step {step}: eval_loss={eval_loss:.4f}")
        if cfg.save_checkpoint and should_save_checkpoint(step, cfg.save_freq, cfg.steps):
            data_state = tracker.state_dict()  # a collective under DDP: every rank calls it
            rng = _gather_rng(world)
            if main_process:
                logging.info(f"Checkpoint policy after step {step}")
                final = get_step_checkpoint_dir(cfg.output_dir, cfg.steps, step)
                _save_atomic(
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
    accelerator.end_training()


# -- setup helpers ---------------------------------------------------------------------------------
def _validate(cfg: Any, mix: MixOptions | None = None) -> None:
    """lerobot's ``cfg.validate()``, its errors made ours, and the flags we cannot honour."""
    try:
        cfg.validate()
    except FileExistsError as exc:
        raise TrainSetupError(
            describe(
                "The output directory exists and --resume is false",
                found=str(exc).split(" already exists")[0].replace("Output directory ", ""),
                fix="resume it with --resume=true --config_path=OUTPUT_DIR/checkpoints/last/"
                "pretrained_model/train_config.json, or choose a new --output_dir",
            )
        ) from exc
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        if getattr(cfg, "resume", False) or "config_path" in str(exc):
            raise TrainSetupError(
                describe(
                    "Cannot resume: the checkpoint named by --config_path is missing or incomplete",
                    found=f"{type(exc).__name__}: {exc}",
                    fix="pass --config_path=OUTPUT_DIR/checkpoints/last/pretrained_model/"
                    "train_config.json of the run to resume (`ls OUTPUT_DIR/checkpoints`)",
                )
            ) from exc
        raise
    if cfg.resume:
        ckpt = Path(cfg.checkpoint_path)
        if not (ckpt / "training_state").is_dir():
            raise TrainSetupError(
                describe(
                    "Cannot resume: the checkpoint has no training_state folder",
                    expected=f"{ckpt}/training_state (written with every checkpoint)",
                    found="no such folder",
                    fix="point --config_path at a complete checkpoint, e.g. "
                    "OUTPUT_DIR/checkpoints/last/pretrained_model/train_config.json",
                )
            )
    refuse = []
    if getattr(cfg, "is_reward_model_training", False):
        refuse.append(("--reward_model.*", "robo-resume train trains policies"))
    if cfg.dataset.streaming:
        refuse.append(("--dataset.streaming=true", "robo_resume always streams; drop the flag"))
    if getattr(cfg.dataset, "eval_split", 0.0) and mix is not None:
        refuse.append(
            (
                f"--dataset.eval_split={cfg.dataset.eval_split} with --mix.*",
                "hold episodes out per source (a seeded split, robo_resume.splits) instead",
            )
        )
    if getattr(cfg, "env", None) is not None and getattr(cfg, "env_eval_freq", 0) > 0:
        refuse.append(("--env.*", "evaluate the checkpoints with lerobot-eval"))
    if getattr(cfg, "sample_weighting", None) is not None:
        refuse.append(("--sample_weighting.*", "not wired into robo-resume train yet"))
    if refuse:
        flag, fix = refuse[0]
        raise TrainSetupError(
            describe(
                f"robo-resume train does not support {flag}",
                found=", ".join(f for f, _ in refuse),
                fix=fix,
            )
        )


def _read_saved(ckpt: Path) -> dict[str, Any]:
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


def _resolve_mix(flags: MixOptions | None, saved: dict[str, Any] | None) -> MixOptions | None:
    saved_mix = MixOptions.from_dict(saved["mix"]) if saved and saved.get("mix") else None
    if flags is None:
        return saved_mix if saved_mix and saved_mix.enabled else None
    return flags if flags.enabled else None


def _policy_metadata(cfg: Any, mix: MixOptions | None) -> Any:
    """lerobot's ``LeRobotDatasetMetadata`` the policy is built from (stats over a mix)."""
    from lerobot.datasets import LeRobotDatasetMetadata
    from lerobot.utils.constants import IMAGENET_STATS

    if mix is not None:
        first = mix.sources()[0]
        if cfg.dataset.root is None and first["root"] is not None:
            cfg.dataset.root = first["root"]
    try:
        meta = LeRobotDatasetMetadata(
            cfg.dataset.repo_id, root=cfg.dataset.root, revision=cfg.dataset.revision
        )
    except Exception as exc:
        if type(exc).__name__ == "BackwardCompatibilityError":
            raise TrainSetupError(
                describe(
                    "lerobot 0.6 builds the policy from v3.0 metadata only, and this dataset "
                    "is in an older format",
                    found=str(exc).strip().splitlines()[0],
                    file=cfg.dataset.root,
                    fix="convert it (python -m lerobot.scripts.convert_dataset_v21_to_v30), or, "
                    "in a mix, name a v3.0 dataset first in --mix.roots (the other sources may "
                    "be v2.1)",
                )
            ) from exc
        raise TrainSetupError(
            describe(
                "lerobot could not read the dataset's metadata",
                found=f"{type(exc).__name__}: {exc}",
                file=cfg.dataset.root,
                fix="check --dataset.repo_id and --dataset.root (a folder holding meta/info.json)",
            )
        ) from exc
    if mix is not None and len(mix.sources()) > 1:
        from lerobot.datasets.compute_stats import aggregate_stats

        from .format.metadata import load_metadata
        from .hub import resolve_dataset

        stats = [meta.stats]
        for s in mix.sources()[1:]:  # robo_resume reads v2.1 sources too, lerobot 0.6 does not
            if s["root"] is not None and (Path(s["root"]) / "meta").is_dir():
                other = load_metadata(s["root"])
            else:
                other = resolve_dataset(s["repo_id"], root=s["root"])[1]
            stats.append(_stats_arrays(other.stats))
        meta.stats = aggregate_stats(stats)
    if cfg.dataset.use_imagenet_stats:
        depth = set(getattr(meta, "depth_keys", ()) or ())
        for key in meta.camera_keys:
            if key in depth:
                continue
            for name, value in IMAGENET_STATS.items():
                meta.stats[key][name] = torch.tensor(value, dtype=torch.float32)
    return meta


def _stats_arrays(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """stats.json values (nested lists) as numpy arrays, as lerobot's metadata holds them."""
    import numpy as np

    return {k: {n: np.asarray(v) for n, v in d.items()} for k, d in stats.items()}


def _processors(cfg: Any, policy: Any, meta: Any, device: torch.device):
    """lerobot-train's processor set-up (fresh, from a pretrained policy, or on resume)."""
    from lerobot.policies import make_pre_post_processors

    active = cfg.trainable_config
    path = active.pretrained_path
    kwargs: dict[str, Any] = {}
    if (path and not cfg.resume) or not path:
        kwargs["dataset_stats"] = meta.stats
    if path is not None:
        pre = {
            "device_processor": {"device": device.type},
            "normalizer_processor": {
                "features": {**policy.config.input_features, **policy.config.output_features},
                "norm_map": policy.config.normalization_mapping,
            },
            "rename_observations_processor": {"rename_map": cfg.rename_map},
        }
        post = {
            "unnormalizer_processor": {
                "features": policy.config.output_features,
                "norm_map": policy.config.normalization_mapping,
            },
        }
        if not cfg.resume:
            pre["normalizer_processor"]["stats"] = meta.stats
            post["unnormalizer_processor"]["stats"] = meta.stats
        kwargs["preprocessor_overrides"] = pre
        kwargs["postprocessor_overrides"] = post
    return make_pre_post_processors(
        policy_cfg=cfg.policy,
        pretrained_path=path,
        pretrained_revision=getattr(cfg.policy, "pretrained_revision", None),
        **kwargs,
    )


def _image_transforms(cfg: Any) -> Callable | None:
    if not cfg.dataset.image_transforms.enable:
        return None
    from lerobot.transforms import ImageTransforms

    return ImageTransforms(cfg.dataset.image_transforms)


def _make_dataset(
    cfg: Any,
    mix: MixOptions | None,
    meta: Any,
    state: dict[str, Any] | None,
    resume_dir: Path | None,
    episodes: list[int] | None = None,
) -> tuple[Any, str | None]:
    """The robo_resume dataset for ``cfg`` and, on resume, a note on what is not exact."""
    from lerobot.datasets.factory import resolve_delta_timestamps

    from .dataset import ChunkedEpisodeDataset
    from .mix import MixedDataset, MixSource

    delta = resolve_delta_timestamps(cfg.trainable_config, meta)
    common: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "seed": cfg.seed or 0,
        "delta_timestamps": delta,
        "image_transforms": _image_transforms(cfg),
        "image_dtype": "uint8",  # lerobot's trainer: return_uint8=True, converted per batch
    }
    note = None
    if resume_dir is not None and state is None:
        note = (
            f"the checkpoint {resume_dir} has no robo_resume data state (written by plain "
            "lerobot-train, or before robo-resume train): the policy, optimizer, scheduler, step "
            "and RNG state resume exactly, but the data starts a new robo_resume epoch 0, so "
            "frames that the interrupted run already trained on in its last epoch can be seen "
            "again, and others only in the next epoch. Checkpoints written from now on resume "
            "the data exactly."
        )
    try:
        if mix is None:
            ds = ChunkedEpisodeDataset(
                cfg.dataset.root,
                repo_id=None if cfg.dataset.root else cfg.dataset.repo_id,
                revision=cfg.dataset.revision,
                episodes=episodes if episodes is not None else cfg.dataset.episodes,
                infinite=True,
                resume_state=state,
                **common,
            )
        else:
            sources = [
                MixSource(root=s["root"], repo_id=s["repo_id"], weight=s["weight"])
                for s in mix.sources()
            ]
            ds = MixedDataset(sources, exhausted="cycle", resume_state=state, **common)
    except ResumeStateError as exc:
        raise ResumeStateError(
            f"{exc}\nThe checkpoint {resume_dir} holds the data state of another run's data "
            "(dataset, episodes, seed or data options differ, see above). Resume with that run's "
            "dataset and options (its pretrained_model/train_config.json has them), or start a "
            "new run with a new --output_dir."
        ) from exc
    return ds, note


def _eval_split(cfg: Any, meta: Any) -> tuple[list[int] | None, list[int] | None]:
    """lerobot-train's ``--dataset.eval_split``: the last ceil(n * split) episodes per task."""
    import math

    split = float(getattr(cfg.dataset, "eval_split", 0.0) or 0.0)
    if split == 0.0:
        return None, None
    base = cfg.dataset.episodes or list(range(meta.total_episodes))
    tasks = meta.episodes["tasks"]
    by_task: dict[str, list[int]] = {}
    for e in base:
        by_task.setdefault(tasks[e][0] if tasks[e] else "", []).append(e)
    train_eps: list[int] = []
    eval_eps: list[int] = []
    for eps in by_task.values():
        n_eval = math.ceil(len(eps) * split)
        train_eps += eps[: len(eps) - n_eval]
        eval_eps += eps[len(eps) - n_eval :]
    if not train_eps:
        raise TrainSetupError(
            describe(
                f"--dataset.eval_split={split} leaves no training episode",
                found=f"{len(base)} episodes in {len(by_task)} tasks",
                fix="use a smaller --dataset.eval_split",
            )
        )
    return sorted(train_eps), sorted(eval_eps)


def _eval_loader(cfg: Any, meta: Any, episodes: list[int], rank: int, world: int) -> Any:
    """Every held-out frame once per evaluation (this rank's share under DDP), uint8 images."""
    from lerobot.datasets.factory import resolve_delta_timestamps

    from .reader import LeRobotReader

    reader = LeRobotReader(
        cfg.dataset.root,
        repo_id=None if cfg.dataset.root else cfg.dataset.repo_id,
        revision=cfg.dataset.revision,
        episodes=episodes,
        delta_timestamps=resolve_delta_timestamps(cfg.trainable_config, meta),
        image_dtype="uint8",
    )
    part = torch.utils.data.Subset(reader, range(rank, len(reader), world))
    return torch.utils.data.DataLoader(
        part, batch_size=cfg.batch_size, shuffle=False, num_workers=0, drop_last=False
    )


def _evaluate(policy: Any, loader: Any, preprocessor: Any, cameras: Sequence[str], acc: Any):
    """lerobot-train's eval pass: mean loss over the held-out frames, reduced over ranks.

    The torch RNG state is put back afterwards, so that turning evaluation on or changing
    ``--eval_steps`` does not change the random draws of the training steps.
    """
    rng = torch.get_rng_state()
    policy.eval()
    total, n = 0.0, 0
    with torch.no_grad(), acc.autocast():
        for batch in loader:
            for key in cameras:
                if key in batch and batch[key].dtype == torch.uint8:
                    batch[key] = batch[key].to(dtype=torch.float32) / 255.0
            loss, _ = policy.forward(preprocessor(batch))
            total += loss.item()
            n += 1
    policy.train()
    torch.set_rng_state(rng)
    value = torch.tensor(total / max(n, 1), device=acc.device)
    return acc.reduce(value, reduction="mean").item()


def _counts(dataset: Any) -> tuple[int, int]:
    parts = getattr(dataset, "datasets", None) or [dataset]
    frames = sum(int(d.fingerprint["total_frames"]) for d in parts)
    episodes = sum(len(d.episodes) for d in parts)
    return frames, episodes


def _camera_keys(dataset: Any) -> Sequence[str]:
    keys = getattr(dataset, "camera_keys", None)
    return keys if keys is not None else dataset.meta.camera_keys


def _worker_logging(worker_id: int) -> None:
    """DataLoader worker start: lerobot's log format where the worker has no handler (spawn)."""
    if not logging.getLogger().handlers:
        from lerobot.utils.utils import init_logging

        init_logging()


def _log_indices(path: str, step: int, rank: int, batch: dict[str, Any]) -> None:
    line = json.dumps({"step": step, "rank": rank, "index": batch["index"].tolist()})
    with open(f"{path}.rank{rank}", "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- randomness ----------------------------------------------------------------------------------
def _gather_rng(world: int) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG state (python, numpy, torch), gathered on all ranks."""
    from lerobot.utils.random_utils import serialize_rng_state

    mine = serialize_rng_state()
    if world == 1:
        return [mine]
    import torch.distributed as dist

    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    return parts


def _restore_rng(ckpt: Path, rank: int, world: int, log: logging.Logger) -> None:
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
def _fsync_tree(folder: Path) -> None:
    for dirpath, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_atomic(
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
) -> None:
    """lerobot's ``save_checkpoint`` into a hidden sibling, then rename, then move ``last``.

    Steps, each for a reason: (1) write everything into ``.STEP.partial-PID`` (a kill leaves
    only a hidden folder, removed by the next save); (2) fsync every file and folder (the
    rename must not reach the disk before the data); (3) rename over an older ``STEP`` (a
    checkpoint of the same step, e.g. written again after a resume, is moved aside first);
    (4) replace ``last`` by renaming a new link over it (atomic, unlike unlink + symlink).
    """
    from lerobot.common.train_utils import save_checkpoint
    from safetensors.torch import save_file

    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(".*.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
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
        json.dumps({"mix": mix.to_dict() if mix else None, "library": _library_version()})
    )
    for r, state in enumerate(rng):
        save_file({k: v.contiguous() for k, v in state.items()}, ours / RNG_RANK.format(rank=r))
    _fsync_tree(tmp)
    if final.exists():
        old = parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(parent)
    link = parent / "last"
    new_link = parent / f".last.{os.getpid()}"
    if new_link.is_symlink() or new_link.exists():
        new_link.unlink()
    new_link.symlink_to(final.name)
    os.replace(new_link, link)
    _fsync_dir(parent)


def _library_version() -> str:
    from .state import library_version

    return library_version()
