"""How a ChunkedEpisodeDataset reads: one stream's chunks, block by block, into batches.

:class:`StreamReader` plays a :class:`~robo_resume.stream.blocks.StreamRun` (a stream from a
position, decided by the dataset from its :class:`~robo_resume.stream.positions.StreamPositions`
and epoch table): it reads the stream's groups of chunks into blocks with the skip policy, and
assembles batches (or the items of a plain DataLoader) from them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..index.elastic import Layout
from ..index.schedule import Group
from ..items import ItemBuilder
from ..items.names import rename, renamed
from ..items.options import IDLE_DECODERS
from ..items.rows import block_items
from ..keys import CURSOR_KEY, RELEASE_KEY, SKIPPED_KEY
from .blocks import (
    BatchTarget,
    Block,
    StreamRun,
    assemble,
    in_worker,
    plain_ring,
    torch_threads,
)
from .group_read import GroupRead, Overlap
from .positions import StreamPositions
from .read_ahead import frames_ahead, held_bytes
from .tuning import SKIP_ERRORS, StreamTuning
from .window_read import WindowRead

logger = logging.getLogger("robo_resume")

PLAIN_LOADER_NOTE = (
    "robo_resume: items are collated in DataLoader workers (a plain torch.utils.data.DataLoader "
    "or collate_fn=). They collate back into the dataset's batches without a copy, through reused "
    "shared memory, with torch's default collate and batch_size=ds.batch_size; other collate "
    "functions or batch sizes stack every batch. ds.dataloader(num_workers=...) yields the same "
    "batches and adds len(), epochs() and on_error='skip'; see docs/tuning.md#a-plain-dataloader."
)


THREADS_FROM_PIXELS = 128 * 128
"""Frame size (pixels, largest camera) from which a ``num_workers=0`` stream decodes the chunks
of a batch on 2 threads (at least one per camera) by default; below it, on one thread (in the
background while the consumer works between batches, see ``group_read.Overlap``). From
this size swscale's conversion releases the GIL too (``format/swscale._RELEASE_GIL_FROM``).
Smaller frames decode faster on one thread, larger ones on two."""


SHUFFLE_IDLE_FILES = 32
"""Video files per camera whose decoders a shuffle-order stream keeps open between chunks."""


def _cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def read_order(
    layout: Layout, stream: int, epoch: int, position: int, *, infinite: bool
) -> Iterator[tuple[int, int, int]]:
    """The pieces ``(episode_index, start, stop)`` a stream decodes from ``(epoch, position)``
    on, in the order it decodes them (lazy; through the following epochs when ``infinite``):
    a shuffle window's chunks in the order of their first frame emitted (each decoded whole
    then), the other orders' chunks in group order. What :meth:`ItemBuilder.plan_reads`
    fetches ahead; ``layout`` must be this thread's own (:meth:`Layout.twin`)."""
    while True:
        if position < layout.length(epoch, stream):
            for group, offset in layout.iter_groups(epoch, stream, position):
                segs = group.segments
                if group.keeps_frame_order:
                    order = range(len(segs))
                else:
                    labels = group.order[offset:]
                    _, first = np.unique(labels, return_index=True)
                    order = labels[np.sort(first)].tolist()
                for j in order:
                    seg = segs[j]
                    yield seg.episode_index, seg.start, seg.stop
        if not infinite:
            return
        epoch, position = epoch + 1, 0


