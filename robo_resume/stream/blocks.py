"""Blocks and batches inside a worker: the contiguous frame blocks a stream reads, the
shared-memory ring the frames are decoded into (:class:`BatchTarget`), and their assembly
into batches; skip records for ``on_error="skip"``."""

from __future__ import annotations

import contextlib
import os
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..index.elastic import Layout
from ..index.segments import Segment
from ..items.buffers import shared_views
from ..items.builder import ItemBuilder
from ..items.ranges import EpisodeRangeReader
from ..keys import CURSOR_KEY
from ..workers import WORKER_DIED_HINT as WORKER_DIED_HINT  # re-exported (tests, callers)
from .epochs import WorkerEpoch

RING = 4
"""Shared-memory batch buffers a DataLoader worker of :meth:`ChunkedEpisodeDataset.dataloader`
reuses in turn (see :class:`BatchTarget`): writing into fresh shared memory costs more per
frame than decoding it at 480x640, because the kernel faults in and zeroes every page."""


@dataclass(frozen=True)
class StreamRun:
    """One stream played from a position: what the reading methods pass each other.

    ``layout`` (a :class:`~robo_resume.index.elastic.Layout`) gives the stream's groups per
    epoch; ``stream`` is its global id, ``role`` its role on this rank among ``num_workers``;
    it starts after ``position`` frames of ``epoch``; ``epochs`` is the worker's row of the
    epoch table (:class:`~robo_resume.stream.epochs.WorkerEpoch`; a private one for a mix's
    sources), marked as each epoch starts; ``live`` the dataset's record of where the stream
    stands (``epoch`` and ``position`` are updated as batches are handed out: the
    StatefulDataLoader state).
    """

    layout: Layout
    stream: int
    role: int
    num_workers: int
    epoch: int
    position: int
    epochs: WorkerEpoch
    live: dict[str, Any]


@dataclass
class Block:
    """``size`` consecutive frames of a stream: numpy parts, each with its rows in the block
    (None: all rows), and the cursors ``(size, 5)``. An empty block marks the stream's end.

    With skipped frames (``on_error="skip"``), ``kept`` frames of the ``size`` positions are
    read (the parts' rows number those), and ``skipped`` holds the skip records."""

    size: int
    parts: list[tuple[dict[str, np.ndarray], np.ndarray | None]]
    cursor: np.ndarray
    kept: int | None = None
    skipped: list[dict[str, Any]] = field(default_factory=list)
    keep: np.ndarray | None = None  # which positions were read (None: all)

    @property
    def frames(self) -> int:
        """Frames read (rows in the batch)."""
        return self.size if self.kept is None else self.kept


def streaming_error(exc: Exception, where: str, *, skippable: bool = True) -> Exception:
    """``exc``'s type and message plus what the stream was reading (for on_error="raise").

    ``skippable``: whether ``on_error='skip'`` would skip this error (the message suggests it
    only then; a remote read that failed after its retries is raised either way)."""
    msg = f"{exc} Raised while streaming {where}."
    if skippable:
        msg += (
            " To train on without the chunks whose files fail, pass on_error='skip' (skips are "
            "logged and kept in the resume state)."
        )
    try:
        return type(exc)(msg)
    except Exception:  # an exception type with another constructor: keep it as it is
        return exc


def skip_record(
    exc: Exception, seg: Segment, frame: int, epoch: int, rank: int, role: int
) -> dict[str, Any]:
    """The JSON-safe record of a skipped segment (see :data:`SKIPPED_KEY`)."""
    text = str(exc)
    found = re.search(r"At file (.+?)(?:, episode \d+|, frame \d+)*\.(?: |$)", text)
    return {
        "epoch": int(epoch),
        "chunk": int(seg.chunk_id),
        "episode": int(seg.episode_index),
        "start": int(seg.start),
        "frame": int(frame),
        "stop": int(seg.stop),
        "rank": int(rank),
        "role": int(role),
        "file": found.group(1) if found else None,
        "error": f"{type(exc).__name__}: {text}"[:500],
    }


