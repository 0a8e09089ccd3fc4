"""A camera's delta windows: each distinct frame decoded once and placed in every window place.

Consecutive windows overlap (``[-1, 0]`` over frames ``t`` and ``t + 1`` shares frame ``t``).
:func:`decode_windows_into` decodes a read's distinct frames once into their first place in the
batch and copies them to the others (:func:`window_run`: the places of windows sliding over
consecutive frames, computed once per shape). For read-ahead, :class:`HeldWindows` keeps the
distinct frames (about ``m + w - 1`` for ``m`` windows of ``w``) and which one each place shows,
and copies each place straight into the batch when the window is taken, instead of
materialising every window at read time (:meth:`EpisodeRangeReader.ahead
<robo_resume.items.ranges.EpisodeRangeReader.ahead>`, stream/read_ahead.py).
"""

from __future__ import annotations

import functools

import numpy as np

from ..format.video import VideoReader

__all__ = ["FANCY_COPY_BYTES", "HeldWindows", "decode_windows_into", "window_run"]

_LOOP_PLACES = 16
"""Up to this many window places a put copies one by one (no temporary, a few us of Python);
more go through one fancy-indexed gather and scatter."""


class HeldWindows:
    """``m`` delta windows of one camera: ``frames[index[i, k]]`` is offset ``k`` of window
    ``i``.

    ``frames`` is ``(u, 3, H, W)`` RGB uint8 (the distinct frames the windows show, shared by
    slices), ``index`` ``(m, w)``. ``squeeze``: a one-frame window is ``(3, H, W)`` per item
    (lerobot squeezes it), else ``(w, 3, H, W)``. Slicing along the windows shares
    ``frames``; :meth:`array` and :meth:`put` give the same values as ``frames[index]``
    (squeezed).
    """

    __slots__ = ("frames", "index", "squeeze")

    def __init__(self, frames: np.ndarray, index: np.ndarray, squeeze: bool) -> None:
        self.frames, self.index, self.squeeze = frames, index, squeeze

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, part: slice) -> HeldWindows:
        """The windows ``part`` (a slice), sharing the frames."""
        return HeldWindows(self.frames, self.index[part], self.squeeze)

    def array(self) -> np.ndarray:
        """The windows as one new array ``(m, w, 3, H, W)`` (``(m, 3, H, W)`` if squeezed)."""
        out = self.frames[self.index]
        return out[:, 0] if self.squeeze else out

    def put(self, buf: np.ndarray, rows) -> None:
        """Write window ``i`` into ``buf[rows[i]]`` (``rows``: ``m`` row numbers)."""
        index = self.index
        if index.size > _LOOP_PLACES:
            buf[rows] = self.array()
            return
        frames = self.frames
        for i, r in enumerate(rows.tolist() if isinstance(rows, np.ndarray) else rows):
            if self.squeeze:
                buf[r] = frames[index[i, 0]]
            else:
                row = buf[r]
                for k, f in enumerate(index[i].tolist()):
                    row[k] = frames[f]


def decode_windows_into(
    video: VideoReader,
    times: np.ndarray,
    uniq: np.ndarray,
    q: np.ndarray,
    buffer: np.ndarray,
    rows: np.ndarray,
    *,
    tolerance_s: float,
    run: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Decode a delta window's frames into ``buffer[rows]`` (``(B, w, 3, H, W)``, or
    ``(B, 3, H, W)`` for a one-frame window): each distinct frame is decoded once into its
    first place and copied to the others (a frame is in the windows of several items).
    ``run``: :func:`window_run` of the read, when its windows slide over consecutive
    frames (the places are then known without searching ``q``)."""
    w = q.shape[1]
    flat = buffer.view()
    flat.shape = (-1, *buffer.shape[-3:])  # a view of (B * w) frames; never a copy
    dest = (np.asarray(rows, dtype=np.int64)[:, None] * w + np.arange(w)).ravel()
    if run is not None:
        first, copies, sources = run
    else:
        which = np.searchsorted(uniq, q).ravel()  # the distinct frame each place shows
        _, first = np.unique(which, return_index=True)  # every distinct frame occurs
        others = np.ones(len(dest), dtype=bool)
        others[first] = False
        copies, sources = others, which[others]
    primary = dest[first]
    video.frames_at(
        times,
        tolerance_s=tolerance_s,
        frame_numbers=uniq.tolist(),
        channels_first=True,
        out=flat,
        rows=primary,
    )
    to, src = dest[copies], primary[sources]
    if flat[0].nbytes <= FANCY_COPY_BYTES:
        flat[to] = flat[src]  # one numpy call (through a temporary: small frames)
    else:
        for d, s in zip(to.tolist(), src.tolist(), strict=True):
            flat[d] = flat[s]  # one copy per place (a fancy-indexed copy makes two)
    return buffer


FANCY_COPY_BYTES = 64 << 10
"""Frames up to this size (one camera frame, bytes) are copied to their other window places
with one fancy-indexed copy; larger ones one by one (the temporary would copy each twice)."""


@functools.lru_cache(maxsize=256)
def window_run(n: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the frames of ``n`` windows of ``w`` consecutive offsets over ``n`` consecutive
    frames go, places numbered ``i * w + k`` (item ``i``, offset ``k``; place ``(i, k)`` shows
    distinct frame ``i + k``): ``(first, copies, sources)``, the first place showing each of the
    ``n + w - 1`` distinct frames, the other places, and the distinct frame each of those shows.
    What ``np.unique`` and ``np.searchsorted`` find for such a read, computed once per shape."""
    which = (np.arange(n)[:, None] + np.arange(w)).ravel()
    _, first = np.unique(which, return_index=True)
    others = np.ones(n * w, dtype=bool)
    others[first] = False
    copies = np.flatnonzero(others)
    sources = which[copies]
    for a in (first, copies, sources):
        a.flags.writeable = False  # shared by every read of this shape
    return first, copies, sources
