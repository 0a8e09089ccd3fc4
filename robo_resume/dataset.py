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
this object (:class:`~robo_resume.stream.epochs.EpochTable`), so it works with and without
``persistent_workers`` and there is no ``set_epoch`` to forget.

The dataset is composed of two parts with small interfaces: a
:class:`~robo_resume.stream.positions.StreamPositions` (plan, schedule, resume arithmetic; pure)
and a :class:`~robo_resume.stream.reading.StreamReader` (blocks, rings, decoding). What this
class adds is the torch protocols (``__iter__``, the StatefulDataLoader hooks, pickling) and
where each stream starts, from the positions and the epoch table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, SupportsIndex

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .errors import describe
from .format.file_access import LOCAL
from .format.metadata import DatasetMeta, load_metadata
from .hub import resolve_dataset
from .index.elastic import Layout, Level
from .index.plan import EpisodeSpans, Plan
from .index.schedule import Schedule, Topology
from .index.start import StartPoint
from .items import ItemBuilder, ItemOptions
from .items.names import check_renames, dataset_keys, renamed
from .keys import CURSOR_KEY, SKIPPED_KEY
from .remote.files import is_remote, remote_meta
from .source import DataSource, as_source
from .splits import selected_episode_array
from .state.fingerprint import expected_for
from .state.records import check_resume_step
from .state.resume import MAX_WORKERS, ResumeState
from .state.stream_state import check_stream_state, stream_state
from .stream.blocks import StreamRun
from .stream.epochs import EpochTable
from .stream.front import batch_loader
from .stream.lifetime import bind_to_trainer, freeze_inherited
from .stream.loader import DatasetBatches
from .stream.positions import StreamPositions
from .stream.reading import PLAIN_LOADER_NOTE, StreamReader
from .stream.shared_arrays import SharedArrays, reduce_for_worker
from .stream.startup import resolve_rank, worker_context
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


def episode_spans(meta: DatasetMeta, episodes: Sequence[int] | np.ndarray | None) -> EpisodeSpans:
    """The planning columns ``(episode_index, dataset_from_index, length)`` of ``episodes``.

    In that order (None: every episode, sorted), as int64 arrays: the one place the plan reads
    ``meta``.
    """
    return EpisodeSpans(*meta.spans(episodes))


def window_lookback(meta: DatasetMeta, options: ItemOptions) -> int:
    """Frames the first camera's delta window reaches back (0 without a window).

    How far before a chunk's first frame its reads start, which keyframe cuts allow for.
    """
    cams = meta.camera_keys
    window = (options.delta_timestamps or {}).get(cams[0]) if cams else None
    if not window:
        return 0
    return max(0, int(np.ceil(-min(window) * meta.fps - 1e-6)))