def discard(reader: EpisodeRangeReader | None) -> None:
    """Close a failed reader's decoders instead of keeping them for reuse."""
    if reader is None:
        return
    videos, reader.videos = reader.videos, {}
    for v in videos.values():
        with contextlib.suppress(Exception):
            v.close()


def in_worker() -> bool:
    return get_worker_info() is not None


@contextlib.contextmanager
def torch_threads():
    """One torch thread while building a batch in the main process (no-op in workers).

    The per-batch conversions are small memory-bound copies: with several torch threads on a
    busy machine they run several times slower than with one. The caller's setting is restored.
    """
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


_FLAG = " flag"  # the buffer's first entry (never a feature key: those have no spaces)


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)  # torch >= 2.1


def _uses(t: torch.Tensor) -> int:
    """How many tensors (of any process-local owner) hold ``t``'s storage."""
    assert _USE_COUNT is not None  # _PlainRing.take checks first
    return _USE_COUNT(t.untyped_storage()._cdata)


class _PlainRing:
    """A plain DataLoader worker's :data:`RING` reusable buffers for its batches' cameras.

    For batches collated by torch (``DataLoader(ds, batch_size=...)``), which reach the main
    process as :class:`robo_resume.items.rows.RingBatch`. Each buffer is one shared-memory
    storage: an int64 flag at offset 0, then one ``(size, ...)`` tensor per camera. A buffer
    is free when (1) its flag is 0: :meth:`take` sets it to the batch's token, and only the
    main process sets 0 again, when it has dropped the cameras of the RingBatch it received (a
    batch that leaves the worker in any other form, say re-wrapped by a custom collate_fn,
    keeps its buffer for good: the worker takes fresh memory instead, never a buffer the main
    process may still read), and (2) nothing in this worker holds its storage any more (items
    a wrapper keeps, rows, a batch waiting to be pickled): the storage's use count is back to
    the ring's own. Buffers are made on first need; with all :data:`RING` in use, :meth:`take`
    returns None (fresh memory then).
    """

    def __init__(self, specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        self.specs = specs
        self.cameras = tuple(specs)
        self.slots: list[tuple[torch.Tensor, dict[str, torch.Tensor], int]] = []
        self._sent = 0

    def take(self) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, int]] | None:
        """Fresh views of a free buffer's cameras and its ``(flag, token)``, else None."""
        if _USE_COUNT is None:  # a torch that cannot say who holds a storage: no reuse
            return None
        for flag, bufs, base in self.slots:
            if int(flag[0]) == 0 and _uses(flag) == base:
                return self._hand_out(flag, bufs)
        if len(self.slots) >= RING:
            return None
        views = shared_views({_FLAG: ((1,), np.dtype(np.int64)), **self.specs})
        flag = views.pop(_FLAG)
        flag.zero_()
        self.slots.append((flag, views, _uses(flag)))
        return self._hand_out(flag, views)

    def _hand_out(self, flag: torch.Tensor, bufs: dict[str, torch.Tensor]):
        # new view objects: a holder of the batch then counts in the storage's use count
        self._sent = (self._sent + 1) & 0xFFFFFF
        token = (os.getpid() << 24) | self._sent
        flag[0] = token  # in use until the main process drops the batch (see the class)
        return {c: t[:] for c, t in bufs.items()}, (flag, token)


def plain_ring(
    rings: dict[tuple[str, int], _PlainRing], items: ItemBuilder, size: int, final: bool
) -> _PlainRing | None:
    """The worker's :class:`_PlainRing` in ``rings`` for batches of ``size`` (uint8 cameras
    decoded into it when ``final``, else float32 conversions; depth maps float32 in both),
    made on first use; None with image transforms (their output shape is the transform's)."""
    if items.options.image_transforms is not None:
        return None
    dtype = np.dtype(np.uint8 if final else np.float32)
    key = (dtype.str, size)
    if key not in rings:
        shapes = {c: items.camera_shape(c) for c in items.meta.camera_keys}
        rings[key] = _PlainRing(
            {
                c: ((size, *s), np.dtype(np.float32) if c in items.depth else dtype)
                for c, s in shapes.items()
                if s
            }
        )
    return rings[key]