class StreamReader:
    """Reads streams of a ChunkedEpisodeDataset into batches.

    Args:
        items: the dataset's :class:`~robo_resume.items.ItemBuilder` (decoding, columns).
        positions: the dataset's :class:`~robo_resume.stream.positions.StreamPositions`:
            the tuning, the episodes and the resume state's skip records are read from it.
        renames: the dataset's feature renames, applied to every batch.
        batch_size, drop_last, infinite, on_error, rank: the dataset's.

    Holds a worker's reusable buffers (shared-memory rings); nothing about where a stream
    stands, which :class:`~robo_resume.stream.blocks.StreamRun` brings.
    """

    def __init__(
        self,
        items: ItemBuilder,
        positions: StreamPositions,
        renames: Mapping[str, str],
        *,
        batch_size: int,
        drop_last: bool,
        infinite: bool,
        on_error: str,
        rank: int,
    ) -> None:
        self.items, self.positions, self.renames = items, positions, renames
        self.batch_size, self.drop_last, self.infinite = batch_size, drop_last, infinite
        self.on_error, self.rank = on_error, rank
        # this worker's ring buffers: id of the loader's flag table -> slot -> camera tensors
        self._ring: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
        self._plain_rings: dict[tuple[str, int], Any] = {}  # a plain loader worker's

    @property
    def meta(self):
        """The dataset's metadata."""
        return self.items.meta

    @property
    def tuning(self) -> StreamTuning:
        """The stream tuning in force (an adopted resume state's order included)."""
        return self.positions.tuning

    def batches(
        self,
        run: StreamRun,
        *,
        image_dtype: str | None = None,
        ring: torch.Tensor | None = None,
        plain: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """The stream's batches from ``run``'s position, equal to ``default_collate`` of its
        items (see :meth:`_generate_batches`). ``ring``: the loader's shared flag table (see
        :meth:`ChunkedEpisodeDataset.iter_batches`); ``plain``: the batches of a plain
        DataLoader's items (the short last batch always kept, cameras in a plain ring)."""
        return self._generate_batches(
            run, image_dtype=image_dtype, ring=ring, whole_tail=plain, plain=plain
        )

    def items_of(self, run: StreamRun) -> Iterator[dict[str, Any]]:
        """The stream's items from ``run``'s position, one dict per frame (see
        :meth:`_generate`)."""
        return self._generate(run)

    def _configure_decoding(self) -> None:
        """Apply the decoding knobs of :class:`StreamTuning` for this process (see there)."""
        worker = in_worker()
        t = self.tuning
        cams = len(self.meta.camera_keys)
        if t.camera_threads is not None:
            threads = t.camera_threads
        elif worker:
            threads = 1  # the workers keep the cores busy
        elif self._frame_pixels() >= THREADS_FROM_PIXELS:
            threads = max(cams, min(2, _cores()))
        else:
            threads = 1  # small frames: another thread costs more in GIL hand-offs than it gives
        self.items.camera_threads = max(threads, 1)
        # every open chunk's decoders stay reusable when its group ends (a group's chunks end
        # together: without this a wide interleave reopened most of its files per group); the
        # shuffle order reads one chunk at a time from anywhere: a decoder per file, up to 32
        wide = t.interleave if t.resolved_order == "interleave" else SHUFFLE_IDLE_FILES
        self.items.idle_decoders = max(IDLE_DECODERS, wide * cams)

    def _frame_pixels(self) -> int:
        """Pixels of the largest camera frame (0 without cameras)."""
        shapes = [self.items.camera_shape(c) for c in self.meta.camera_keys]
        return max((int(sh[-1]) * int(sh[-2]) for sh in shapes if sh is not None), default=0)

    def _generate(self, run: StreamRun):
        """Items of the stream from ``(epoch, position)``, one dict per frame.

        The items of each of :meth:`_generate_batches`' batches (the short last one always
        included), in order, as :class:`~robo_resume.items.rows.BlockItem` s of
        :class:`~robo_resume.items.rows.BlockRow` views: ``default_collate`` of a DataLoader
        whose ``batch_size`` is the dataset's gives back these batches without a copy (in a
        worker, with the cameras in its :class:`~robo_resume.stream.blocks._PlainRing`).
        """
        live = run.live
        batches = self._generate_batches(run, whole_tail=True, plain=True)
        for batch in batches:
            where = batch[CURSOR_KEY][:, 3:].tolist()
            release = batch.pop(RELEASE_KEY, None)  # (flag, token, cameras): a worker's ring
            items = block_items(batch, len(where), release)
            del batch  # the items hold it
            item = None
            for item, (e, p) in zip(items, where, strict=True):
                live["epoch"], live["position"] = e, p
                yield item
            del items, item  # drop the last batch before the next is built

    def _generate_batches(
        self, run: StreamRun, image_dtype=None, ring=None, whole_tail=False, plain=False
    ):
        """The same frames as :meth:`_generate`, already collated into the DataLoader's batches.

        A DataLoader worker's batch ``k`` holds its stream's items ``[k*B, (k+1)*B)``; blocks
        are cut at those places, and a batch is assembled once from its blocks (a short last
        batch is dropped with drop_last, kept with ``whole_tail``). The result equals
        ``default_collate`` of the items. ``plain`` (the items of a plain DataLoader): in a
        worker, cameras go into the worker's :class:`~robo_resume.stream.blocks._PlainRing`
        and the batch carries :data:`RELEASE_KEY` ``(flag, token, cameras)``.
        """
        self._configure_decoding()
        b = self.batch_size
        pending: list[Block] = []
        shared = in_worker()
        opts = self.items.options
        final = (image_dtype or opts.image_dtype) != "float32" and opts.image_transforms is None
        target = BatchTarget(
            self.items,
            b,
            shared=shared,
            final=final,
            ring=self._worker_ring(ring) if ring is not None and shared else None,
            plain=plain_ring(self._plain_rings, self.items, b, final) if plain and shared else None,
        )
        # in the main process, the stream's next block decodes on the decoding threads while
        # this batch is assembled and used (in a worker, the other workers keep the cores busy);
        # with one decoding thread, only while the consumer spends time between batches
        if not shared:
            target.depth = 2
            target.overlap = Overlap(adaptive=self.items.camera_threads <= 1)
        overlap, back = target.overlap, time.perf_counter()
        blocks = self._blocks(run, target)
        for block in blocks:
            if block.size:
                pending.append(block)
                target.have += block.size
            have = target.have
            if have == b or (have and not block.size and (whole_tail or not self.drop_last)):
                last = pending[-1].cursor[-1].tolist()
                run.live["epoch"], run.live["position"] = last[3], last[4]
                skipped = [r for blk in pending for r in blk.skipped]
                cols = assemble(pending, self._empty_columns)
                direct = target.take(pending)
                if direct:  # cameras first, as in an item
                    cols = {**direct, **{k: v for k, v in cols.items() if k not in direct}}
                with torch_threads():
                    batch = self.items.finish(
                        cols, image_dtype=image_dtype, shared=shared, into=target.out
                    )
                if skipped:
                    batch[SKIPPED_KEY] = skipped
                if target.ticket is not None:
                    batch[RELEASE_KEY] = target.ticket
                if target.release is not None:
                    assert target.plain is not None  # release: a buffer of target.plain's
                    cams = renamed(target.plain.cameras, self.renames)  # as the batch names them
                    batch[RELEASE_KEY] = (*target.release, cams)
                pending = []
                handed = time.perf_counter()
                yield rename(batch, self.renames)
                if overlap is not None:
                    now = time.perf_counter()
                    overlap.batch(now - handed, now - back)
                    back = now

    def _worker_ring(self, flags: torch.Tensor):
        """(the loader's flag table, this worker's row, this process's buffers for it)."""
        info = get_worker_info()
        bufs = self._ring.setdefault(flags.data_ptr(), {})
        return flags, info.id if info is not None else 0, bufs

    def _empty_columns(self) -> dict[str, np.ndarray]:
        """Zero-row numpy columns (a batch whose frames were all skipped), from a good frame."""
        for e in self.positions.episodes.tolist():
            with contextlib.suppress(*SKIP_ERRORS):
                with self.items.episode_reader(e, 0, 1) as r:
                    return {k: v[:0] for k, v in r.raw(range(1)).items()}
        return {}

    def _blocks(self, run: StreamRun, target: BatchTarget):
        """The stream's :class:`Block` s in emission order; an empty block ends the stream.

        ``target`` (a :class:`BatchTarget`) bounds the blocks (never across its batches) and
        takes the cameras' frames straight into its buffers. ``run.layout`` is a
        :class:`~robo_resume.index.elastic.Layout` (a remainder epoch after an elastic resume,
        then the schedule's epochs) or a plain :class:`Schedule`.
        """
        sched = run.layout
        layout = sched if isinstance(sched, Layout) else Layout(sched)
        stream, role, num_workers, row = run.stream, run.role, run.num_workers, run.epochs
        epoch, position = run.epoch, run.position
        if not self.items.plans_reads:
            yield from self._play(layout, stream, role, num_workers, row, epoch, position, target)
            return
        # a remote dataset: its next chunks' bytes are fetched ahead, until the stream ends
        self.items.plan_reads(
            read_order(layout.twin(), stream, epoch, position, infinite=self.infinite)
        )
        try:
            yield from self._play(layout, stream, role, num_workers, row, epoch, position, target)
        finally:
            self.items.end_plan()

    def _play(self, layout, stream, role, num_workers, row, epoch, position, target):
        while True:
            row.playing(epoch)
            if position < layout.length(epoch, stream):
                for group, offset in layout.iter_groups(epoch, stream, position):
                    yield from self._read_group(group, offset, role, num_workers, epoch, target)
            if not self.infinite:
                yield Block(0, [], np.zeros((0, 5), dtype=np.int64))
                return
            epoch, position = epoch + 1, 0

    def _read_group(
        self, group: Group, offset: int, role: int, num_workers: int, epoch: int, target
    ) -> Iterator[Block]:
        """Blocks of the group's frames from ``offset`` on: a :class:`GroupRead` (see there), or
        for the shuffle order a :class:`~robo_resume.stream.window_read.WindowRead`."""
        if not group.keeps_frame_order:
            return iter(
                WindowRead(
                    self.items,
                    group,
                    offset,
                    head=(self.rank, role, num_workers, epoch),
                    target=target,
                    skip=self.on_error == "skip",
                    bad=[self.positions.skipped_from(epoch, s) for s in group.segments],
                )
            )
        return iter(
            GroupRead(
                self.items,
                group,
                offset,
                head=(self.rank, role, num_workers, epoch),
                target=target,
                skip=self.on_error == "skip",
                bad=[self.positions.skipped_from(epoch, s) for s in group.segments],
                ahead=self.read_ahead(len(group.segments)),
                block_frames=self.tuning.block_frames,
            )
        )

    def read_ahead(self, open_segments: int) -> int:
        """Frames decoded per read of a segment when a block wants fewer (1: no read-ahead);
        see :func:`~robo_resume.stream.read_ahead.frames_ahead`."""
        return frames_ahead(
            open_segments,
            batch_size=self.batch_size,
            skip=self.on_error == "skip",
            frame_bytes=self.frame_bytes(),
            block_frames=self.tuning.block_frames,
        )

    def frame_bytes(self) -> int:
        """Bytes one frame (all cameras) takes while read ahead (:func:`held_bytes`)."""
        shape, depth = self.items.camera_shape, self.items.depth
        return held_bytes(
            (shape(c) for c in self.meta.camera_keys if c not in depth),
            (shape(c) for c in self.meta.camera_keys if c in depth),
        )
