"""Groups: the runs of a stream's segments read together, and the order of their frames. Pure.

A stream-epoch's segments (after the per-stream shuffle) are cut into consecutive *groups*
(:func:`group_bounds`):

- by count (``ScheduleConfig.window == 0``): runs of ``interleave`` segments;
- by frames (``window > 0``, the shuffle order): segment ``j`` joins group ``f_j // window``,
  ``f_j`` the frames of the stream's segments before it, so a group holds about ``window``
  frames (at most ``window`` plus its last segment's length minus one).

A group's frames come out in a seeded order (:func:`group_frames`), which names for every
position of the group the segment (``labels``) and the frame of that segment (``offsets``):

- ``"random"``, ``"rounds"``, ``"spread"`` (:func:`group_order`): every segment emits its frames
  in frame order, so a stream reads each segment forward with one open decoder;
- ``"shuffle"``: a uniform permutation of all the group's frames, a segment's frames in any
  order. The reader decodes a segment whole when the group first needs it and holds its frames
  until they are emitted (:mod:`robo_resume.stream.window_read`): a group is a shuffle window.

Why the shuffle order exists: a policy trained on the interleave orders learns worse than on
uniform sampling, because consecutive batches hold the same few open chunks for dozens of steps
(docs/training-quality.md). Uniform windows of short chunks drawn from the whole dataset train
close to uniform sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .segments import Segment, Segments

__all__ = [
    "GROUP_ORDERS",
    "INTERLEAVE_ORDERS",
    "Group",
    "frame_starts",
    "group_bounds",
    "group_frames",
    "group_order",
    "make_group",
]

INTERLEAVE_ORDERS = ("random", "rounds", "spread")
"""Orders that keep every segment's frames in frame order (``StreamTuning.interleave_order``)."""

GROUP_ORDERS = (*INTERLEAVE_ORDERS, "shuffle")
"""Every order a group's frames may come in (``ScheduleConfig.interleave_order``)."""


def group_order(
    lengths: Sequence[int] | np.ndarray, mode: str, rng: np.random.Generator | None
) -> np.ndarray:
    """The segment (0..k-1) that emits each frame of a group whose segments have ``lengths``.

    Every segment emits its frames in frame order, ``lengths[j]`` of them. ``"random"``: a
    seeded permutation of all the group's frames (a segment may emit several frames in a
    row). ``"rounds"``: round ``r`` holds the ``r``-th frame of every segment that has one, in a
    seeded order per round, so ``k`` consecutive positions come from up to ``k`` different
    segments. ``"spread"``: every segment's frames are spaced evenly over the whole group,
    frame ``i`` of a segment of ``L`` frames at ``(i + u) / L`` of the group's length (``u`` a
    seeded phase per segment in ``[0, 1)``; ties keep segment order), so a short segment (an
    episode's tail) does not leave the group's last rounds to a few long ones. ``"shuffle"``:
    the labels of a uniform permutation of the group's frames (see :func:`group_frames`, which
    also gives each position's frame). ``rng`` None (``shuffle=False``): segment after segment
    ("random", "shuffle"), the segments in turn, ``0..k-1`` in every round ("rounds"), or phase
    1/2 for every segment ("spread"). Pure.
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    seg = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    if mode == "shuffle":
        return group_frames(sizes, mode, rng)[0]
    if mode == "random":
        return rng.permutation(seg) if rng is not None and len(sizes) > 1 else seg
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    frame = np.arange(len(seg), dtype=np.int64) - starts  # each frame's number in its segment
    if mode == "spread":
        phase = rng.random(len(sizes)) if rng is not None else np.full(len(sizes), 0.5)
        return seg[np.argsort((frame + phase[seg]) / sizes[seg], kind="stable")]
    tie = rng.random(len(seg)) if rng is not None else seg
    return seg[np.lexsort((tie, frame))]


def group_frames(
    lengths: Sequence[int] | np.ndarray, mode: str, rng: np.random.Generator | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, offsets)`` of a group: position ``i`` emits frame ``offsets[i]`` (counted from
    the segment's start) of segment ``labels[i]``. Every frame of the group exactly once.

    ``"shuffle"``: one seeded permutation of the group's frames (the same draw as
    :func:`group_order`'s labels); the other orders keep each segment's frames in frame order,
    so ``offsets[i]`` counts the earlier positions of the same segment. Pure.
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    total = int(sizes.sum())
    if mode == "shuffle":
        firsts = np.cumsum(sizes) - sizes
        seg = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        flat = rng.permutation(total) if rng is not None and total > 1 else np.arange(total)
        labels = seg[flat]
        return labels, flat - firsts[labels]
    labels = group_order(sizes, mode, rng)
    return labels, _ranks(labels, len(sizes))


def _ranks(labels: np.ndarray, k: int) -> np.ndarray:
    """For every position, how many earlier positions have the same label."""
    by = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=k)
    firsts = np.cumsum(counts) - counts
    out = np.empty(len(labels), dtype=np.int64)
    out[by] = np.arange(len(labels), dtype=np.int64) - np.repeat(firsts, counts)
    return out


def group_bounds(lengths: np.ndarray, *, interleave: int, window: int) -> np.ndarray:
    """Where each group starts, as indices into a stream's segments (``lengths``, in order):
    ``G + 1`` ascending values from 0 to ``len(lengths)`` (see the module docstring)."""
    n = len(lengths)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    if window <= 0:
        return np.append(np.arange(0, n, interleave, dtype=np.int64), n)
    before = np.cumsum(lengths, dtype=np.int64) - lengths
    gid = before // window
    firsts = np.flatnonzero(np.diff(gid, prepend=-1))  # where the group number changes
    return np.append(firsts, n).astype(np.int64)


def frame_starts(lengths: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Stream positions where each group starts (``G + 1`` prefix sums of its frames)."""
    if not len(lengths):
        return np.zeros(1, dtype=np.int64)
    per_group = np.add.reduceat(lengths, bounds[:-1]) if len(bounds) > 1 else np.zeros(0)
    return np.concatenate(([0], np.cumsum(per_group, dtype=np.int64)))


