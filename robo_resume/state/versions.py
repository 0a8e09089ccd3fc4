"""State format versions: the current one, the kinds, and the migration of older states.

The rule is in the docstring of :mod:`robo_resume.state.resume`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .._version import __version__
from ..errors import ResumeStateError, describe

logger = logging.getLogger("robo_resume")


STATE_FORMAT = "robo_resume.state"
STATE_VERSION = 4
"""Format version of every state; 2 added ``library_version``, 3 ``elastic``, 4 ``kind`` (and
the mix state became this format, see :mod:`robo_resume.state.mix`)."""

KIND_DATASET = "dataset"
"""``kind`` of a :class:`ResumeState`."""

KIND_MIX = "mix"
"""``kind`` of a :class:`robo_resume.state.mix.MixState`."""

OLD_MIX_FORMAT = "robo_resume.mix_state"
"""``format`` of mix states before version 4 (their own ``version`` 1); migrated on load."""

UNKNOWN_LIBRARY_VERSION = "unknown"
"""``library_version`` of a state migrated from format version 1 (which did not record it)."""


def library_version() -> str:
    """``robo_resume.__version__``, the version that writes states now."""
    return __version__


def migrate(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """Bring a state dict to :data:`STATE_VERSION`, or refuse it (see the module docstring)."""
    version = data.get("version")
    if version == STATE_VERSION and not isinstance(version, bool):
        return data
    if version == 3 and not isinstance(version, bool):
        logger.info(
            "resume: migrated a resume state from format version 3 to %d (adds kind 'dataset'; "
            "the frames are the same)",
            STATE_VERSION,
        )
        return {**data, "version": STATE_VERSION, "kind": KIND_DATASET}
    if version == 1 and not isinstance(version, bool):
        logger.info(
            "resume: migrated a resume state from format version 1 to %d (it does not record "
            "the robo_resume version that wrote it)",
            STATE_VERSION,
        )
        return {
            **data,
            "version": STATE_VERSION,
            "kind": KIND_DATASET,
            "library_version": UNKNOWN_LIBRARY_VERSION,
            "elastic": None,
        }
    if version == 2 and not isinstance(version, bool):
        logger.info(
            "resume: migrated a resume state from format version 2 to %d (no elastic "
            "remainder epoch)",
            STATE_VERSION,
        )
        return {**data, "version": STATE_VERSION, "kind": KIND_DATASET, "elastic": None}
    lib = data.get("library_version")
    newer = isinstance(version, int) and not isinstance(version, bool) and version > STATE_VERSION
    raise ResumeStateError(
        describe(
            "Unsupported resume state version",
            expected=f"version 1 to {STATE_VERSION} (this is robo_resume {library_version()})",
            found=f"version {version!r}"
            + (f", written by robo_resume {lib}" if isinstance(lib, str) else ""),
            fix=f"upgrade robo_resume to {lib or 'the version that wrote the state'} or newer"
            if newer
            else "resume with the robo_resume version that wrote the state, or restart the "
            "epoch with resume_step",
        )
    )