class BatchTarget:
    """The camera buffers of the batch being built, which the blocks decode straight into.

    ``final`` buffers are the batch's own tensors (uint8 output without transforms): shared
    memory in a worker, pooled memory (:data:`robo_resume.items.BUFFERS`) in the main
    process. Otherwise (float32 or transforms follow) one private scratch buffer per camera is
    reused batch after batch: the conversion reads it before the next batch is decoded (one
    per batch in flight with ``depth`` 2).

    Two cursors: the producer (the stream's blocks) plans a block with :meth:`room` and the
    buffers :meth:`__call__` gives, then calls :meth:`filled`; the consumer counts the
    positions it received in ``have`` and :meth:`take` s a batch's buffers. With ``depth`` 2
    the producer may plan (and decode) the next batch's first block before the consumer took
    the current batch: a filled batch's buffers wait in a queue for :meth:`take`.

    ``plain`` (a worker of a plain DataLoader): a :class:`_PlainRing` of buffers for the final
    camera columns (uint8, decoded into) or for the float32 conversion (:attr:`out`); the batch
    taken from one carries :attr:`release` ``(flag, token)``.
    """

    def __init__(
        self,
        items: ItemBuilder,
        size: int,
        *,
        shared: bool,
        final: bool,
        ring: Any = None,
        plain: _PlainRing | None = None,
    ) -> None:
        self.items, self.size, self.shared, self.final = items, size, shared, final
        self.cameras = list(items.meta.camera_keys)  # camera_buffers leaves out unknown shapes
        self.have = 0  # positions the consumer received of the batch it builds
        self.fill = 0  # positions the producer planned of the batch it fills
        self.depth = 1  # batches whose buffers may be in use at once (2: a block read early)
        self.overlap: Any = None  # with depth 2: a group_read.Overlap (read early now?)
        self._filled = 0  # batches filled so far (which scratch buffers the next one uses)
        self._done: deque[tuple[Any, Any, Any]] = deque()  # filled, not yet taken
        self._bufs: dict[str, torch.Tensor] | None = None
        self._arrays: dict[str, np.ndarray] = {}
        self._scratch: list[dict[str, torch.Tensor]] = []
        self._ring = ring if final and shared else None
        self._sent = 0
        self.ticket: tuple[int, int] | None = None  # (flag index, token) of the last batch
        self._taking: tuple[int, int] | None = None
        self.plain = plain if shared else None
        self.release: tuple[torch.Tensor, int] | None = None  # of the last batch taken
        self.out: dict[str, torch.Tensor] | None = None  # float32 buffers of the last batch
        self._plain_taking: tuple[torch.Tensor, int] | None = None

    def _from_ring(self) -> dict[str, torch.Tensor] | None:
        """Buffers of a free ring slot, marked in use with a new token (None: all in use).

        A slot is free when its flag is 0; the worker sets the token, the main process sets 0
        again when the batch using it is gone (only if the token still matches), so a late
        release from an earlier iterator's batch never frees another batch's slot.
        """
        assert self._ring is not None  # callers check first
        flags, row, bufs = self._ring
        free = (flags[row] == 0).nonzero()
        if not len(free):
            return None
        k = int(free[0])
        self._sent = (self._sent + 1) & 0xFFFFFF
        token = (os.getpid() << 24) | self._sent
        flags[row, k] = token
        self._taking = (row * RING + k, token)
        if k not in bufs:
            bufs[k] = self.items.camera_buffers(self.cameras, self.size, shared=True)
        return bufs[k]

    def __call__(self) -> tuple[dict[str, np.ndarray], int]:
        """The buffers (numpy views, allocated on first use per batch) and ``have``."""
        if self._bufs is None:
            if self.final:
                self._bufs = self._from_ring() if self._ring is not None else None
                if self._bufs is None and self.plain is not None:
                    got = self.plain.take()
                    if got is not None:
                        self._bufs, self._plain_taking = got
                if self._bufs is None:
                    self._bufs = self.items.camera_buffers(
                        self.cameras, self.size, shared=self.shared
                    )
            else:
                k = self._filled % self.depth
                while len(self._scratch) <= k:  # held while the stream runs, then pooled again
                    self._scratch.append(
                        self.items.camera_buffers(self.cameras, self.size, shared=False)
                    )
                self._bufs = self._scratch[k]
            self._arrays = {c: t.numpy() for c, t in self._bufs.items()}
        return self._arrays, self.fill

    def room(self) -> int:
        """Positions left in the batch the producer fills (the largest next block)."""
        return self.size - self.fill

    def filled(self, n: int) -> None:
        """The producer planned a block of ``n`` positions (at most :meth:`room`)."""
        self.fill += n
        if self.fill == self.size:  # the next block starts the next batch, in other buffers
            self._done.append((self._bufs, self._taking, self._plain_taking))
            self._bufs, self._arrays, self._taking, self._plain_taking = None, {}, None, None
            self.fill = 0
            self._filled += 1

    def take(self, blocks: list[Block]) -> dict[str, Any]:
        """The batch's camera columns (tensors if final, else numpy) and a fresh start.

        The oldest filled batch's buffers, or (a short last batch) those being filled."""
        n = self.have
        if self._done:
            bufs, taking, plain_taking = self._done.popleft()
        else:
            bufs, taking, plain_taking = self._bufs, self._taking, self._plain_taking
            self._bufs, self._arrays, self._taking, self._plain_taking = None, {}, None, None
            self.fill = 0
            self._filled += 1
        self.have = 0
        self.ticket = taking
        self.release, self.out = plain_taking, None
        if not self.final and self.plain is not None and n == self.size:
            got = self.plain.take()  # the float32 conversion's buffers
            if got is not None:
                self.out, self.release = got
        if bufs is None:
            return {}
        keep = None
        if any(b.keep is not None for b in blocks):  # skipped frames: keep the read ones
            keep = np.concatenate(
                [b.keep if b.keep is not None else np.ones(b.size, dtype=bool) for b in blocks]
            )
        out: dict[str, Any] = {}
        for c, t in bufs.items():
            t = t[:n] if n < self.size else t
            if keep is not None:
                t = t[torch.from_numpy(keep)]
            out[c] = t if self.final else t.numpy()
        return out


