"""Logging of chunks skipped with ``on_error="skip"``: one line per file, a summary per pass.

A broken file is usually met by many chunks (every chunk of each episode it holds, in every
epoch), so logging each skip buries the log (a validation pass over a dataset with two missing
videos logged 16 warnings of ~500 characters). :class:`SkipLog` logs a WARNING the first time a
pass meets a file, and one summary WARNING when the pass ends; each chunk is logged at DEBUG.
The full list stays available: ``CursorTracker.skipped`` / ``skip_report()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import format_ranges

__all__ = ["SkipLog"]

logger = logging.getLogger("robo_resume")


def _first_sentence(error: str) -> str:
    """``"MissingFileError: A video file is missing. Expected ..."`` -> up to the first period."""
    head, _, _ = str(error).partition(". ")
    return head.rstrip(".")


class SkipLog:
    """Skip records (see ``robo_resume.dataset.SKIPPED_KEY``) of one pass, logged compactly."""

    def __init__(self) -> None:
        self.files: dict[str, set[int]] = {}  # file -> episodes skipped because of it
        self.chunks = 0
        self.frames = 0

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Record skipped chunks; log a WARNING for each file met for the first time."""
        for r in records:
            r = {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            file = str(r.get("file"))
            self.chunks += 1
            self.frames += int(r["stop"]) - int(r["frame"])
            logger.debug(
                "skipped chunk (on_error='skip'): epoch=%d chunk=%d episode=%d frames=%d..%d "
                "file=%s",
                r["epoch"],
                r["chunk"],
                r["episode"],
                r["frame"],
                r["stop"] - 1,
                file,
            )
            if file not in self.files:
                self.files[file] = set()
                logger.warning(
                    "robo_resume: skipping the frames of %s (episode %d; %s); its other "
                    "chunks are skipped without a warning (on_error='skip')",
                    file,
                    r["episode"],
                    _first_sentence(r.get("error", "")),
                )
            self.files[file].add(int(r["episode"]))

    def finish(self) -> str | None:
        """Log (and return) the pass's summary line, if anything was skipped; then reset."""
        if not self.chunks:
            return None
        episodes = set().union(*self.files.values())
        line = (
            f"robo_resume: this pass skipped {self.chunks} chunk(s), {self.frames} frames of "
            f"episode(s) {format_ranges(episodes)}, in {len(self.files)} missing or unreadable "
            "file(s) (on_error='skip'); CursorTracker.skip_report() lists them, "
            "robo_resume.files.readable_episodes(root) selects the episodes without them"
        )
        logger.warning(line)
        SkipLog.__init__(self)
        return line