class ChunkedEpisodeDataset(IterableDataset):
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
        delta_timestamps: as in :class:`LeRobotReader`, naming renamed features by their new
            names.
        image_transforms: as in :class:`LeRobotReader`.
        image_dtype: as in :class:`LeRobotReader`.
        drop_last: make every stream's epoch a whole number of batches (pass the same value to
            the DataLoader; :meth:`dataloader` does).
        infinite: one endless iteration over consecutive epochs (step-based trainers).
        rank: DDP rank; default from ``torch.distributed`` when initialised, else 0.
        world_size: DDP world size; default from ``torch.distributed`` when initialised,
            else 1.
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

    Raises:
        ValueError: an unknown ``on_error``, a ``batch_size`` that is not a positive int, a
            ``resume_step`` that is not a multiple of it, ``StreamTuning(tail="keep")`` with
            ``drop_last`` or ``infinite``, or an invalid source.
        ResumeStateError: ``resume_state`` is invalid or made for another dataset, selection,
            plan or seed (with ``resume_strict``).
        DatasetFormatError: the dataset's metadata cannot be read (see
            :func:`~robo_resume.format.metadata.load_metadata`).
    """

    positions_type: type[StreamPositions] = StreamPositions
    """The positions class a dataset is built with.

    A subclass may change the arithmetic, as :class:`robo_resume.audit.NaiveResumeDataset` does
    to show the original design's bug.
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
        tuning = tuning or StreamTuning()
        if tuning.tail == "keep" and (drop_last or infinite):
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
        if meta is None:
            if is_remote(src.root):
                meta = remote_meta(str(src.root), revision=src.revision)
            elif src.repo_id is not None or src.root is None:
                _, meta = resolve_dataset(
                    src.repo_id,
                    root=src.root,
                    revision=src.revision,
                    episodes=src.episodes,
                    features=features,
                )
            else:
                meta = load_metadata(src.root)
        self.meta = meta.select(features)
        chunk_frames = tuning.chunk_frames(src.chunk_frames, video=bool(self.meta.camera_keys))
        self.renames = check_renames(self.meta, src.renames())
        every = src.episodes is None
        episodes = selected_episode_array(self.meta, src.episodes)
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.infinite = infinite
        self.resume_step = resume_step
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.items = ItemBuilder(
            self.meta,
            ItemOptions(
                delta_timestamps=dataset_keys(delta_timestamps, self.renames) or None,
                image_dtype=image_dtype,
                image_transforms=image_transforms,
                tolerance_s=tuning.tolerance_s,
                decoder_threads=tuning.decoder_threads,
            ),
        )
        self.positions = self.positions_type(
            self.meta,
            episodes,
            episode_spans(self.meta, None if every else episodes),
            batch_size=batch_size,
            seed=seed,
            drop_last=drop_last,
            infinite=infinite,
            rank=self.rank,
            world_size=self.world_size,
            resume_step=resume_step,
            tuning=tuning,
            chunk_frames=chunk_frames,
            chunk_frames_given=src.chunk_frames is not None,
            window_lookback=window_lookback(self.meta, self.items.options),
        )
        self.positions.use_resume_state(resume_state, strict=resume_strict)
        self.reader = StreamReader(
            self.items,
            self.positions,
            self.renames,
            batch_size=batch_size,
            drop_last=drop_last,
            infinite=infinite,
            on_error=on_error,
            rank=self.rank,
        )
        self.epochs = EpochTable()
        self._loaded: dict[str, int] | None = None  # a StatefulDataLoader state to start from
        # where this process's stream stands (the StatefulDataLoader state), kept up to date by
        # the reader as batches are handed out
        self._live = {"rank": self.rank, "role": 0, "num_workers": 0, "epoch": 0, "position": 0}
        self._shared = SharedArrays()  # large arrays for spawn/forkserver workers (__reduce_ex__)

    # -- pickling ------------------------------------------------------------------------------
    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        """Pickled for a spawn or forkserver worker that is starting, through shared memory.

        The metadata columns, the plan and the epoch layout go through shared memory, mapped
        read-only by the worker instead of copied (:mod:`robo_resume.stream.shared_arrays`);
        any other pickling (a file, ``copy``) is the usual self-contained one.
        """
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
        """The selected episode indices, sorted and unique (what ``episodes=`` resolved to).

        A new tuple at each access: the dataset keeps them as an int64 array (8 MB at 10^6
        episodes instead of about 40 MB of Python ints per process).
        """
        return tuple(self.positions.episodes.tolist())

    @property
    def total_frames(self) -> int:
        """Frames of the selected episodes."""
        return self.positions.total_frames

    @property
    def tuning(self) -> StreamTuning:
        """The :class:`StreamTuning` in force (a resumed legacy state's order included)."""
        return self.positions.tuning

    @property
    def chunk_frames(self) -> int:
        """Frames per chunk of the plan (before keyframe cuts)."""
        return self.positions.chunk_frames

    @property
    def chunks(self) -> Plan:
        """The plan: the chunks of the selected episodes (:class:`~robo_resume.index.plan.Plan`)."""
        return self.positions.chunks

    @property
    def keyframe_cuts(self) -> bool:
        """Whether the plan's chunks start on keyframes."""
        return self.positions.keyframe_cuts

    @property
    def config(self) -> Any:
        """The schedule options (:class:`~robo_resume.index.schedule.ScheduleConfig`)."""
        return self.positions.config

    @property
    def resume_state(self) -> ResumeState | None:
        """The parsed resume state this dataset resumes from (None: ``resume_step`` or none)."""
        return self.positions.resume_state

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a resume state must match: dataset, selection, plan and schedule options.

        Computed on first use (``robo-resume plan`` and a run that never saves or loads a
        state do not need it), then kept.
        """
        return self.positions.fingerprint

    @fingerprint.setter
    def fingerprint(self, value: dict[str, Any]) -> None:
        self.positions.fingerprint = value

    def use_resume_state(
        self, state: Mapping[str, Any] | ResumeState | None, *, strict: bool = True
    ) -> None:
        """Resume from ``state``, as ``resume_state=`` does.

        Parse, check the fingerprint (the batch size may differ: elastic resume) and forget
        plans made without it. For a caller that checks its own state first and hands the
        dataset its part (the sources of :class:`robo_resume.mix.MixedDataset`); call it before
        any iteration.

        Args:
            state: a resume state (dict or :class:`ResumeState`); None resumes nothing.
            strict: False logs fingerprint mismatches as warnings instead of raising (as
                ``resume_strict=``).

        Raises:
            ResumeStateError: the state is invalid, or (with ``strict``) made for another
                dataset, selection, plan or seed.
        """
        self.positions.use_resume_state(state, strict=strict)

    # -- positions (pure arithmetic, robo_resume.stream.positions) -------------------------------
    def schedule(self, num_workers: int) -> Schedule:
        """The pure schedule for this rank's DataLoader with ``num_workers`` workers.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The :class:`~robo_resume.index.schedule.Schedule`.
        """
        return self.positions.schedule(num_workers)

    def layout(self, num_workers: int) -> Layout:
        """What this rank's streams emit per epoch, with ``num_workers`` workers.

        The schedule's epochs, plus, after an elastic resume (a ``resume_state`` of another
        topology or batch size, or one saved during such a run's first epoch), the *remainder
        epoch*: what the interrupted epoch had left, re-partitioned over this topology.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The :class:`~robo_resume.index.layout.Layout`.
        """
        return self.positions.layout(num_workers)

    def elastic_origin(self, num_workers: int) -> tuple[int | None, tuple[Level, ...]]:
        """The elastic chain a state of this run must carry.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            ``(remainder epoch label, origin levels)``; ``(None, ())`` without an elastic
            resume.
        """
        return self.positions.elastic_origin(num_workers)

    def start_point(self, num_workers: int) -> StartPoint:
        """Where this rank's streams start.

        From ``resume_state`` when given (cursors), else from ``resume_step`` (arithmetic). New
        worker ``w`` plays role ``(w + rotation) % workers`` in the first iteration. After a
        topology or batch size change every role starts at position 0 of the remainder epoch
        (see :meth:`layout`), with rotation 0 and a batch count of 0.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            A :class:`~robo_resume.index.start.StartPoint`
            ``(rotation, [(epoch, position)] per role, batches)``.
        """
        return self.positions.start_point(num_workers)

    def batches_per_epoch(self, num_workers: int) -> int:
        """Batches this rank's DataLoader yields per epoch.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The batch count, equal on every rank, except with ``StreamTuning(tail="keep")``
            when the frames cannot be split so.
        """
        return self.positions.batches_per_epoch(num_workers)

    def batches_next_iteration(self, num_workers: int) -> int:
        """Batches the next iteration of this rank's DataLoader yields (``len(loader)``).

        The first iteration runs from :meth:`start_point` to the end of its epoch (a partial
        epoch after a resume; the remainder epoch after an elastic resume); later ones are
        whole epochs of :meth:`layout`.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The batch count.

        Raises:
            TypeError: in infinite mode (no end).
        """
        return self.positions.batches_next_iteration(num_workers, self.epochs)

    def next_epoch(self, num_workers: int) -> int:
        """The epoch the next iteration of this rank's loader (``num_workers``) plays.

        Before the first iteration: the epoch the resume point stands in (0 without a resume;
        after a resume, the interrupted epoch, or the next one when the checkpoint was taken
        at its end; after an elastic resume, the remainder epoch's label, which is the
        interrupted epoch's number). Then one more per iteration the loader started. This is
        what :meth:`BatchLoader.epochs` counts with, whatever topology the checkpoint had.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The epoch number.

        Raises:
            TypeError: in infinite mode (an infinite dataset has one endless iteration).
        """
        return self.positions.next_epoch(num_workers, self.epochs)

    def share_schedule(self, num_workers: int) -> None:
        """Compute the layout of the epoch the next iteration starts in, before workers start.

        The workers inherit it (fork) or map it from shared memory with the dataset's other
        large arrays (spawn, forkserver: :mod:`robo_resume.stream.shared_arrays`) instead of
        each computing it. What
        :class:`~robo_resume.stream.loader.BatchLoader` calls per iteration; a remainder epoch
        (elastic resume) has no layout to share. The frames are the same either way.

        Args:
            num_workers: the DataLoader's workers (0: the main process).
        """
        self.positions.share_schedule(num_workers, self.epochs)

    # -- streams (read by robo_resume.stream.reading) --------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This worker's stream, one item per frame (for a DataLoader with ``batch_size``).

        Items are row views of batches built whole: a plain
        ``DataLoader(ds, batch_size=ds.batch_size, num_workers=W)`` collates them back into
        those batches without a copy and, with workers, through reused shared buffers, at about
        the speed of :meth:`dataloader`. Another ``batch_size`` works too, at the cost of one
        stack per batch. The first worker logs
        :data:`~robo_resume.stream.reading.PLAIN_LOADER_NOTE` once at INFO.
        """
        if self.reader.on_error == "skip":
            raise ValueError(
                describe(
                    "on_error='skip' needs the batch path",
                    expected="dataset.dataloader(...) without collate_fn, or iter_batches()",
                    found="iteration item by item (a DataLoader with batch_size or collate_fn)",
                    fix="use dataset.dataloader(num_workers=...): skipped frames keep their "
                    "positions there, which item-by-item batching cannot do",
                )
            )
        info = get_worker_info()
        if info is not None and info.id == 0 and not self.epochs.started:
            logger.info(PLAIN_LOADER_NOTE)  # once: the first stream of the first epoch
        return self.reader.items_of(self._start_stream())

    def iter_batches(
        self, *, image_dtype: str | None = None, ring: torch.Tensor | None = None
    ) -> Iterator[dict[str, Any]]:
        """This worker's stream as whole batches, equal to ``default_collate`` of the items.

        What :meth:`dataloader` uses (with ``batch_size=None``): the batches a DataLoader with
        ``batch_size`` would make from :meth:`__iter__`, built column by column instead of item
        by item and collated, which is several times cheaper per frame.

        Args:
            image_dtype: the camera tensors' dtype, "float32" or "uint8"; None: the
                dataset's ``image_dtype``.
            ring: (for :class:`BatchLoader`, whose iterator frees the slots) a shared flag
                table ``(MAX_WORKERS, RING)``; in a DataLoader worker, camera buffers then come
                from a ring of :data:`RING` shared-memory buffers, and each batch carries
                :data:`RELEASE_KEY`.

        Returns:
            An iterator of batch dicts, each with ``CURSOR_KEY``.

        Raises:
            ValueError: more than :data:`MAX_WORKERS` DataLoader workers.
        """
        return self.reader.batches(self._start_stream(), image_dtype=image_dtype, ring=ring)

    def _start_stream(self) -> StreamRun:
        """Where this worker's stream starts now; marks the epoch table.

        A StatefulDataLoader state it was given, the resume point (first iteration), or the
        next epoch's start.
        """
        bind_to_trainer()  # a worker exits when the training process dies (stream/lifetime.py)
        freeze_inherited()  # and its full collections skip what it inherited
        info = get_worker_info()
        num_workers = info.num_workers if info is not None else 0
        worker = info.id if info is not None else 0
        if num_workers > MAX_WORKERS:
            raise ValueError(describe("Too many workers", expected=f"<= {MAX_WORKERS}"))
        positions = self.positions
        layout = positions.layout(num_workers)
        wp = max(num_workers, 1)
        row = self.epochs.worker(worker)
        resumed = False
        if self._loaded is not None:
            st, self._loaded = self._loaded, None
            role, epoch, position = st["role"], st["epoch"], st["position"]
            resumed = True
        elif not row.started:
            rotation, starts, _ = positions.start_point(num_workers)
            role = (worker + rotation) % wp
            epoch, position = starts[role]
            resumed = positions.resume_state is not None or self.resume_step > 0
        else:
            role, epoch, position = worker, row.next_epoch, 0
        row.playing(epoch)
        stream = Topology(self.world_size, num_workers).stream_id(self.rank, role)
        self._live.update(role=role, num_workers=num_workers, epoch=epoch, position=position)
        if resumed:
            positions.log_resume(layout.view(epoch, stream), stream, epoch, position)
        return StreamRun(layout, stream, role, num_workers, epoch, position, row, self._live)

    def stream_batches(
        self,
        role: int,
        num_workers: int,
        epoch: int,
        position: int,
        *,
        image_dtype: str | None = None,
        log_resume: bool = False,
        resume_label: str = "",
    ) -> Iterator[dict[str, Any]]:
        """Batches of stream ``role`` of this rank (``num_workers`` workers) from a position.

        The batches :meth:`iter_batches` yields for that stream after it stood at ``(epoch,
        position)`` (frames of ``epoch`` already delivered), in any process and without
        touching the epoch table: the epoch ends the iterator in epoch mode, epochs follow each
        other in infinite mode; epochs are those of :meth:`layout` (a remainder epoch after an
        elastic resume). Used by :class:`robo_resume.mix.MixedDataset`, which decides itself
        where each source's streams stand.

        Args:
            role: the stream's role among this rank's streams.
            num_workers: the DataLoader's workers (0: the main process).
            epoch: the epoch the stream stands in.
            position: frames of ``epoch`` the stream already delivered.
            image_dtype: as for :meth:`iter_batches`.
            log_resume: log the stream's ``resume:`` line.
            resume_label: what ends that line (the mix's source).

        Returns:
            An iterator of batch dicts, each with ``CURSOR_KEY``.
        """
        bind_to_trainer()
        freeze_inherited()
        layout = self.layout(num_workers)  # the remainder epoch after an elastic resume
        stream = Topology(self.world_size, num_workers).stream_id(self.rank, role)
        if log_resume:
            self.positions.log_resume(
                layout.view(epoch, stream), stream, epoch, position, resume_label
            )
        row = EpochTable(1, shared=False).worker(0)  # private: the epoch table stays untouched
        live = dict(self._live)  # the mix keeps its own state
        return self.reader.batches(
            StreamRun(layout, stream, role, num_workers, epoch, position, row, live),
            image_dtype=image_dtype,
        )

    # -- StatefulDataLoader protocol -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This stream's position (what it has yielded), for torchdata's StatefulDataLoader.

        Carries the dataset fingerprint and topology of a ``resume_state``
        (:func:`robo_resume.state.stream_state.stream_state`), so :meth:`load_state_dict`
        refuses a state of another dataset, selection, seed or topology.

        Returns:
            A JSON-safe dict: the stream's role, topology, epoch and position.
        """
        return stream_state(self._live, self.fingerprint, self.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` in the next ``iter()`` (StatefulDataLoader hook).

        Checked first (:func:`robo_resume.state.stream_state.check_stream_state`): another
        dataset, episode selection, plan, seed or batch size raises the
        :class:`~robo_resume.errors.ResumeStateError` that ``resume_state=`` raises; another
        ``num_workers`` or world size raises one that names both topologies and how to resume
        elastically (with :meth:`tracker` and ``resume_state=``).

        Args:
            state: a :meth:`state_dict` value.

        Raises:
            ResumeStateError: the state is of another dataset, selection, plan, seed, batch
                size or topology.
        """
        info = get_worker_info()
        if info is None:  # in a worker the main process's plan could not follow
            theirs = state.get("fingerprint") if isinstance(state, Mapping) else None
            self.positions.adopt_even_plan(theirs)
            self.positions.adopt_two_frame_plan(theirs)
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

        The batches are what ``DataLoader(self, batch_size=self.batch_size,
        drop_last=self.drop_last)`` would yield, built whole in the workers (see
        :meth:`iter_batches`); with workers and float32 images, images cross to the main
        process as uint8 and are converted there (not with ``pin_memory=True``, where the
        worker converts).

        Workers start with the method you choose: ``multiprocessing_context="fork"``,
        ``"spawn"``, ``"forkserver"`` or a context; without one, torch's default (``fork`` on
        Linux), or :data:`WORKER_START_METHOD` when set; a remote dataset's workers start in
        :func:`~robo_resume.worker_context`'s forkserver (its store's network client does not
        survive a fork, and ``fork`` is refused). ``fork`` is safe also after this process
        decoded video or read parquet (inherited decoders are dropped in the worker, see
        ``robo_resume.format.video``) and starts fastest. ``spawn`` and ``forkserver`` workers
        import the main script again and receive the dataset by pickle (its metadata, plan and
        epoch layout arrays as shared memory they map read-only, not a copy per worker:
        :mod:`robo_resume.stream.shared_arrays`): a missing
        ``if __name__ == "__main__":``, an unpicklable transform or a function defined in a
        notebook raise :class:`~robo_resume.errors.WorkerStartError` before any worker starts
        (``robo_resume.workers``).

        Args:
            num_workers: DataLoader worker processes (0: load in the main process).
            stateful: return a torchdata ``StatefulDataLoader`` over the same whole batches
                instead (:class:`robo_resume.stream.stateful.StatefulBatchLoader`): save its
                ``state_dict()`` in the checkpoint, and its ``load_state_dict()`` refuses a
                state of another dataset, selection, seed or topology with a
                ResumeStateError. Needs torchdata.
            **kwargs: other DataLoader arguments (``pin_memory``, ``prefetch_factor``,
                ``multiprocessing_context``, ...; ``collate_fn`` gives a plain item
                DataLoader instead).

        Returns:
            The DataLoader.

        Raises:
            ValueError: ``kwargs`` sets ``batch_size``, ``drop_last``, ``shuffle``,
                ``sampler`` or ``batch_sampler`` (the dataset sets them), or ``collate_fn``
                with ``stateful=True``.
            WorkerStartError: the workers cannot start as asked (see above).
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
        if num_workers > 0 and "multiprocessing_context" not in kwargs:
            # a remote store's client does not survive a fork: its workers start in a forkserver
            method = WORKER_START_METHOD or ("forkserver" if self.meta.files is not LOCAL else None)
            if method:
                kwargs["multiprocessing_context"] = worker_context(method)
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
            lambda float_keys: DatasetBatches(self, "uint8" if float_keys else None),
            num_workers=num_workers,
            options=self.items.options,
            visual_keys=renamed(self.meta.visual_keys, self.renames),  # video and image
            start_method=None,  # set above when WORKER_START_METHOD is
            stateful=stateful,
            **kwargs,
        )

    def tracker(self) -> CursorTracker:
        """A tracker for batches of this dataset.

        Returns:
            A new :class:`CursorTracker`.
        """
        return CursorTracker(self)

    def __repr__(self) -> str:
        return (
            f"ChunkedEpisodeDataset(root={str(self.meta.root)!r}, "
            f"episodes={len(self.positions.episodes)}, "
            f"chunks={len(self.chunks)}, batch_size={self.batch_size}, seed={self.seed}, "
            f"rank={self.rank}/{self.world_size}, mode={'infinite' if self.infinite else 'epoch'})"
        )
