"""ChunkedEpisodeDataset: the IterableDataset that streams a LeRobot dataset in chunks.

Each DataLoader worker (of each DDP rank) plays one *stream* of the pure schedule
(:mod:`robo_resume.index.schedule`): it reads its chunks sequentially (one parquet read and one
video seek per chunk), interleaves the frames of a few open chunks in the schedule's seeded order,
and yields LeRobot-compatible items (:mod:`robo_resume.items`). Every item carries a cursor
(``item[CURSOR_KEY]``) so the main process can record exactly what the training loop consumed.

Resuming is arithmetic: ``resume_step`` (or a saved :class:`~robo_resume.state.ResumeState`) is
turned into each stream's (epoch, position) without reading anything that is skipped.

Epochs: every ``iter()`` over the DataLoader is one epoch (the first one after a resume is the
rest of the interrupted epoch). Workers learn the epoch from a small shared-memory table owned by
this object, so it works with and without ``persistent_workers`` and there is no ``set_epoch`` to
forget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .errors import (
    describe,
    format_ranges,
)
from .format.arrow_columns import release_freed_memory
from .format.keyframes import keyframe_cuts
from .format.metadata import DatasetMeta, load_metadata
from .hub import resolve_dataset
from .index.elastic import Layout, Level
from .index.plan import EpisodeSpans, Plan, make_chunks, plan_digest
from .index.schedule import (
    Schedule,
)
from .items import ItemBuilder, ItemOptions
from .items.names import check_renames, dataset_keys, renamed
from .keys import CURSOR_KEY, SKIPPED_KEY
from .source import DataSource, as_source
from .splits import selected_episode_array
from .state.fingerprint import expected_for, value_hash
from .state.records import check_resume_step
from .state.resume import MAX_WORKERS, ResumeState
from .state.stream_state import check_stream_state, stream_state
from .stream.front import batch_loader
from .stream.loader import _Batches
from .stream.positions import _Positions
from .stream.reading import _Reading
from .stream.shared_arrays import SharedArrays, reduce_for_worker
from .stream.startup import _resolve_rank, worker_context
from .stream.tuning import ON_ERROR, SKIP_ERRORS, StreamTuning
from .tracker import CursorTracker
from .workers import WORKER_DIED_HINT as WORKER_DIED_HINT  # re-exported (tests, callers)
from .workers import check_worker_start

__all__ = [
    "CURSOR_KEY",
    "MAX_WORKERS",
    "ON_ERROR",
    "SKIPPED_KEY",
    "SKIP_ERRORS",
    "ChunkedEpisodeDataset",
    "StreamTuning",
    "worker_context",
]

logger = logging.getLogger("robo_resume")

WORKER_START_METHOD: str | None = None
"""Start method :meth:`ChunkedEpisodeDataset.dataloader` uses when the call names none (None:
torch's default, ``fork`` on Linux). robo_resume never changes it itself."""


def episode_spans(meta: DatasetMeta, episodes: Sequence[int] | None) -> EpisodeSpans:
    """The planning columns ``(episode_index, dataset_from_index, length)`` of ``episodes`` (in
    that order; None: every episode, sorted), as int64 arrays: the one place the plan reads
    ``meta``."""
    return EpisodeSpans(*meta.spans(episodes))


class ChunkedEpisodeDataset(_Positions, _Reading, IterableDataset):
    """Stream a LeRobot dataset (v3.0 or v2.1) in shuffled chunks with exact resume.

    Args:
        source: where the data comes from and which of it: a
            :class:`~robo_resume.source.DataSource` (folder or Hub repo, revision, episodes,
            features to keep, drop or rename, chunk_frames), or just the dataset folder.
        **source_fields: the DataSource's fields as keywords, a shorthand:
            ``ChunkedEpisodeDataset(root, episodes="train[:90%]", batch_size=32)`` is
            ``ChunkedEpisodeDataset(DataSource(root, episodes="train[:90%]"), batch_size=32)``.
            A dropped feature is never opened, decoded or downloaded; the resolved episode
            indices and the plan are in the fingerprint (renames and drops are not: they change
            no frame).
        batch_size: the DataLoader's batch size (the schedule works per batch). Use
            :meth:`dataloader` to build a matching DataLoader.
        seed: base seed; the order is a pure function of (seed, epoch, topology).
        resume_step: samples this rank's loader had delivered, ``step * batch_size``.
        resume_state: a state from :meth:`CursorTracker.state_dict` (or the dataset's own
            :meth:`state_dict`); takes precedence over ``resume_step``. It may come from a run
            with other ``num_workers``, ranks or ``batch_size``: the interrupted epoch's
            leftover is then re-partitioned (elastic resume, :mod:`robo_resume.index.elastic`).
            ``resume_step`` alone assumes the topology and batch size are unchanged.
        resume_strict: False logs fingerprint mismatches between ``resume_state`` and this
            dataset as warnings instead of raising (an explicit escape hatch: resuming a state
            made for other data or options can replay or lose frames).
        delta_timestamps, image_transforms, image_dtype: as in :class:`LeRobotReader`
            (``delta_timestamps`` names renamed features by their new names).
        drop_last: make every stream's epoch a whole number of batches (pass the same value to
            the DataLoader; :meth:`dataloader` does).
        infinite: one endless iteration over consecutive epochs (step-based trainers).
        rank, world_size: DDP position; default from ``torch.distributed`` when initialised.
        tuning: :class:`StreamTuning`.
        meta: the source's metadata when already loaded (skips reading ``meta/`` again).
        on_error: "raise" (default): a chunk whose files fail to read raises the error in the
            training loop (naming file, episode and frames). "skip": the chunk is skipped from
            the failed read on (:data:`SKIP_ERRORS`: missing, corrupt or undecodable files,
            metadata mismatches) and the run goes on. Skipped frames keep their schedule
            positions, so batches may hold fewer than ``batch_size`` frames (even none), and
            every batch count and resume stays exact; the skip travels in the batch
            (``SKIPPED_KEY``) to :class:`CursorTracker`, which logs a WARNING per skipped chunk,
            lists them in ``tracker.skipped`` and saves them in the resume state (a resumed
            run skips them again without retrying). Needs the batch path (:meth:`dataloader`
            or :meth:`iter_batches`).

    Every batch holds ``CURSOR_KEY``; pass batches through :class:`CursorTracker.consume` to
    record and strip it. Construct the dataset after ``init_process_group`` when using DDP.
    """

    def __init__(
        self,
        source: str | Path | DataSource | None = None,
        *,
        batch_size: int,
        seed: int = 0,
        resume_step: int = 0,
        resume_state: Mapping[str, Any] | ResumeState | None = None,
        resume_strict: bool = True,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        image_dtype: str = "float32",
        drop_last: bool = False,
        infinite: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        tuning: StreamTuning | None = None,
        on_error: str = "raise",
        meta: DatasetMeta | None = None,
        **source_fields: Any,
    ) -> None:
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(
                describe(
                    "Unknown on_error", expected=" or ".join(map(repr, ON_ERROR)), found=on_error
                )
            )
        self.on_error = on_error
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(describe("batch_size must be a positive int", found=batch_size))
        self.source = src = as_source(source, source_fields, owner="ChunkedEpisodeDataset")
        check_resume_step(resume_step, batch_size)
        self.tuning = tuning or StreamTuning()
        chunk_frames = self.tuning.chunk_frames(src.chunk_frames)
        if self.tuning.tail == "keep" and (drop_last or infinite):
            raise ValueError(
                describe(
                    "StreamTuning(tail='keep') yields every frame exactly once per pass",
                    expected="drop_last=False and infinite=False",
                    found=f"drop_last={drop_last}, infinite={infinite}",
                    fix="evaluate with drop_last=False in epoch mode, or train with "
                    "tail='drop' (default) or 'pad'",
                )
            )
        features = src.selection()
        if meta is None and (src.repo_id is not None or src.root is None):
            _, meta = resolve_dataset(
                src.repo_id,
                root=src.root,
                revision=src.revision,
                episodes=src.episodes,
                features=features,
            )
        self.meta = (meta if meta is not None else load_metadata(src.root)).select(features)
        self.renames = check_renames(self.meta, src.renames())
        every = src.episodes is None
        self._episodes = selected_episode_array(self.meta, src.episodes)
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.infinite = infinite
        self.chunk_frames = chunk_frames
        self.resume_step = resume_step
        self.rank, self.world_size = _resolve_rank(rank, world_size)
        self.items = ItemBuilder(
            self.meta,
            ItemOptions(
                delta_timestamps=dataset_keys(delta_timestamps, self.renames) or None,
                image_dtype=image_dtype,
                image_transforms=image_transforms,
                tolerance_s=self.tuning.tolerance_s,
                decoder_threads=self.tuning.decoder_threads,
            ),
        )
        self._spans = episode_spans(self.meta, None if every else self._episodes)
        self.total_frames = int(self._spans.length.sum())
        self._chunk_frames_given = src.chunk_frames is not None
        self._schedules: dict[int, Schedule] = {}
        self._make_plan(self.tuning, chunk_frames)
        self.use_resume_state(resume_state, strict=resume_strict)
        # Shared table, one row per worker: [next epoch, resume applied, stream epoch, position]
        self._slots = torch.zeros((MAX_WORKERS, 4), dtype=torch.int64).share_memory_()
        # this worker's ring buffers: id of the loader's flag table -> slot -> camera tensors
        self._ring: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
        self._plain_rings: dict[tuple[str, int], Any] = {}  # a plain loader worker's (reading)
        self._loaded: dict[str, int] | None = None
        self._live = {"rank": self.rank, "role": 0, "num_workers": 0, "epoch": 0, "position": 0}
        self._shared = SharedArrays()  # large arrays for spawn/forkserver workers (__reduce_ex__)

    def _make_plan(self, tuning: StreamTuning, chunk_frames: int) -> None:
        """Make the plan and the schedule options of ``tuning`` with ``chunk_frames`` (at
        construction, and again when an older resume state's order is adopted)."""
        self.tuning, self.chunk_frames = tuning, chunk_frames
        cut = tuning.cut_at_keyframes
        cuts = None
        if cut is not False:
            cuts = keyframe_cuts(
                self.meta, self._episodes, auto=cut is None, lookback=self._window_lookback()
            )
        # whether the plan's chunks start on keyframes (cut_at_keyframes resolved; False
        # after adopting a resume state's plan without them, _adopt_even_plan)
        self.keyframe_cuts = cuts is not None
        self.chunks: Plan = make_chunks(self._spans, chunk_frames, cut_points=cuts)
        release_freed_memory()  # planning's temporaries: about 2x the plan at 10^6 episodes
        self.config = tuning.schedule_config(
            seed=self.seed, batch_size=self.batch_size, drop_last=self.drop_last
        )
        self._fingerprint: dict[str, Any] | None = None
        self._schedules = {}

    # -- pickling ------------------------------------------------------------------------------
    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled for a spawn or forkserver worker that is starting: the metadata columns, the
        plan and the epoch layout go through shared memory, mapped read-only by the worker
        instead of copied (:mod:`robo_resume.stream.shared_arrays`); any other pickling (a
        file, ``copy``) is the usual self-contained one."""
        shared = reduce_for_worker(self, self.__getstate__(), self._shared)
        return shared if shared is not None else super().__reduce_ex__(protocol)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_shared", None)  # this process's shared-memory copies
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._shared = SharedArrays()

    @property
    def episodes(self) -> tuple[int, ...]:
        """The selected episode indices, sorted and unique (what ``episodes=`` resolved to), as
        a new tuple at each access: the dataset keeps them as an int64 array (8 MB at 10^6
        episodes instead of about 40 MB of Python ints per process)."""
        return tuple(self._episodes.tolist())

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a resume state must match: dataset, selection, plan and schedule options.

        Computed on first use (hashing a plan of 10^6 episodes takes about 0.2 s; ``robo-resume
        plan`` and a run that never saves or loads a state do not need it), then kept.
        """
        if self._fingerprint is None:
            self._fingerprint = self._make_fingerprint()
        return self._fingerprint

    @fingerprint.setter
    def fingerprint(self, value: dict[str, Any]) -> None:
        self._fingerprint = value

    def _make_fingerprint(self) -> dict[str, Any]:
        return {
            "dataset": self.meta.fingerprint()["episodes_sha256"],
            "total_frames": self.total_frames,
            "episodes": value_hash(self._episodes.tolist()),
            "plan": plan_digest(self.chunks),
            "seed": self.seed,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "tail": self.tuning.tail,
            "interleave": self.tuning.interleave,
            "shuffle": self.tuning.shuffle,
            # only when not the default: states saved before the option keep matching
            **(
                {"interleave_order": self.tuning.interleave_order}
                if self.tuning.interleave_order != "random"
                else {}
            ),
            # only for the shuffle order: states saved with the interleave order (robo_resume
            # 0.1 had no other) keep matching a dataset built with StreamTuning.fast()
            **(
                {"order": "shuffle", "shuffle_frames": self.tuning.shuffle_frames}
                if self.tuning.resolved_order == "shuffle"
                else {}
            ),
            "mode": "infinite" if self.infinite else "epoch",
            "about": {  # readable facts for refusals (robo_resume.state.ABOUT, never compared)
                "dataset": f"{Path(self.meta.root).name} ({self.meta.num_episodes} episodes, "
                f"{self.meta.total_frames} frames)",
                "episodes": format_ranges(self._episodes, limit=120),
                "plan": f"chunk_frames {self.chunk_frames}"
                + (", cut at keyframes" if self.keyframe_cuts else ""),
                "interleave_order": self.tuning.interleave_order,
                "order": self.tuning.resolved_order
                + (
                    f" ({self.tuning.shuffle_frames} frames a window)"
                    if self.tuning.resolved_order == "shuffle"
                    else f" ({self.tuning.interleave} open chunks)"
                ),
            },
        }

    def use_resume_state(
        self, state: Mapping[str, Any] | ResumeState | None, *, strict: bool = True
    ) -> None:
        """Resume from ``state`` (what ``resume_state=`` does): parse, check the fingerprint
        (the batch size may differ: elastic resume) and forget plans made without it.

        For a caller that checks its own state first and hands the dataset its part (the
        sources of :class:`robo_resume.mix.MixedDataset`); call it before any iteration.
        """
        self.resume_state = None
        if state is not None:
            self.resume_state = ResumeState.from_dict(state)
            self._adopt_interleave_order(self.resume_state.fingerprint)
            self._adopt_even_plan(self.resume_state.fingerprint)
            expected = expected_for(self.fingerprint, self.resume_state.fingerprint, self.chunks)
            if self.resume_state.batch_size is not None:  # elastic: the batch size may change
                expected["batch_size"] = self.resume_state.batch_size
            self.resume_state.check_fingerprint(expected, strict=strict)
        self._plans: dict[int, tuple[Layout, int | None, tuple[Level, ...]]] = {}
        self._elastic_starts: dict[int, int] = {}  # num_workers -> epoch all streams start in
        # (epoch, chunk) -> [(segment start, stop, first skipped frame)] of the state's skips
        self._skip_from: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for r in getattr(self.resume_state, "skipped", ()):
            self._skip_from.setdefault((r["epoch"], r["chunk"]), []).append(
                (r["start"], r["stop"], r["frame"])
            )

    # -- StatefulDataLoader protocol -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This stream's position (what it has yielded), for torchdata's StatefulDataLoader.

        Carries the dataset fingerprint and topology of a ``resume_state``
        (:func:`robo_resume.state.stream_state.stream_state`), so :meth:`load_state_dict`
        refuses a state of another dataset, selection, seed or topology.
        """
        return stream_state(self._live, self.fingerprint, self.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` in the next ``iter()`` (StatefulDataLoader hook).

        Checked first (:func:`robo_resume.state.stream_state.check_stream_state`): another
        dataset, episode selection, plan, seed or batch size raises the
        :class:`~robo_resume.errors.ResumeStateError` that ``resume_state=`` raises; another
        ``num_workers`` or world size raises one that names both topologies and how to resume
        elastically (with :meth:`tracker` and ``resume_state=``).
        """
        info = get_worker_info()
        if info is None:  # in a worker the main process's plan could not follow
            self._adopt_even_plan(state.get("fingerprint") if isinstance(state, Mapping) else None)
        self._loaded = check_stream_state(
            state,
            expected_for(self.fingerprint, state.get("fingerprint"), self.chunks),
            rank=self.rank,
            world_size=self.world_size,
            num_workers=info.num_workers if info is not None else 0,
        )
        self._live.update(self._loaded)

    # -- helpers -------------------------------------------------------------------------------
    def dataloader(
        self, *, num_workers: int = 0, stateful: bool = False, **kwargs: Any
    ) -> torch.utils.data.DataLoader:
        """A DataLoader (:class:`BatchLoader`) yielding this dataset's batches.

        ``stateful=True`` returns a torchdata ``StatefulDataLoader`` over the same whole
        batches instead (:class:`robo_resume.stream.stateful.StatefulBatchLoader`): save its
        ``state_dict()`` in the checkpoint, and its ``load_state_dict()`` refuses a state of
        another dataset, selection, seed or topology with a ResumeStateError. Needs torchdata.

        The batches are what ``DataLoader(self, batch_size=self.batch_size,
        drop_last=self.drop_last)`` would yield, built whole in the workers (see
        :meth:`iter_batches`); with workers and float32 images, images cross to the main
        process as uint8 and are converted there (not with ``pin_memory=True``, where the
        worker converts). Passing ``collate_fn`` gives a plain item DataLoader instead.

        Workers start with the method you choose: ``multiprocessing_context="fork"``,
        ``"spawn"``, ``"forkserver"`` or a context; without one, torch's default (``fork`` on
        Linux), or :data:`WORKER_START_METHOD` when set. ``fork`` is safe also after this process
        decoded video or read parquet (inherited decoders are dropped in the worker, see
        ``robo_resume.format.video``) and starts fastest. ``spawn`` and ``forkserver`` workers
        import the main script again and receive the dataset by pickle (its metadata, plan and
        epoch layout arrays as shared memory they map read-only, not a copy per worker:
        :mod:`robo_resume.stream.shared_arrays`): a missing
        ``if __name__ == "__main__":``, an unpicklable transform or a function defined in a
        notebook raise :class:`~robo_resume.errors.WorkerStartError` before any worker starts
        (``robo_resume.workers``).
        """
        for bad in ("batch_size", "drop_last", "shuffle", "sampler", "batch_sampler"):
            if bad in kwargs:
                raise ValueError(
                    describe(
                        f"dataloader() sets {bad} itself",
                        found=f"{bad}={kwargs[bad]!r}",
                        fix=f"set {bad} on the dataset (or build the DataLoader yourself)",
                    )
                )
        self.fingerprint  # noqa: B018 (computed once here, so that no worker hashes the plan again)
        if num_workers > 0 and "multiprocessing_context" not in kwargs and WORKER_START_METHOD:
            kwargs["multiprocessing_context"] = worker_context(WORKER_START_METHOD)
        if "collate_fn" in kwargs and stateful:
            raise ValueError(
                describe(
                    "dataloader(stateful=True) builds whole batches itself",
                    expected="stateful=True without collate_fn",
                    found=f"collate_fn={kwargs['collate_fn']!r}",
                    fix="drop collate_fn (apply it to each batch in the loop), or build a "
                    "torchdata StatefulDataLoader(ds, batch_size=ds.batch_size, collate_fn=...) "
                    "yourself",
                )
            )
        if "collate_fn" in kwargs:  # the user collates items: hand them items
            loader = torch.utils.data.DataLoader(
                self,
                batch_size=self.batch_size,
                drop_last=self.drop_last,
                num_workers=num_workers,
                **kwargs,
            )
            check_worker_start(loader)
            return loader
        return batch_loader(
            lambda float_keys: _Batches(self, "uint8" if float_keys else None),
            num_workers=num_workers,
            options=self.items.options,
            visual_keys=renamed(self.meta.visual_keys, self.renames),  # video and image
            start_method=None,  # set above when WORKER_START_METHOD is
            stateful=stateful,
            **kwargs,
        )

    def tracker(self) -> CursorTracker:
        """A :class:`CursorTracker` for batches of this dataset."""
        return CursorTracker(self)

    def __repr__(self) -> str:
        return (
            f"ChunkedEpisodeDataset(root={str(self.meta.root)!r}, episodes={len(self._episodes)}, "
            f"chunks={len(self.chunks)}, batch_size={self.batch_size}, seed={self.seed}, "
            f"rank={self.rank}/{self.world_size}, mode={'infinite' if self.infinite else 'epoch'})"
        )
