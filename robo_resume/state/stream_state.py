"""One stream's state for torchdata's StatefulDataLoader, checked like a ``resume_state``.

:meth:`ChunkedEpisodeDataset.state_dict` runs in each worker (StatefulDataLoader saves one
state per worker); :func:`stream_state` adds to the stream's position the dataset fingerprint
and topology that a :class:`~robo_resume.state.ResumeState` carries. :func:`check_stream_state`
checks a state before it is used, with the messages of ``ChunkedEpisodeDataset(...,
resume_state=...)``: another dataset, episode selection, plan, seed or batch size raises the same
:class:`~robo_resume.errors.ResumeStateError`, and so does another ``num_workers`` or world size
(a StatefulDataLoader restores each worker from the same worker's state, so it cannot
re-partition; the error says how to resume elastically instead).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..errors import ResumeStateError, describe
from .resume import ResumeState, StreamCursor, library_version

__all__ = ["POSITION_KEYS", "check_stream_state", "stream_state"]

logger = logging.getLogger("robo_resume")

POSITION_KEYS = ("rank", "role", "num_workers", "epoch", "position")
"""Where a stream stands: its rank, role (old stream it plays), loader topology and cursor."""

ELASTIC_FIX = (
    "resume with the num_workers and world size of the state, or resume elastically: record "
    "batches with CursorTracker.consume, save tracker.state_dict() in the checkpoint and pass "
    "it as ChunkedEpisodeDataset(..., resume_state=...), which re-partitions what the "
    "interrupted epoch has left over any workers, ranks or batch size"
)


def stream_state(
    live: Mapping[str, int], fingerprint: Mapping[str, Any], world_size: int
) -> dict[str, Any]:
    """The state of a stream standing at ``live`` (keys :data:`POSITION_KEYS`), JSON-safe."""
    state: dict[str, Any] = {k: int(live[k]) for k in POSITION_KEYS}
    state.update(
        world_size=int(world_size),
        fingerprint=dict(fingerprint),
        library_version=library_version(),
    )
    return state


def check_stream_state(
    state: Mapping[str, Any],
    fingerprint: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    num_workers: int,
) -> dict[str, int]:
    """The position of ``state`` (keys :data:`POSITION_KEYS`) once it is checked for this loader.

    ``fingerprint`` is the dataset's, ``rank``/``world_size``/``num_workers`` the loader's that
    resumes. Raises :class:`~robo_resume.errors.ResumeStateError`: a malformed state, another
    fingerprint (the messages of :meth:`ResumeState.check_fingerprint`), another rank, world
    size or number of workers. A state without a fingerprint (written by robo_resume before it
    had one) is used with a WARNING, as it cannot be checked.
    """
    if not isinstance(state, Mapping) or any(k not in state for k in POSITION_KEYS):
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise ResumeStateError(
            describe(
                "Invalid dataset state",
                expected=f"keys {POSITION_KEYS}",
                found=found,
                fix="pass the unmodified dict from StatefulDataLoader.state_dict()",
            )
        )
    pos = {k: state[k] for k in POSITION_KEYS}
    for k, v in pos.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ResumeStateError(
                describe(
                    f"Invalid dataset state field '{k}'",
                    expected="an int >= 0",
                    found=repr(v)[:80],
                    fix="pass the unmodified dict from StatefulDataLoader.state_dict()",
                )
            )
    recorded_world = state.get("world_size", world_size)
    if "fingerprint" in state:
        ResumeState(
            fingerprint=state["fingerprint"],
            world_size=recorded_world,
            num_workers=pos["num_workers"],
            batches=0,
            cursors=(StreamCursor(pos["rank"], pos["role"], pos["epoch"], pos["position"]),),
            library_version=state.get("library_version", library_version()),
        ).check_fingerprint(fingerprint)
    else:
        logger.warning(
            "resume: the StatefulDataLoader state has no dataset fingerprint (written by an "
            "older robo_resume): it cannot be checked against this dataset, seed and selection"
        )
    recorded = (recorded_world, pos["num_workers"])
    if recorded != (world_size, num_workers):
        raise ResumeStateError(
            describe(
                "The StatefulDataLoader state was saved with another topology",
                expected=f"world_size={world_size}, num_workers={num_workers} (this loader)",
                found=f"world_size={recorded[0]}, num_workers={recorded[1]} (the state)",
                fix=ELASTIC_FIX,
            )
        )
    if pos["rank"] != rank:
        raise ResumeStateError(
            describe(
                "Dataset state of another rank",
                expected=f"rank {rank}",
                found=f"rank {pos['rank']}",
                fix="load each rank's own StatefulDataLoader state on that rank",
            )
        )
    return pos
