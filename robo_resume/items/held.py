"""HeldWindows: a camera's delta windows read ahead, kept as their distinct frames.

Consecutive windows overlap (``[-1, 0]`` over frames ``t`` and ``t + 1`` shares frame ``t``),
so a read-ahead of ``m`` frames needs about ``m + w - 1`` distinct RGB frames for its ``m * w``
window places. Keeping those frames plus the place-to-frame index, and copying each place
straight into the batch when the window is taken, saves the copy (and the fresh allocation)
of every window that materialising them at read time costs (:meth:`EpisodeRangeReader.ahead
<robo_resume.items.ranges.EpisodeRangeReader.ahead>`, stream/read_ahead.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["HeldWindows"]

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
