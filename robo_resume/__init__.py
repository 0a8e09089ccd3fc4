"""robo_resume: stream LeRobot datasets in chunks to PyTorch, resume crashed runs exactly.

Public API: the names in ``__all__`` (everything else is internal and may change; the docs and
the examples import only these, which tests/test_public_api.py checks):

- Streaming: :class:`ChunkedEpisodeDataset` (arithmetic resume), :class:`DataSource` (where
  data comes from and which of it, for both datasets), :class:`StreamTuning`,
  :class:`CursorTracker` (records consumed cursors; its state resumes), :class:`MixedDataset`
  and :class:`MixSource` (weighted mixes), :class:`LeRobotReader` (random access).
- Selection: :class:`Split`, :func:`split_episodes`, :func:`check_files`,
  :func:`readable_episodes`.
- State and checkpoints: :class:`ResumeState`, :func:`save_checkpoint`, :func:`load_checkpoint`,
  :func:`save_state`, :func:`load_state`.
- Metadata: :func:`load_metadata`, :class:`DatasetMeta`; :data:`CURSOR_KEY`.
- Synthetic datasets with known ground truth: :func:`make_dataset`.
- Errors: :class:`RoboResumeError` and its subclasses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    CorruptFileError,
    DatasetFormatError,
    MetadataMismatchError,
    MissingFileError,
    ResumeStateError,
    RoboResumeError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
    VideoDecodeError,
    WorkerStartError,
)

# The rest is imported on first use (PEP 562): ``import robo_resume`` and the ``robo-resume``
# commands that need no data loader (``plan``, ``inspect``) do not import torch, the largest
# part of a cold start. Name -> module that defines it.
_LAZY = {
    "load_checkpoint": "checkpoint",
    "load_state": "checkpoint",
    "save_checkpoint": "checkpoint",
    "save_state": "checkpoint",
    "CURSOR_KEY": "dataset",
    "ChunkedEpisodeDataset": "dataset",
    "StreamTuning": "dataset",
    "worker_context": "dataset",
    "check_files": "files",
    "readable_episodes": "files",
    "DatasetMeta": "format.metadata",
    "load_metadata": "format.metadata",
    "MixedDataset": "mix",
    "MixSource": "mix",
    "LeRobotReader": "reader",
    "DataSource": "source",
    "Split": "splits",
    "split_episodes": "splits",
    "ResumeState": "state.resume",
    "make_dataset": "testing",
    "CursorTracker": "tracker",
}

if TYPE_CHECKING:
    from .checkpoint import load_checkpoint, load_state, save_checkpoint, save_state
    from .dataset import CURSOR_KEY, ChunkedEpisodeDataset, StreamTuning, worker_context
    from .files import check_files, readable_episodes
    from .format.metadata import DatasetMeta, load_metadata
    from .mix import MixedDataset, MixSource
    from .reader import LeRobotReader
    from .source import DataSource
    from .splits import Split, split_episodes
    from .state.resume import ResumeState
    from .testing import make_dataset
    from .tracker import CursorTracker


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'robo_resume' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once: later lookups are plain attributes
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "CURSOR_KEY",
    "ChunkedEpisodeDataset",
    "CorruptFileError",
    "CursorTracker",
    "DataSource",
    "DatasetFormatError",
    "DatasetMeta",
    "LeRobotReader",
    "MetadataMismatchError",
    "MissingFileError",
    "MixSource",
    "MixedDataset",
    "ResumeState",
    "ResumeStateError",
    "RoboResumeError",
    "Split",
    "StreamTuning",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "WorkerStartError",
    "__version__",
    "check_files",
    "load_checkpoint",
    "load_metadata",
    "load_state",
    "make_dataset",
    "readable_episodes",
    "save_checkpoint",
    "save_state",
    "split_episodes",
    "worker_context",
]
