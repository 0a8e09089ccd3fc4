"""One shuffle window of a stream read into blocks (the shuffle order, ``StreamTuning(order=
"shuffle")``).

A window is a group of short chunks (segments) whose frames come out in a uniform random order
(:func:`~robo_resume.index.groups.group_frames`). :class:`WindowRead` decodes a segment whole the
first time the window emits one of its frames (one parquet range, one seek per camera), keeps
its frames as decoded (YUV, referenced, not copied) and its data columns in a table of the
window, and converts each frame straight into its row of the batch when its position comes. A
segment's frames are let go when its last frame is emitted, so a stream holds at most one
window's frames (``StreamTuning.shuffle_frames``), with 2-frame chunks about a quarter of them,
in the reused memory of a :class:`~robo_resume.format.frame_store.FrameStore` per camera.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..format.rgb import planar_rgb_rows
from ..index.groups import Group
from ..items.builder import ItemBuilder
from .blocks import BatchTarget, Block, discard, skip_record, streaming_error
from .tuning import REMOTE_ERRORS, SKIP_ERRORS

__all__ = ["WindowRead"]


class WindowRead:
    """The blocks of one shuffle window's frames from ``offset`` on, in the window's order.

    The same contract as :class:`~robo_resume.stream.group_read.GroupRead` (which reads the
    interleave orders): each block holds at most the room left in the batch ``target`` fills,
    camera frames go straight into its buffers at the block's positions, the data columns are
    the block's one part; ``head`` is the cursor's ``(rank, role, num_workers, epoch)``;
    ``bad[j]`` the first frame of segment ``j`` not to read (its stop, or where the resume state
    recorded a skip). A segment whose read fails with one of :data:`SKIP_ERRORS` raises that
    error type with the streamed frames named (``skip`` False), or is skipped whole: its
    positions keep their cursor rows, are neither read nor yielded, and the block carries the
    skip record (from the segment's first frame: the read of it failed).
    """

    def __init__(
        self,
        items: ItemBuilder,
        group: Group,
        offset: int,
        *,
        head: tuple[int, int, int, int],
        target: BatchTarget,
        skip: bool,
        bad: list[int],
    ) -> None:
        self.items, self.group, self.offset, self.target = items, group, offset, target
        self.segs = segs = group.segments
        k = len(segs)
        self.labels, self.offsets = group.order, group.offsets
        self.first = np.fromiter((s.start for s in segs), np.int64, k)
        lengths = np.fromiter((s.length for s in segs), np.int64, k)
        self.rows_at = np.cumsum(lengths) - lengths  # a segment's first row in the table
        self.total = int(lengths.sum())
        self.left = np.bincount(self.labels[offset:], minlength=k)  # frames each still emits
        self.bad = np.asarray(bad, dtype=np.int64).copy()
        self.skip = skip
        self.loaded = np.zeros(k, dtype=bool)
        self.cams: list[dict[str, tuple[int, list]] | None] = [None] * k
        self.length = np.zeros(k, dtype=np.int64)  # each loaded segment's episode length
        self.table: dict[str, np.ndarray] | None = None  # the window's data columns
        self.position = group.position + offset
        self.head = np.array(head, dtype=np.int64)
        self.cameras = list(items.meta.camera_keys)
        self.stores = {cam: items.frame_store(cam) for cam in self.cameras}
        # a camera's delta window: the frame offsets of its places (None: the frame itself)
        self.places = {
            cam: items.window_offsets[cam][0][0] if cam in items.window_offsets else None
            for cam in self.cameras
        }

    def __iter__(self) -> Iterator[Block]:
        i, n = self.offset, len(self.labels)
        try:
            while i < n:
                size = min(self.target.room(), n - i)
                yield self._block(i, size)
                i += size
        finally:  # a stream abandoned inside the window: its held frames go back
            for j in range(len(self.cams)):
                self._release(j)

    def _release(self, j: int) -> None:
        """Give segment ``j``'s held frames back to the stores."""
        cams, self.cams[j] = self.cams[j], None
        if cams:
            for cam, (_, keys) in cams.items():
                self.stores[cam].free(keys)

    def _decode(self, j: int) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, list]], int]:
        """Decode segment ``j`` whole: its columns, its cameras' held frames, its episode's
        length (on a decoding thread with ``num_workers=0``; each segment its own decoders)."""
        seg = self.segs[j]
        reader = None
        try:
            reader = self.items.episode_reader(seg.episode_index, seg.start, seg.stop)
            cols, cams = reader.hold(self.stores)
        except BaseException:
            discard(reader)  # a failed segment's decoders are closed, not reused
            raise
        reader.close()  # its decoders go back to the builder for the next segments
        return cols, cams, reader.ep.length

    def _keep(
        self, j: int, outcome: tuple[Any, Exception | None], events: list, position: int
    ) -> None:
        """Keep a decoded segment, or raise or skip its failure (in the order of emission;
        ``position``: the stream position of the segment's first frame emitted)."""
        self.loaded[j] = True
        done, exc = outcome
        seg = self.segs[j]
        if exc is not None:
            if not isinstance(exc, (*SKIP_ERRORS, *REMOTE_ERRORS)):
                raise exc
            if not self.skip or isinstance(exc, REMOTE_ERRORS):
                epoch = int(self.head[3])
                where = (
                    f"frames {seg.start}..{seg.stop - 1} of episode {seg.episode_index} "
                    f"(chunk {seg.chunk_id}, epoch {epoch}, stream position {position})"
                )
                skippable = not isinstance(exc, REMOTE_ERRORS)
                raise streaming_error(exc, where, skippable=skippable) from exc
            self.bad[j] = seg.start
            epoch = int(self.head[3]) if seg.epoch is None else seg.epoch
            events.append(
                skip_record(exc, seg, seg.start, epoch, int(self.head[0]), int(self.head[1]))
            )
            return
        cols, cams, length = done
        self.length[j] = length
        self.cams[j] = cams
        table = self.table
        if table is None:
            table = self.table = {
                c: np.empty((self.total, *v.shape[1:]), dtype=v.dtype) for c, v in cols.items()
            }
        at = int(self.rows_at[j])
        for c, v in cols.items():
            table[c][at : at + len(v)] = v

    def _block(self, i: int, n: int) -> Block:
        labels = self.labels[i : i + n]
        offsets = self.offsets[i : i + n]
        events: list[dict[str, Any]] = []
        firsts = {}  # first touches, in order of emission: segment -> its first place here
        for p, j in enumerate(labels.tolist()):
            if j not in firsts and not self.loaded[j] and self.bad[j] > self.first[j]:
                firsts[j] = p
        new = list(firsts)
        if new:
            outcomes = self.items.map_reads(self._decode, new)
            try:
                for j, outcome in zip(new, outcomes, strict=True):
                    self._keep(j, outcome, events, self.position + firsts[j])
            except BaseException:  # what was decoded and not kept goes back to the stores
                for j, (done, _) in zip(new, outcomes, strict=True):
                    if done is not None and not self.loaded[j]:
                        for cam, (_, keys) in done[1].items():
                            self.stores[cam].free(keys)
                raise
        frames = self.first[labels] + offsets
        keep = frames < self.bad[labels]
        kept = np.flatnonzero(keep)
        bufs, base = self.target()
        self.target.filled(n)
        cols: dict[str, np.ndarray] = {}
        for cam in self.cameras:
            out = self._camera(cam, bufs.get(cam), base, kept, labels, frames)
            if out is not None:
                cols[cam] = out  # no batch buffer (unknown frame size): a column of its own
        if len(kept) and self.table is not None:
            rows = self.rows_at[labels[kept]] + offsets[kept]
            for c, v in self.table.items():
                cols[c] = v[rows]
        np.subtract.at(self.left, labels, 1)
        touched = np.unique(labels)
        for j in touched[self.left[touched] == 0].tolist():
            self._release(j)  # emitted whole: its frames go
        cursor = np.empty((n, 5), dtype=np.int64)
        cursor[:, :4] = self.head
        cursor[:, 4] = np.arange(self.position + 1, self.position + n + 1)
        self.position += n
        whole = len(kept) == n
        return Block(
            n,
            [(cols, None)] if len(kept) else [],
            cursor,
            None if whole else len(kept),
            events,
            None if whole else keep,
        )

    def _camera(
        self,
        cam: str,
        buf: np.ndarray | None,
        base: int,
        kept: np.ndarray,
        labels: np.ndarray,
        frames: np.ndarray,
    ) -> np.ndarray | None:
        """Convert ``cam``'s frames of the kept positions into ``buf`` (rows ``base + p``), or
        into a new array returned (``buf`` None)."""
        d = self.places[cam]
        frame_of = self.stores[cam].frame
        picked, rows = [], []
        for p in kept.tolist():
            j = int(labels[p])
            lo, held = self.cams[j][cam]  # type: ignore[index]
            f = int(frames[p])
            if d is None:
                picked.append(frame_of(held[f - lo]))
                rows.append(p)
            else:
                last = int(self.length[j]) - 1
                for w, delta in enumerate(d.tolist()):
                    picked.append(frame_of(held[min(max(f + delta, 0), last) - lo]))
                    rows.append(p * len(d) + w)
        depth = self.items.depth.get(cam)  # a depth map: float32 millimetres, one channel
        channels, dtype = (1, np.float32) if depth is not None else (3, np.uint8)
        if not picked:
            return None if buf is not None else np.zeros((0, channels, 0, 0), dtype=dtype)
        fresh = buf is None
        if buf is None:
            h, w = picked[0].height, picked[0].width
            width = 1 if d is None else len(d)
            buf = np.empty((len(kept), *((width,) if width > 1 else ()), channels, h, w), dtype)
            base = 0
            remap = {p: r for r, p in enumerate(kept.tolist())}
            rows = (
                [remap[p] for p in rows]
                if d is None
                else [remap[r // len(d)] * len(d) + r % len(d) for r in rows]
            )
        flat = buf.reshape(-1, *buf.shape[-3:])  # one row per frame place
        width = 1 if d is None else len(d)
        places = [base * width + r for r in rows]
        if depth is not None:
            for frame, r in zip(picked, places, strict=True):
                depth.write(frame, flat[r, 0])
        else:
            planar_rgb_rows(picked, flat, places)
        return buf if fresh else None
