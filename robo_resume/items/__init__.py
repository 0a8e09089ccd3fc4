"""LeRobot-compatible items, built for a contiguous frame range in one pass.

An item is the dict ``LeRobotDataset.__getitem__`` returns (lerobot 0.6.1): one tensor per data
column (floats as float32, ints as int64, 0-d for scalars), one ``(C, H, W)`` image per camera
(float32 in [0, 1] by default, or uint8), a ``str`` per ``dtype: string`` feature,
``delta_timestamps`` windows stacked along a new first axis with ``<key>_is_pad`` masks (indices
clamped to the episode, so edge frames repeat), and the ``task`` string. Cameras are the video
features and the ``dtype: image`` features (PNG or JPEG files in the data parquet, decoded by
:func:`~robo_resume.format.images.decode_image`); ``image_dtype`` and ``image_transforms`` apply
to both kinds alike. :class:`EpisodeRangeReader` reads the rows of a frame range once and keeps
one decoder per camera open, so a range is built with one parquet read and one seek per camera.
"""

from .buffers import BUFFERS, BufferPool, shared_views, to_float
from .builder import ItemBuilder
from .options import IDLE_DECODERS, IMAGE_DTYPES, ItemOptions, delta_indices
from .ranges import EpisodeRangeReader, unbind

__all__ = [
    "BUFFERS",
    "IDLE_DECODERS",
    "IMAGE_DTYPES",
    "BufferPool",
    "EpisodeRangeReader",
    "ItemBuilder",
    "ItemOptions",
    "delta_indices",
    "shared_views",
    "to_float",
    "unbind",
]
