"""A read-only file object over the fetched pieces of a file, for PyAV.

:class:`RangedFile` serves reads from byte pieces held in memory (what a remote reader fetched:
box headers, the ``moov``, a chunk's byte span; see :mod:`robo_resume.format.mp4_ranges`) and
raises :class:`~robo_resume.errors.BytesNotHeldError` for a read that starts outside them, so a
wrong range is an error naming the file, the offset and the ranges held, never silent data.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import BytesNotHeldError, describe

__all__ = ["RangedFile", "SeekableReader", "Span", "merge_spans"]

Span = tuple[int, int]
"""A byte span ``[start, end)`` of a file."""


def merge_spans(spans: Iterable[Span], *, gap: int = 0) -> list[Span]:
    """``[start, end)`` spans sorted, with overlapping or touching ones merged into one.

    Args:
        spans: byte spans, any order; empty ones are dropped.
        gap: spans at most this many bytes apart are merged too (the hole between them
            is then held).

    Returns:
        Disjoint, non-touching spans in increasing order.
    """
    out: list[list[int]] = []
    for s, e in sorted((int(s), int(e)) for s, e in spans if e > s):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


class SeekableReader(io.RawIOBase):
    """A read-only binary file of ``size`` bytes with a position: the part of
    :class:`RangedFile` and of the remote files that is the same (subclasses set ``size``,
    ``name`` and ``_pos``, and read in :meth:`readinto`)."""

    size: int
    name: str
    _pos: int

    def readable(self) -> bool:
        """True: the file can be read."""
        return True

    def seekable(self) -> bool:
        """True: the file can seek anywhere (reading is what needs a piece)."""
        return True

    def tell(self) -> int:
        """The position, in bytes from the start."""
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` from the start (``SEEK_SET``), the position (``SEEK_CUR``) or the
        end (``SEEK_END``); returns the new position.

        Raises:
            ValueError: a negative position or an unknown ``whence``.
        """
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"whence {whence} is not SEEK_SET, SEEK_CUR or SEEK_END")
        if pos < 0:
            raise ValueError(f"seek to {pos}: before the start of {self.name}")
        self._pos = int(pos)
        return self._pos


class RangedFile(SeekableReader):
    """A read-only, seekable file of ``size`` bytes of which only some pieces are held, for
    ``av.open(RangedFile(...))`` (PyAV reads a Python file object through ``read``/``readinto``,
    ``seek`` and ``tell``).

    A read returns the held bytes from the position up to the end of the piece holding it
    (a short read, as a raw file may give; FFmpeg's 32 KB reads stop there and ask again),
    ``b""`` at the end of the file, and raises :class:`~robo_resume.errors.BytesNotHeldError`
    when the position is inside the file but in no piece.

    Args:
        size: the whole file's size in bytes.
        pieces: the held bytes, ``{start: data}`` or ``(start, data)`` pairs; overlapping
            pieces must agree (the later one wins), each must lie inside the file.
        name: the file or URL, for messages.
        eof_span: bytes ``[a, b)`` that read as the end of the file: a read starting inside
            them returns ``b""`` and a read before them stops at ``a``, held or not. For an
            mp4 chunk, the rest of the ``mdat`` after its byte span
            (``SampleTable.chunk_file`` sets it): the demuxer stops there and FFmpeg
            flushes the decoder, which then outputs every frame it holds (whatever its
            reorder buffer and frame threads), and a sample cut by the end of a held piece is
            never handed to the decoder. None: nothing reads as the end.

    Raises:
        ValueError: a piece outside ``[0, size)``.
    """

    def __init__(
        self,
        size: int,
        pieces: Mapping[int, bytes] | Sequence[tuple[int, bytes]],
        *,
        name: str = "<mp4>",
        eof_span: Span | None = None,
    ) -> None:
        super().__init__()
        self.eof_span = eof_span
        items = list(pieces.items()) if isinstance(pieces, Mapping) else list(pieces)
        self.size, self.name = int(size), name
        spans = merge_spans((int(s), int(s) + len(d)) for s, d in items)
        if spans and (spans[0][0] < 0 or spans[-1][1] > self.size):
            raise ValueError(f"pieces {spans} of {name} do not fit in its {size} bytes")
        self._starts = [s for s, _ in spans]
        self._data: list[bytearray] = [bytearray(e - s) for s, e in spans]
        for s, d in sorted(items, key=lambda p: int(p[0])):
            i = bisect.bisect_right(self._starts, int(s)) - 1
            at = int(s) - self._starts[i]
            self._data[i][at : at + len(d)] = d
        self._pos = 0

    @property
    def spans(self) -> list[Span]:
        """The held byte spans ``[start, end)``, sorted and merged."""
        return [(s, s + len(d)) for s, d in zip(self._starts, self._data, strict=True)]

    @property
    def held(self) -> int:
        """Number of bytes held."""
        return sum(len(d) for d in self._data)

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the position with held bytes, up to the end of their piece.

        Returns:
            The number of bytes copied (0 at the end of the file).

        Raises:
            BytesNotHeldError: the position is inside the file but in no held piece.
        """
        view = memoryview(buffer).cast("B")
        want = len(view)
        if self.eof_span is not None:
            a, b = self.eof_span
            if a <= self._pos < b:
                return 0  # the end of the data the demuxer is meant to read
            if self._pos < a:
                want = min(want, a - self._pos)
        if self._pos >= self.size or want == 0:
            return 0
        i = bisect.bisect_right(self._starts, self._pos) - 1
        at = self._pos - self._starts[i] if i >= 0 else -1
        if i < 0 or at >= len(self._data[i]):
            held = ", ".join(f"{s}-{e}" for s, e in self.spans[:8])
            more = f" and {len(self._starts) - 8} more" if len(self._starts) > 8 else ""
            raise BytesNotHeldError(
                describe(
                    "A read of a partly fetched video file starts outside the fetched bytes",
                    expected=f"a byte offset inside the held ranges [{held or 'none'}{more}]",
                    found=f"a read of {len(view)} bytes at offset {self._pos}",
                    file=self.name,
                    fix="fetch the pieces SampleTable.pieces(first, stop) gives for the frames "
                    "decoded and pass eof_span (SampleTable.chunk_file does both), or read "
                    "the file whole",
                )
            )
        n = min(want, len(self._data[i]) - at)
        view[:n] = self._data[i][at : at + n]
        self._pos += n
        return n
