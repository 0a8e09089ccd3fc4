"""Names of the keys robo_resume adds to items and batches: constants only, for every layer.

Their values are part of the batches a training loop sees: never change them.
"""

CURSOR_KEY = "robo_resume_cursor"
"""Item key of the cursor: int64 ``[rank, role, num_workers, epoch, position]``."""

RELEASE_KEY = "_robo_resume_release"
"""Batch entry ``(slot, token)`` naming the worker's ring buffer the batch's cameras live in;
the iterator of :class:`robo_resume.stream.loader.BatchLoader` removes it and frees the slot
when the batch is dropped."""

SKIPPED_KEY = "robo_resume_skipped"
"""Batch key (only in batches that skip a chunk): a list of skip records, one dict per chunk
with ``epoch, chunk, episode, start`` (the segment's first frame), ``frame`` (the first skipped
one), ``stop``, ``rank, role, file, error``. :meth:`robo_resume.tracker.CursorTracker.consume`
records and strips it."""