@dataclass(frozen=True, eq=False)
class Group:
    """Segments read together. Position ``i`` of the group emits frame ``offsets[i]`` (from the
    segment's start) of ``segments[order[i]]``; ``position`` is the stream position of its first
    frame."""

    segments: tuple[Segment, ...]
    order: np.ndarray
    position: int
    offsets: np.ndarray
    keeps_frame_order: bool = True
    """Whether every segment emits its frames in frame order (every order but "shuffle")."""

    def global_indices(self) -> np.ndarray:
        """The dataset ``index`` of every frame of the group, in emission order."""
        first = np.fromiter((s.dataset_from_index for s in self.segments), np.int64)
        return first[self.order] + self.offsets

    def frame(self, i: int) -> tuple[Segment, int]:
        """The segment and the episode frame that position ``i`` of the group emits."""
        seg = self.segments[int(self.order[i])]
        return seg, seg.start + int(self.offsets[i])

    def leftover(self, offset: int) -> Segments:
        """The frames positions ``offset..`` of the group still emit, as segments in the group's
        segment order: per segment the maximal runs of consecutive frames not emitted before
        ``offset`` (the suffix after the frames emitted, when the order keeps frame order)."""
        segs = Segments.of(self.segments)
        lengths = segs.lengths
        firsts = np.cumsum(lengths) - lengths
        left = np.ones(int(lengths.sum()), dtype=bool)
        done = self.order[:offset]
        left[firsts[done] + self.offsets[:offset]] = False
        seg_of = np.repeat(np.arange(len(lengths)), lengths)
        frame = np.arange(len(left)) - firsts[seg_of]
        prev = np.concatenate(([False], left[:-1]))
        begins = left & ~(prev & (frame > 0))  # a run starts: after an emitted frame or anew
        nxt = np.concatenate((left[1:], [False]))
        last = frame == lengths[seg_of] - 1
        ends = left & ~(nxt & ~last)
        lo, hi = np.flatnonzero(begins), np.flatnonzero(ends) + 1
        rows = seg_of[lo]
        cut = frame[lo]
        return Segments._raw(
            [
                segs.chunk_id[rows],
                segs.episode_index[rows],
                segs.start[rows] + cut,
                segs.start[rows] + cut + (hi - lo),
                segs.dataset_from_index[rows] + cut,
                segs.epoch[rows],
            ]
        )


def make_group(
    members: tuple[Segment, ...], mode: str, rng: np.random.Generator | None, position: int
) -> Group:
    """The group of ``members`` (in the stream's order) starting at stream ``position``, its
    frames in ``mode``'s order drawn from ``rng`` (None: unshuffled)."""
    labels, offsets = group_frames([m.length for m in members], mode, rng)
    return Group(members, labels, position, offsets, mode != "shuffle")
