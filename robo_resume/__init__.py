"""robo_resume: stream LeRobot datasets in chunks to PyTorch, resume crashed runs exactly.

Public API (everything else is internal and may change):

- :class:`ChunkedEpisodeDataset`: the streaming ``IterableDataset`` with arithmetic resume.
- :class:`CursorTracker`: records consumed cursors in the training loop; its state resumes.
- :class:`LeRobotReader`: random-access reader with ``LeRobotDataset``-compatible items.
- :class:`ResumeState`, :class:`StreamTuning`, :func:`load_metadata`, :data:`CURSOR_KEY`.
- Errors: :mod:`robo_resume.errors`. Synthetic datasets: :mod:`robo_resume.testing`.
"""

from .dataset import CURSOR_KEY, ChunkedEpisodeDataset, StreamTuning, worker_context
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
from .format.metadata import DatasetMeta, load_metadata
from .reader import LeRobotReader
from .state import ResumeState
from .tracker import CursorTracker

__version__ = "0.1.0"

__all__ = [
    "CURSOR_KEY",
    "ChunkedEpisodeDataset",
    "CorruptFileError",
    "CursorTracker",
    "DatasetFormatError",
    "DatasetMeta",
    "LeRobotReader",
    "MetadataMismatchError",
    "MissingFileError",
    "ResumeState",
    "ResumeStateError",
    "RoboResumeError",
    "StreamTuning",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "WorkerStartError",
    "__version__",
    "load_metadata",
    "worker_context",
]