def assemble(
    blocks: list[Block], empty: Callable[[], dict[str, np.ndarray]] | None = None
) -> dict[str, np.ndarray]:
    """Numpy columns of consecutive blocks, each value copied once into place.

    The cursor has one row per position, the columns one row per frame read (fewer when
    frames were skipped); ``empty()`` gives zero-row columns when no frame was read.
    """
    total = sum(b.frames for b in blocks)
    if len(blocks) == 1 and len(blocks[0].parts) == 1:
        out = dict(blocks[0].parts[0][0])
        out[CURSOR_KEY] = blocks[0].cursor
        return out
    first = next((b.parts[0][0] for b in blocks if b.parts), None)
    if first is None:
        first = empty() if empty is not None else {}
    out = {k: np.empty((total, *v.shape[1:]), dtype=v.dtype) for k, v in first.items()}
    # Each column gathered from every part at once and written with one scatter: a wide
    # interleave makes a block of about one frame from each of 32 parts, whose column-by-part
    # copies would be hundreds of numpy calls a batch on the stream's thread.
    raws, places, at = [], [], 0
    for blk in blocks:
        for raw, rows in blk.parts:
            raws.append(raw)
            places.append(np.arange(at, at + blk.frames) if rows is None else rows + at)
        at += blk.frames
    if raws:
        where = np.concatenate(places) if len(places) > 1 else places[0]
        for k, col in out.items():
            parts = [raw[k] for raw in raws]
            col[where] = np.concatenate(parts) if len(parts) > 1 else parts[0]
    out[CURSOR_KEY] = np.concatenate([b.cursor for b in blocks])
    return out
