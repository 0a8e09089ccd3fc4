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

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .errors import (
    ResumeStateError,
    describe,
    format_ranges,
)
from .format.metadata import DatasetMeta, load_metadata
from .format.validate import inside_root
from .format.video import VideoReader
from .hub import resolve_dataset
from .index.elastic import Layout, Level, build_layout, check_positions, replan
from .index.plan import Chunk, EpisodeSpan, make_chunks, plan_fingerprint
from .index.schedule import (
    Group,
    Schedule,
    ScheduleConfig,
    Topology,
    resume_point,
    worker_batches_done,
)
from .items import ItemBuilder, ItemOptions
from .keys import CURSOR_KEY, RELEASE_KEY, SKIPPED_KEY
from .splits import EpisodeSelection, select_episodes
from .state.resume import MAX_STATE_INT, MAX_WORKERS, ResumeState, StreamCursor
from .state.stream_state import check_stream_state, stream_state
from .stream.blocks import (
    _assemble,
    _BatchTarget,
    _Block,
    _discard,
    _in_worker,
    _skip_record,
    _streaming_error,
    _torch_threads,
)
from .stream.lifetime import bind_to_trainer
from .stream.loader import BatchLoader, _Batches
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


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


class ChunkedEpisodeDataset(IterableDataset):
    """Stream a LeRobot dataset (v3.0 or v2.1) in shuffled chunks with exact resume.

    Args:
        root: dataset folder (holding ``meta/``). With ``repo_id``, a folder without
            ``meta/`` is where the Hub download goes (instead of the huggingface_hub cache).
        repo_id: ``"owner/name"`` of a dataset on the Hugging Face Hub, used when ``root`` is
            None or holds no dataset: the metadata and only the selected episodes' files are
            downloaded (or found in the cache; offline with ``HF_HUB_OFFLINE=1``). See
            :func:`robo_resume.hub.resolve_root`.
        revision: Hub branch, tag (e.g. "v3.0", "v2.1") or commit; None: the default branch.
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
        chunk_frames: maximum frames per chunk (contiguous frames of one episode).
        episodes: episode indices to use (``index`` values stay absolute), a slice string by
            position such as ``"train[:90%]"``, or a seeded :class:`~robo_resume.splits.Split`
            (see :mod:`robo_resume.splits`); the resolved indices are in the fingerprint.
        features: which features items hold: a list of keys to keep, or ``{key: None}`` for
            keys to drop (None: all). A feature left out is never opened or decoded, so a
            policy that uses one camera of four decodes one, and a copy without some camera's
            mp4s streams the rest (:meth:`~robo_resume.format.metadata.DatasetMeta.select`).
        delta_timestamps, image_transforms, image_dtype: as in :class:`LeRobotReader`.
        drop_last: make every stream's epoch a whole number of batches (pass the same value to
            the DataLoader; :meth:`dataloader` does).
        infinite: one endless iteration over consecutive epochs (step-based trainers).
        rank, world_size: DDP position; default from ``torch.distributed`` when initialised.
        tuning: :class:`StreamTuning`.
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
        root: str | Path | None = None,
        *,
        repo_id: str | None = None,
        revision: str | None = None,
        batch_size: int,
        seed: int = 0,
        resume_step: int = 0,
        resume_state: Mapping[str, Any] | ResumeState | None = None,
        resume_strict: bool = True,
        chunk_frames: int = 64,
        episodes: EpisodeSelection = None,
        features: Sequence[str] | Mapping[str, None] | None = None,
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
        if chunk_frames < 1:
            raise ValueError(describe("chunk_frames must be >= 1", found=chunk_frames))
        if resume_step < 0 or resume_step % batch_size:
            raise ValueError(
                describe(
                    "resume_step must be a non-negative multiple of batch_size",
                    expected=f"step * batch_size (a multiple of {batch_size})",
                    found=resume_step,
                    fix="pass resume_step=step * batch_size, where step counts batches",
                )
            )
        if resume_step // batch_size > MAX_STATE_INT:
            raise ResumeStateError(
                describe(
                    "resume_step is beyond any run's length",
                    expected=f"resume_step // batch_size <= {MAX_STATE_INT} batches",
                    found=f"resume_step={resume_step}",
                    fix="pass resume_step=step * batch_size with the step of your checkpoint",
                )
            )
        self.tuning = tuning or StreamTuning()
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
        if meta is None and (repo_id is not None or root is None):
            root, meta = resolve_dataset(
                repo_id, root=root, revision=revision, episodes=episodes, features=features
            )
        self.meta = (meta if meta is not None else load_metadata(root)).select(features)
        self.episodes = select_episodes(self.meta, episodes)
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
                delta_timestamps=delta_timestamps,
                image_dtype=image_dtype,
                image_transforms=image_transforms,
                tolerance_s=self.tuning.tolerance_s,
                decoder_threads=self.tuning.decoder_threads,
            ),
        )
        spans = [
            EpisodeSpan(e, self.meta.episode(e).dataset_from_index, self.meta.episode(e).length)
            for e in self.episodes
        ]
        cuts = self._keyframe_cuts() if self.tuning.cut_at_keyframes else None
        self.chunks: tuple[Chunk, ...] = make_chunks(spans, chunk_frames, cut_points=cuts)
        self.config = ScheduleConfig(
            seed=seed,
            batch_size=batch_size,
            drop_last=drop_last,
            tail=self.tuning.tail,
            interleave=self.tuning.interleave,
            shuffle=self.tuning.shuffle,
        )
        self.fingerprint = {
            "dataset": self.meta.fingerprint()["episodes_sha256"],
            "total_frames": sum(s.length for s in spans),
            "episodes": _hash(list(self.episodes)),
            "plan": plan_fingerprint(self.chunks)[:16],
            "seed": seed,
            "batch_size": batch_size,
            "drop_last": drop_last,
            "tail": self.tuning.tail,
            "interleave": self.tuning.interleave,
            "shuffle": self.tuning.shuffle,
            "mode": "infinite" if infinite else "epoch",
            "about": {  # readable facts for refusals (robo_resume.state.ABOUT, never compared)
                "dataset": f"{Path(self.meta.root).name} ({self.meta.num_episodes} episodes, "
                f"{self.meta.total_frames} frames)",
                "episodes": format_ranges(self.episodes, limit=120),
                "plan": f"chunk_frames {chunk_frames}"
                + (", cut at keyframes" if self.tuning.cut_at_keyframes else ""),
            },
        }
        self.resume_state = None
        if resume_state is not None:
            self.resume_state = ResumeState.from_dict(resume_state)
            expected = dict(self.fingerprint)
            if self.resume_state.batch_size is not None:  # elastic: the batch size may change
                expected["batch_size"] = self.resume_state.batch_size
            self.resume_state.check_fingerprint(expected, strict=resume_strict)
        self._plans: dict[int, tuple[Layout, int | None, tuple[Level, ...]]] = {}
        self._elastic_starts: dict[int, int] = {}  # num_workers -> epoch all streams start in
        # (epoch, chunk, segment start) -> first skipped frame, from the state's skipped chunks
        self._skip_from: dict[tuple[int, int, int], int] = {}
        for r in getattr(self.resume_state, "skipped", ()):
            key = (r["epoch"], r["chunk"], r["start"])
            self._skip_from[key] = min(r["frame"], self._skip_from.get(key, r["frame"]))
        # Shared table, one row per worker: [next epoch, resume applied, stream epoch, position]
        self._slots = torch.zeros((MAX_WORKERS, 4), dtype=torch.int64).share_memory_()
        # this worker's ring buffers: id of the loader's flag table -> slot -> camera tensors
        self._ring: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
        self._schedules: dict[int, Schedule] = {}
        self._loaded: dict[str, int] | None = None
        self._live = {"rank": self.rank, "role": 0, "num_workers": 0, "epoch": 0, "position": 0}

    # -- pure parts ----------------------------------------------------------------------------
    def schedule(self, num_workers: int) -> Schedule:
        """The pure schedule for this rank's DataLoader with ``num_workers`` workers."""
        s = self._schedules.get(num_workers)
        if s is None:
            s = Schedule(self.chunks, self.config, Topology(self.world_size, num_workers))
            self._schedules[num_workers] = s
        return s

    def batches_per_epoch(self, num_workers: int) -> int:
        """Batches this rank's DataLoader yields per epoch (equal on every rank, except with
        ``StreamTuning(tail="keep")`` when the frames cannot be split so)."""
        return self.schedule(num_workers).rank_batches(self.rank)

    def batches_next_iteration(self, num_workers: int) -> int:
        """Batches the next iteration of this rank's DataLoader yields (``len(loader)``).

        The first iteration runs from :meth:`start_point` to the end of its epoch (a partial
        epoch after a resume; the remainder epoch after an elastic resume); later ones are
        whole epochs of :meth:`layout`. Raises TypeError in infinite mode (no end).
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "An infinite ChunkedEpisodeDataset's loader has no len()",
                    expected="infinite=False for a loader with a length",
                    found="infinite=True: one endless iteration over consecutive epochs",
                    fix=f"use dataset.batches_per_epoch(num_workers) "
                    f"({self.batches_per_epoch(num_workers)} here) as the epoch length, or "
                    "count steps yourself",
                )
            )
        wp = max(num_workers, 1)
        slots = self._slots[:wp]
        layout = self.layout(num_workers)
        topo = Topology(self.world_size, num_workers)
        if int(slots[0, 1]) == 0:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
        else:  # every worker starts its next epoch at position 0
            starts = [(int(slots[0, 0]), 0)] * wp
        b = self.batch_size
        total = 0
        for role, (epoch, position) in enumerate(starts):
            left = layout.length(epoch, topo.stream_id(self.rank, role)) - position
            total += -(-max(left, 0) // b)
        return total

    def next_epoch(self, num_workers: int) -> int:
        """The epoch the next iteration of this rank's loader (``num_workers``) plays.

        Before the first iteration: the epoch the resume point stands in (0 without a resume;
        after a resume, the interrupted epoch, or the next one when the checkpoint was taken
        at its end; after an elastic resume, the remainder epoch's label, which is the
        interrupted epoch's number). Then one more per iteration the loader started. Epoch
        mode only (an infinite dataset has one endless iteration: TypeError). This is what
        :meth:`BatchLoader.epochs` counts with, whatever topology the checkpoint had.
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "An infinite ChunkedEpisodeDataset has no epochs to count",
                    expected="infinite=False",
                    found="infinite=True: one endless iteration over consecutive epochs",
                    fix="count steps, or use epoch mode and loader.epochs(n)",
                )
            )
        if int(self._slots[0, 1]) == 0:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            return min(e for e, _ in starts)  # epoch mode: every role starts in one epoch
        return int(self._slots[0, 0])

    def start_point(self, num_workers: int) -> tuple[int, list[tuple[int, int]], int]:
        """Where this rank's streams start: ``(rotation, [(epoch, position)] per role, batches)``.

        From ``resume_state`` when given (cursors), else from ``resume_step`` (arithmetic). New
        worker ``w`` plays role ``(w + rotation) % workers`` in the first iteration. After a
        topology or batch size change every role starts at position 0 of the remainder epoch
        (see :meth:`layout`), with rotation 0 and a batch count of 0.
        """
        sched = self.schedule(num_workers)
        if self.resume_state is None:
            batches = self.resume_step // self.batch_size
            rp = resume_point(sched, batches, infinite=self.infinite, rank=self.rank)
            return rp.rotation, [(s.epoch, s.position) for s in rp.starts], batches
        return self._start_from_cursors(sched, num_workers)

    def layout(self, num_workers: int) -> Layout:
        """What this rank's streams emit per epoch, with ``num_workers`` workers.

        The schedule's epochs, plus, after an elastic resume (a ``resume_state`` of another
        topology or batch size, or one saved during such a run's first epoch), the *remainder
        epoch*: what the interrupted epoch had left, re-partitioned over this topology.
        """
        return self._plan(num_workers)[0]

    def elastic_origin(self, num_workers: int) -> tuple[int | None, tuple[Level, ...]]:
        """``(remainder epoch label, origin levels)`` a state of this run must carry."""
        _, label, origin = self._plan(num_workers)
        return label, origin

    def _plan(self, num_workers: int) -> tuple[Layout, int | None, tuple[Level, ...]]:
        plan = self._plans.get(num_workers)
        if plan is not None:
            return plan
        st, sched = self.resume_state, self.schedule(num_workers)
        here = (self.world_size, num_workers, self.batch_size)
        if st is None:
            plan = (Layout(sched), None, ())
        elif (st.world_size, st.num_workers, st.batch_size) == here:
            if st.elastic_epoch is None:
                plan = (Layout(sched), None, ())
            else:
                layout = build_layout(
                    self.chunks, self.config, [*st.origin, st.level], infinite=self.infinite
                )
                plan = (layout, st.elastic_epoch, st.origin)
        else:
            rp = replan(
                self.chunks,
                self.config,
                [*st.origin, st.level],
                Level(*here),
                infinite=self.infinite,
            )
            plan = (rp.layout, rp.layout.epoch, rp.origin)
            self._elastic_starts[num_workers] = rp.epoch
            if self.rank == 0 and get_worker_info() is None:
                logger.info(
                    "resume: elastic re-partition from world_size=%d num_workers=%d "
                    "batch_size=%s to world_size=%d num_workers=%d batch_size=%d: %s",
                    st.world_size,
                    st.num_workers,
                    st.batch_size,
                    *here,
                    f"{rp.total} frames left in epoch {rp.epoch} form the remainder epoch"
                    if rp.layout.epoch is not None
                    else f"nothing left mid-epoch, starting epoch {rp.epoch}",
                )
            if rp.dropped and get_worker_info() is None:
                logger.warning(
                    "resume: drop_last=True drops %d of the %d frames left in epoch %d on rank "
                    "%d's re-partition (they do not fill a batch on every rank)",
                    rp.dropped,
                    rp.total,
                    rp.epoch,
                    self.rank,
                )
        self._plans[num_workers] = plan
        return plan

    def _start_from_cursors(self, sched: Schedule, num_workers: int):
        st = self.resume_state
        wp = max(num_workers, 1)
        layout = self.layout(num_workers)
        if (st.world_size, st.num_workers, st.batch_size) != (
            self.world_size,
            num_workers,
            self.batch_size,
        ):
            return 0, [(self._elastic_starts[num_workers], 0)] * wp, 0
        topo = Topology(self.world_size, num_workers)
        mine = {c.role: c for c in st.cursors if c.rank == self.rank}
        if sorted(mine) != list(range(wp)):
            raise ResumeStateError(
                describe(
                    "The resume state lacks cursors of this rank's streams",
                    expected=f"roles 0..{wp - 1} of rank {self.rank}",
                    found=sorted(mine),
                    fix="save the state with CursorTracker.state_dict() (it gathers all ranks)",
                )
            )
        b = self.batch_size
        cur = [mine[r] for r in range(wp)]
        ids = [topo.stream_id(self.rank, r) for r in range(wp)]
        positions = {g: (c.epoch, c.position) for c, g in zip(cur, ids, strict=True)}
        check_positions(layout, positions, topo)
        if self.infinite:
            done = [
                layout.frames_done(c.epoch, g, c.position) // b
                for c, g in zip(cur, ids, strict=True)
            ]
            total = sum(done)
            starts = [(c.epoch, c.position) for c in cur]
        else:
            # A stream that finished epoch e-1 before its first batch of epoch e stands at
            # (e-1, its length of e-1), which is the same place as (e, 0).
            last = max(c.epoch for c in cur)
            cur = [
                StreamCursor(c.rank, c.role, last, 0)
                if c.epoch == last - 1 and c.position >= layout.length(c.epoch, g)
                else c
                for c, g in zip(cur, ids, strict=True)
            ]
            epochs = {c.epoch for c in cur}
            if len(epochs) != 1:
                raise ResumeStateError(
                    describe(
                        "Stream cursors stand in different epochs",
                        expected="all streams of a rank in one epoch (epoch mode)",
                        found=[(c.role, c.epoch, c.position) for c in cur],
                    )
                )
            e = epochs.pop()
            if all(c.position >= layout.length(e, g) for c, g in zip(cur, ids, strict=True)):
                return 0, [(e + 1, 0)] * wp, st.batches
            done = [-(-c.position // b) for c in cur]
            total = sum(done)
            starts = [(c.epoch, c.position) for c in cur]
        expect = [worker_batches_done(total, num_workers, r) for r in range(wp)]
        if done != expect:
            raise ResumeStateError(
                describe(
                    "Stream cursors are not a DataLoader round-robin prefix",
                    expected=f"batches per stream {expect}",
                    found=f"{done}",
                    fix="record cursors with CursorTracker.consume on every batch, in order",
                )
            )
        return total % wp, starts, st.batches

    def _keyframe_cuts(self) -> dict[int, list[int]]:
        cuts: dict[int, list[int]] = {}
        if not self.meta.camera_keys:
            return cuts
        cam = self.meta.camera_keys[0]
        times: dict[str, list[float]] = {}
        for e in self.episodes:
            ep = self.meta.episode(e)
            ref = ep.videos[cam]
            if ref.path not in times:
                path = inside_root(self.meta.root, ref.path, episode=e)
                times[ref.path] = VideoReader(path, episode=e).keyframe_times()
            fps = self.meta.fps
            cuts[e] = sorted(
                {
                    round((t - ref.from_timestamp) * fps)
                    for t in times[ref.path]
                    if ref.from_timestamp - 1e-6 <= t < ref.from_timestamp + ep.length / fps
                }
            )
        return cuts

    # -- torch protocol ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This worker's stream, one item per frame (for a DataLoader with ``batch_size``)."""
        if self.on_error == "skip":
            raise ValueError(
                describe(
                    "on_error='skip' needs the batch path",
                    expected="dataset.dataloader(...) without collate_fn, or iter_batches()",
                    found="iteration item by item (a DataLoader with batch_size or collate_fn)",
                    fix="use dataset.dataloader(num_workers=...): skipped frames keep their "
                    "positions there, which item-by-item batching cannot do",
                )
            )
        return self._generate(*self._start_stream())

    def iter_batches(
        self, *, image_dtype: str | None = None, ring: torch.Tensor | None = None
    ) -> Iterator[dict[str, Any]]:
        """This worker's stream as whole batches, equal to ``default_collate`` of the items.

        What :meth:`dataloader` uses (with ``batch_size=None``): the batches a DataLoader with
        ``batch_size`` would make from :meth:`__iter__`, built column by column instead of item
        by item and collated, which is several times cheaper per frame.

        ``ring`` (for :class:`BatchLoader`, whose iterator frees the slots): a shared flag
        table ``(MAX_WORKERS, RING)``; in a DataLoader worker, camera buffers then come from a
        ring of :data:`RING` shared-memory buffers, and each batch carries :data:`RELEASE_KEY`.
        """
        return self._generate_batches(*self._start_stream(), image_dtype=image_dtype, ring=ring)

    def _start_stream(self):
        bind_to_trainer()  # a worker exits when the training process dies (stream/lifetime.py)
        info = get_worker_info()
        num_workers = info.num_workers if info is not None else 0
        worker = info.id if info is not None else 0
        if num_workers > MAX_WORKERS:
            raise ValueError(describe("Too many workers", expected=f"<= {MAX_WORKERS}"))
        layout = self.layout(num_workers)
        wp = max(num_workers, 1)
        slot = self._slots[worker]
        resumed = False
        if self._loaded is not None:
            st, self._loaded = self._loaded, None
            role, epoch, position = st["role"], st["epoch"], st["position"]
            resumed = True
        elif int(slot[1]) == 0:
            rotation, starts, _ = self.start_point(num_workers)
            role = (worker + rotation) % wp
            epoch, position = starts[role]
            resumed = self.resume_state is not None or self.resume_step > 0
        else:
            role, epoch, position = worker, int(slot[0]), 0
        slot[1] = 1
        slot[0] = epoch + 1
        stream = Topology(self.world_size, num_workers).stream_id(self.rank, role)
        self._live.update(role=role, num_workers=num_workers, epoch=epoch, position=position)
        if resumed:
            self._log_resume(layout.view(epoch, stream), stream, epoch, position)
        return layout, stream, role, num_workers, epoch, position, slot

    def _log_resume(self, sched: Schedule, stream: int, epoch: int, position: int) -> None:
        if position >= sched.frames_per_stream:
            logger.info("resume: stream=%d epoch=%d chunk=- frame=- (epoch done)", stream, epoch)
            return
        group, offset = next(iter(sched.iter_groups(epoch, stream, position)))
        done = np.bincount(group.order[:offset], minlength=len(group.segments))
        j = int(group.order[offset])
        seg = group.segments[j]
        logger.info(
            "resume: stream=%d epoch=%d chunk=%d frame=%d (episode %d, position %d)",
            stream,
            epoch,
            seg.chunk_id,
            seg.start + int(done[j]),
            seg.episode_index,
            position,
        )

    def _configure_decoding(self) -> None:
        """Apply the decoding knobs of :class:`StreamTuning` for this process (see there)."""
        worker = _in_worker()
        t = self.tuning
        cams = (
            t.camera_threads
            if t.camera_threads is not None
            else (1 if worker else len(self.meta.camera_keys))
        )
        self.items.camera_threads = max(cams, 1)

    def _generate(self, sched, stream, role, num_workers, epoch, position, slot):
        """Items of the stream from ``(epoch, position)``, one dict per frame."""
        self._configure_decoding()
        live = self._live
        blocks = self._blocks(
            sched, stream, role, num_workers, epoch, position, slot, lambda: 1 << 30
        )
        for block in blocks:
            if not block.size:
                continue
            with _torch_threads():
                cols = self.items.finish(_assemble([block]))
            for i, cursor in enumerate(block.cursor.tolist()):
                live["epoch"], live["position"] = cursor[3], cursor[4]
                yield {k: v[i] for k, v in cols.items()}

    def _generate_batches(
        self,
        sched,
        stream,
        role,
        num_workers,
        epoch,
        position,
        slot,
        image_dtype=None,
        ring=None,
    ):
        """The same frames as :meth:`_generate`, already collated into the DataLoader's batches.

        A DataLoader worker's batch ``k`` holds its stream's items ``[k*B, (k+1)*B)``; blocks
        are cut at those places, and a batch is assembled once from its blocks (a short last
        batch is dropped with drop_last). The result equals ``default_collate`` of the items.
        """
        self._configure_decoding()
        b = self.batch_size
        pending: list[_Block] = []
        shared = _in_worker()
        opts = self.items.options
        target = _BatchTarget(
            self.items,
            b,
            shared=shared,
            final=(image_dtype or opts.image_dtype) != "float32" and opts.image_transforms is None,
            ring=self._worker_ring(ring) if ring is not None and shared else None,
        )
        blocks = self._blocks(
            sched, stream, role, num_workers, epoch, position, slot, lambda: b - target.have, target
        )
        for block in blocks:
            if block.size:
                pending.append(block)
                target.have += block.size
            have = target.have
            if have == b or (have and not block.size and not self.drop_last):
                last = pending[-1].cursor[-1].tolist()
                self._live["epoch"], self._live["position"] = last[3], last[4]
                skipped = [r for blk in pending for r in blk.skipped]
                cols = _assemble(pending, self._empty_columns)
                direct = target.take(pending)
                if direct:  # cameras first, as in an item
                    cols = {**direct, **{k: v for k, v in cols.items() if k not in direct}}
                with _torch_threads():
                    batch = self.items.finish(cols, image_dtype=image_dtype, shared=shared)
                if skipped:
                    batch[SKIPPED_KEY] = skipped
                if target.ticket is not None:
                    batch[RELEASE_KEY] = target.ticket
                pending = []
                yield batch

    def _worker_ring(self, flags: torch.Tensor):
        """(the loader's flag table, this worker's row, this process's buffers for it)."""
        info = get_worker_info()
        bufs = self._ring.setdefault(flags.data_ptr(), {})
        return flags, info.id if info is not None else 0, bufs

    def _empty_columns(self) -> dict[str, np.ndarray]:
        """Zero-row numpy columns (a batch whose frames were all skipped), from a good frame."""
        for e in self.episodes:
            with contextlib.suppress(*SKIP_ERRORS):
                with self.items.episode_reader(e, 0, 1) as r:
                    return {k: v[:0] for k, v in r.raw(range(1)).items()}
        return {}

    def _blocks(self, sched, stream, role, num_workers, epoch, position, slot, room, into=None):
        """The stream's :class:`_Block` s in emission order; an empty block ends the stream.

        ``room()`` is the largest block the consumer wants next (blocks never cross it);
        ``into`` (a :class:`_BatchTarget`) takes the cameras' frames straight into its buffers.
        ``sched`` is a :class:`~robo_resume.index.elastic.Layout` (a remainder epoch after an
        elastic resume, then the schedule's epochs) or a plain :class:`Schedule`.
        """
        layout = sched if isinstance(sched, Layout) else Layout(sched)
        while True:
            slot[0] = epoch + 1
            if position < layout.length(epoch, stream):
                for group, offset in layout.iter_groups(epoch, stream, position):
                    yield from self._read_group(group, offset, role, num_workers, epoch, room, into)
            if not self.infinite:
                yield _Block(0, [], np.zeros((0, 5), dtype=np.int64))
                return
            epoch, position = epoch + 1, 0

    def _read_group(
        self, group: Group, offset: int, role: int, num_workers: int, epoch: int, room, into=None
    ) -> Iterator[_Block]:
        """Blocks of the group's frames from ``offset`` on (numpy parts, emission order).

        A read that fails with one of :data:`SKIP_ERRORS` raises the same error type with the
        streamed frames added (``on_error="raise"``), or (``"skip"``) skips the segment from
        that read on: its remaining frames keep their positions and cursor rows but are
        neither read nor yielded, and the block carries a skip record. Segments the resume
        state recorded as skipped are skipped from the recorded frame on without a retry.
        Assumes a broken file fails at the same read when read again from an earlier frame
        (block cuts after a resume position are the uninterrupted run's).

        With ``into`` (a :class:`_BatchTarget`), camera frames are decoded into its buffers
        at the block's positions in the batch (``into()`` gives the buffers and the position of
        the block's first frame) and left out of the parts.
        """
        segs = group.segments
        k = len(segs)
        order = group.order
        nxt = [s.start for s in segs]
        for j, c in enumerate(np.bincount(order[:offset], minlength=k)):
            nxt[j] += int(c)
        skip = self.on_error == "skip"
        bad = [self._skip_from.get((epoch, s.chunk_id, s.start), s.stop) for s in segs]
        readers: list[Any] = [None] * k
        position = group.position + offset
        most = self.tuning.block_frames * k
        head = np.array([self.rank, role, num_workers, epoch], dtype=np.int64)
        try:
            i = offset
            while i < len(order):
                labels = order[i : i + min(most, room())]
                n = len(labels)
                parts = []
                keep: np.ndarray | None = None  # positions of the block that are read
                events: list[dict[str, Any]] = []
                for j in np.unique(labels).tolist():
                    seg = segs[j]
                    rows = np.flatnonzero(labels == j)
                    c = len(rows)
                    good = min(c, max(0, bad[j] - nxt[j]))
                    if good:
                        frames = range(nxt[j], nxt[j] + good)
                        try:
                            if readers[j] is None:
                                readers[j] = self.items.episode_reader(
                                    seg.episode_index, nxt[j], seg.stop
                                )
                            dest = None
                            if into is not None:
                                bufs, base = into()
                                at = rows[:good] + base
                                dest = {cam: (buf, at) for cam, buf in bufs.items()}
                            raw = readers[j].raw(frames, dest)
                        except SKIP_ERRORS as exc:
                            where = (
                                f"frames {frames.start}..{frames.stop - 1} of episode "
                                f"{seg.episode_index} (chunk {seg.chunk_id}, epoch {epoch}, "
                                f"stream position {position + int(rows[0])})"
                            )
                            if not skip:
                                raise _streaming_error(exc, where) from exc
                            _discard(readers[j])
                            readers[j], bad[j], good = None, nxt[j], 0
                            events.append(_skip_record(exc, seg, nxt[j], epoch, self.rank, role))
                        else:
                            parts.append((raw, None if good == n else rows[:good]))
                    if good < c:
                        if keep is None:
                            keep = np.ones(n, dtype=bool)
                        keep[rows[good:]] = False
                    nxt[j] += c
                    if nxt[j] >= seg.stop and readers[j] is not None:
                        readers[j].close()
                        readers[j] = None
                kept = None
                if keep is not None:  # number the read rows 0..kept-1 in block order
                    renum = np.cumsum(keep) - 1
                    parts = [(raw, renum[r]) for raw, r in parts]
                    kept = int(keep.sum())
                cursor = np.empty((n, 5), dtype=np.int64)
                cursor[:, :4] = head
                cursor[:, 4] = np.arange(position + 1, position + n + 1)
                position += n
                i += n
                yield _Block(n, parts, cursor, kept, events, keep)
        finally:
            for r in readers:
                if r is not None:
                    r.close()

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
        self._loaded = check_stream_state(
            state,
            self.fingerprint,
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
        import the main script again and receive the dataset by pickle: a missing
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
        if num_workers > 0 and "multiprocessing_context" not in kwargs and WORKER_START_METHOD:
            kwargs["multiprocessing_context"] = worker_context(WORKER_START_METHOD)
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
        float_keys: tuple[str, ...] = ()
        if (
            num_workers > 0
            and self.items.options.image_dtype == "float32"
            and self.items.options.image_transforms is None
            and not kwargs.get("pin_memory", False)
        ):
            float_keys = self.meta.visual_keys  # video and image features
        if stateful:
            # torchdata is optional: imported only for the loader that needs it
            from .stream.stateful import StatefulBatchLoader

            return StatefulBatchLoader(
                _Batches(self, "uint8" if float_keys else None),
                float_keys=float_keys,
                num_workers=num_workers,
                **kwargs,
            )
        return BatchLoader(
            _Batches(self, "uint8" if float_keys else None),
            float_keys=float_keys,
            num_workers=num_workers,
            **kwargs,
        )

    def tracker(self) -> CursorTracker:
        """A :class:`CursorTracker` for batches of this dataset."""
        return CursorTracker(self)

    def __repr__(self) -> str:
        return (
            f"ChunkedEpisodeDataset(root={str(self.meta.root)!r}, episodes={len(self.episodes)}, "
            f"chunks={len(self.chunks)}, batch_size={self.batch_size}, seed={self.seed}, "
            f"rank={self.rank}/{self.world_size}, mode={'infinite' if self.infinite else 'epoch'})"
        )

    # -- hooks for robo_resume.mix (appended; keep at the end of the class) ---------------------
    def stream_batches(
        self,
        role: int,
        num_workers: int,
        epoch: int,
        position: int,
        *,
        image_dtype: str | None = None,
        log_resume: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Batches of stream ``role`` of this rank (``num_workers`` workers) from a position.

        The batches :meth:`iter_batches` yields for that stream after it stood at ``(epoch,
        position)`` (frames of ``epoch`` already delivered), in any process and without
        touching the shared epoch table: the epoch ends the iterator in epoch mode, epochs
        follow each other in infinite mode. Used by :class:`robo_resume.mix.MixedDataset`,
        which decides itself where each source's streams stand. ``log_resume`` logs the
        stream's ``resume:`` line.
        """
        bind_to_trainer()
        sched = self.schedule(num_workers)
        stream = Topology(self.world_size, num_workers).stream_id(self.rank, role)
        if log_resume:
            self._log_resume(Layout(sched).view(epoch, stream), stream, epoch, position)
        slot = torch.zeros(4, dtype=torch.int64)  # private: the epoch table stays untouched
        return self._generate_batches(
            sched, stream, role, num_workers, epoch, position, slot, image_dtype=image_dtype
        )
