"""Dataset factory: writes real LeRobot datasets (v3.0 and v2.1) with known ground truth.

Used by the tests, the demo and the benchmarks, and public so users can try robo_resume without
downloading anything. Every frame's pixels encode ``(episode, frame, camera)`` in a grid of large
black and white cells with a checksum (:func:`frame_image`, :func:`decode_frame_identity`), which
survives AV1, h264 and mpeg4 compression; every row's values encode ``(episode, frame)`` exactly
(:func:`expected_state`, :func:`expected_action`). A test can therefore tell that a decoded frame
or a row is exactly the one it asked for.

Pixel pattern
-------------
The image is split into a grid of 6 rows x 8 columns of cells, each ``height // 6`` by
``width // 8`` pixels (at least 8x8, so 48x64 is the smallest size); pixels right of or below the
grid are dark. Cell ``k`` (row-major) holds bit ``47 - k`` of a 48-bit word
``episode (14 bits) | frame (16 bits) | camera (2 bits) | check (16 bits)``, most significant bit
first, where ``check = crc32(payload as 4 little-endian bytes) & 0xFFFF`` and ``payload`` is the
upper 32 bits. A 1 bit is gray level 225, a 0 bit gray level 30, in all three RGB channels. A
decoder takes the mean of each cell's inner half (a quarter of the cell's size is dropped on each
side, away from the blurred edges) over the three channels and compares it with 128.

Written layouts
---------------
v3.0 (as lerobot 0.6.1 writes it): ``data/chunk-CCC/file-FFF.parquet`` and
``videos/<camera>/chunk-CCC/file-FFF.mp4`` holding ``episodes_per_file`` consecutive episodes each
(file numbers roll into the next chunk folder after ``files_per_chunk`` files),
``meta/episodes/chunk-000/file-000.parquet`` (one row per episode, with per-episode ``stats/*``
columns), ``meta/tasks.parquet``, ``meta/stats.json`` and ``meta/info.json`` (each camera's
``info`` records the encoder settings, ``video.g``, ``video.crf``, ... and ``is_depth_map``).

v2.1 (lerobot <= 0.3): ``data/chunk-CCC/episode_EEEEEE.parquet`` and
``videos/chunk-CCC/<camera>/episode_EEEEEE.mp4`` (``files_per_chunk`` episodes per chunk folder),
``meta/episodes.jsonl``, ``meta/tasks.jsonl``, ``meta/episodes_stats.jsonl``,
``meta/stats.json`` and ``meta/info.json``.
"""

from .truth import (
    CODECS,
    FactoryDataset,
    decode_frame_identity,
    expected_action,
    expected_state,
    frame_image,
)
from .writer import make_dataset

__all__ = [
    "CODECS",
    "FactoryDataset",
    "decode_frame_identity",
    "expected_action",
    "expected_state",
    "frame_image",
    "make_dataset",
]
