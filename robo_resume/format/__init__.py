"""Format layer: LeRobot metadata (v3.0, v2.1), parquet row ranges, video frame ranges.

The only layer that touches dataset files. Nothing here imports lerobot.
"""

from .metadata import SUPPORTED_VERSIONS, DatasetMeta, EpisodeInfo, VideoRef, load_metadata
from .tabular import ParquetTable
from .video import VideoReader, VideoStreamInfo, probe_video

__all__ = [
    "SUPPORTED_VERSIONS",
    "DatasetMeta",
    "EpisodeInfo",
    "ParquetTable",
    "VideoReader",
    "VideoRef",
    "VideoStreamInfo",
    "load_metadata",
    "probe_video",
]
