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
   :mod:`robo_resume.index.elastic`). A checkpoint written by plain ``lerobot-train`` resumes with a
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
5. **One run per output directory.** The main process locks ``OUTPUT_DIR/.robo-resume-train.lock``
   before the policy is built (:mod:`.lock`): a second run into the directory of a live run,
   fresh or ``--resume=true``, is refused naming that run's PID, host and start time; the lock
   of a killed run is taken over with a WARNING. Only the run holding the lock removes the
   hidden folders of interrupted saves, and only those of dead writers. A new run into an
   existing ``--output_dir`` that holds no complete checkpoint (a run killed during its first
   save) is accepted, where lerobot would refuse any existing directory; resuming such a run
   says there is no checkpoint yet and to start it fresh.
6. **A per-step record.** Each checkpoint also holds, per step and rank, the stream positions
   the step consumed (:mod:`.record`), continued by every resume; ``robo-resume audit
   OUTPUT_DIR`` (:mod:`.audit`) proves from it that every frame was trained exactly once.

Flags of its own (everything else is lerobot-train's):

- ``--mix.roots=A,B`` (or ``--mix.repo_ids=x/a,y/b``) and ``--mix.weights=1,3``: train on
  several datasets at once, batches drawn by weight, each source resumed from its own cursors
  (lerobot refuses several datasets). The policy's features come from the first source; the
  normalisation statistics are aggregated over all sources (``aggregate_stats``). Give
  ``--dataset.repo_id`` as a name for the run (lerobot requires it).
- ``--stream.order=shuffle|interleave``, ``--stream.shuffle_frames=N``,
  ``--stream.interleave=N`` and ``--stream.interleave_order=spread|rounds|random``: how each
  stream orders its frames (``StreamTuning``). A new run gets the library's default, the
  shuffle order, which trains close to lerobot's shuffled sampler
  (:func:`~robo_resume.lerobot_train.options.resolve_stream`); the interleave order (an
  interleave flag alone chooses it) is faster with ``--num_workers=0`` at a measured cost in
  training quality. A checkpoint keeps its run's values and resumes with them, no flags needed
  (one written before ``--stream.order`` existed: the interleave order it was saved with).

- ``--data.on_error=raise|skip``, ``--data.resume_strict=true|false``, ``--data.features=JSON``
  (renames and drops of a dataset's keys; ``--mix.features`` per source in a mix) and
  ``--dataset.episodes`` (read first: it also takes ranges, slice strings and ``readable``):
  the library's data options (:mod:`.data_flags`). A file check before step 1 refuses missing
  files unless ``readable`` or ``skip`` was asked for, the feature names are checked against
  the policy's before it is built (:mod:`.features`), and the errors shown suggest these
  flags, not the library's Python keywords (:func:`~.data_flags.cli_advice`).
  ``--help`` prints these flags first (:mod:`.help`), then lerobot's.
- ``--dataset.streaming=true`` (lerobot's flag, honoured here): ``--dataset.repo_id`` is read
  as ``hf://datasets/REPO_ID`` at ``--dataset.revision``, nothing downloaded but ``meta/``; a
  URL as ``--dataset.root`` (or in ``--mix.roots``) streams too (:func:`.setup.stream_url`).
  ``fork`` workers are refused for such a dataset (:func:`.setup.check_worker_context`).

Modules, imports pointing down: :mod:`.options` (the ``--mix.*`` and ``--stream.*`` flags,
file names, checks made before lerobot is imported), :mod:`.data_flags` and :mod:`.features`
(the ``--data.*`` flags, feature names), :mod:`.help` (``--help``), :mod:`.lock` (the output
directory's lock), :mod:`.record` (the per-step record), :mod:`.checkpoints` (robo_resume's
files in a checkpoint, RNG states, the atomic write, what interrupted saves leave),
:mod:`.setup` (everything built before the loop), :mod:`.pipeline` (the loop),
:mod:`.audit` (the audit of a run's checkpoint, no lerobot needed), and :mod:`.resume_plan`
(``robo-resume plan --config_path``: the ``resume:`` lines a resume from a checkpoint logs).
lerobot is imported inside functions only: the rest of robo_resume never needs it.

For tests and audits, ``ROBO_RESUME_TRAIN_INDEX_LOG=PATH`` appends one JSON line per step and
rank with the ``index`` values the step trained on; ``ROBO_RESUME_TRAIN_SAVE_PAUSE=PATH`` holds
every save halfway until the file ``PATH`` exists (:func:`.checkpoints.pause_for_tests`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ..errors import RoboResumeError
from .data_flags import DataOptions, cli_advice, split_data_args
from .help import own_help
from .options import (
    MixOptions,
    StreamOptions,
    TrainSetupError,
    check_config_path,
    require_lerobot,
    split_args,
    split_stream_args,
)

__all__ = [
    "DataOptions",
    "MixOptions",
    "StreamOptions",
    "TrainSetupError",
    "add_flag_advice",
    "main",
    "split_args",
    "split_data_args",
    "split_stream_args",
    "train",
]


def __getattr__(name: str):
    # the loop imports torch: loaded on first use, so that the flag parsing of .options serves
    # `robo-resume plan` without torch
    if name == "train":
        from .pipeline import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- entry point ---------------------------------------------------------------------------------
def add_flag_advice(exc: BaseException) -> None:
    """Add a note to ``exc`` (shown under its traceback) with its message's Python advice
    (``on_error='skip'``, ``episodes=[...]``, ...) as ``robo-resume train`` flags, when it has
    any.

    Args:
        exc: an exception leaving ``robo-resume train``.
    """
    text = str(exc)
    advice = cli_advice(text)
    if advice != text:
        exc.add_note(f"robo-resume train: {advice}")


def main(argv: Sequence[str] | None = None) -> int:
    """``robo-resume train ARGS``: returns the exit code (0 done, 2 a setup or input error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    asks_help = any(a in ("-h", "--help") for a in argv)
    if asks_help:
        print(own_help(), flush=True)
    try:
        stream, rest = split_stream_args(argv)
        data, rest = split_data_args(rest)
        mix, lerobot_args = split_args(rest)
        check_config_path(lerobot_args)
        require_lerobot()
    except RoboResumeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from lerobot.configs import parser
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.scripts import lerobot_train  # registers the policy, env and optimizer configs
    from lerobot.utils.import_utils import register_third_party_plugins

    from .pipeline import train

    register_third_party_plugins()
    del lerobot_train

    def run(cfg):
        return train(cfg, mix, stream, data)

    run.__annotations__ = {"cfg": TrainPipelineConfig}  # what lerobot's parser dispatches on
    saved_argv = sys.argv
    sys.argv = ["robo-resume train", *lerobot_args]  # lerobot's parser reads sys.argv
    try:
        parser.wrap()(run)()
    except SystemExit as exc:
        if asks_help and exc.code in (0, None):
            return 0
        raise
    except RoboResumeError as exc:
        logging.getLogger(__name__).debug("setup error", exc_info=True)
        print(f"error: {cli_advice(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug or a library error of another class: keep its traceback
        add_flag_advice(exc)
        raise
    finally:
        sys.argv = saved_argv
    return 0
