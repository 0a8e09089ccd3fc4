"""The state layer: what a run records to resume, validated and versioned (JSON-safe values).

:mod:`.resume` holds :class:`ResumeState` (one cursor per stream, a fingerprint of what the
frames depend on, the skip records and the elastic chain); :mod:`.skips` logs and merges the
chunks skipped with ``on_error="skip"``.
"""

from .resume import (
    MAX_STATE_INT,
    MAX_WORKERS,
    STATE_FORMAT,
    STATE_VERSION,
    ResumeState,
    StreamCursor,
    library_version,
)

__all__ = [
    "MAX_STATE_INT",
    "MAX_WORKERS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "ResumeState",
    "StreamCursor",
    "library_version",
]
