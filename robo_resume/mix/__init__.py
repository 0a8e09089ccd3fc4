"""Mixing several LeRobot datasets by weight, with exact per-source resume: see :mod:`.dataset`."""

from ..state.mix import MixState
from .dataset import MixedDataset
from .source import (
    DEFAULT_PERIOD,
    EXHAUSTED,
    MAX_PERIOD,
    MIX_KEY,
    MixSource,
    default_period,
    round_counts,
)
from .tracker import MixTracker

__all__ = [
    "DEFAULT_PERIOD",
    "EXHAUSTED",
    "MAX_PERIOD",
    "MIX_KEY",
    "MixSource",
    "MixState",
    "MixTracker",
    "MixedDataset",
    "default_period",
    "round_counts",
]
