"""Ground truth of the factory's datasets: the values and pixels every frame must have.

The pixel pattern and the layouts are described in the docstring of :mod:`robo_resume.testing`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CODECS = ("av1", "h264", "mpeg4")
"""Codecs :func:`make_dataset` can write (``video.codec`` in info.json)."""

ENCODER = {"av1": "libsvtav1", "h264": "libx264", "mpeg4": "mpeg4"}
ROWS, COLS = 6, 8  # 48 cells: 14 bits episode, 16 bits frame, 2 bits camera, 16 bits checksum
LOW, HIGH = 30, 225
MIN_CELL = 8
"""Smallest cell side in pixels: images must be at least ``6 * 8`` high and ``8 * 8`` wide."""
MAX_EPISODES, MAX_FRAMES, MAX_CAMERAS = 2**14, 2**16, 4
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)


@dataclass(frozen=True)
class FactoryDataset:
    """What :func:`make_dataset` wrote: the ground truth tests compare against.

    Frame ``f`` of episode ``e`` has ``observation.state == expected_state(e, f, state_dim)``,
    ``action == expected_action(e, f, action_dim)``, ``timestamp == float32(f / fps)``,
    ``index == dataset_index(e, f)``, ``task_index == episode_task_index(e)`` and, for camera
    ``c`` (``camera_keys[c]``), pixels ``frame_image(e, f, c, height, width)`` before compression.
    """

    root: Path
    version: str
    fps: int
    episode_lengths: tuple[int, ...]
    camera_keys: tuple[str, ...]
    height: int
    width: int
    codec: str
    gop: int
    tasks: tuple[str, ...]
    state_dim: int
    action_dim: int

    @property
    def total_frames(self) -> int:
        """Frames over all episodes (``sum(episode_lengths)``)."""
        return sum(self.episode_lengths)

    def episode_task_index(self, episode_index: int) -> int:
        """The task index of an episode: ``episode_index % len(tasks)``."""
        return episode_index % len(self.tasks)

    def dataset_index(self, episode_index: int, frame_index: int) -> int:
        """The global ``index`` of a frame: frames of earlier episodes plus ``frame_index``."""
        return sum(self.episode_lengths[:episode_index]) + frame_index


# --------------------------------------------------------------------------- tabular values


def state_rows(episodes: np.ndarray, frames: np.ndarray, dim: int) -> np.ndarray:
    e = episodes.astype(np.float64)
    f = frames.astype(np.float64)
    out = np.empty((len(e), dim), dtype=np.float64)
    cols = [e, f, e * 1000 + f]
    for k in range(dim):
        out[:, k] = cols[k] if k < 3 else 0.5 + (k - 3)
    return out.astype(np.float32)


def action_rows(episodes: np.ndarray, frames: np.ndarray, dim: int) -> np.ndarray:
    e = episodes.astype(np.float64)
    f = frames.astype(np.float64)
    out = np.empty((len(e), dim), dtype=np.float64)
    cols = [f + 0.25, -e]
    for k in range(dim):
        out[:, k] = cols[k] if k < 2 else 0.125 * (k - 1)
    return out.astype(np.float32)


def expected_state(episode_index: int, frame_index: int, dim: int) -> np.ndarray:
    """The float32 ``observation.state`` written for a frame, exactly.

    ``[episode, frame, 1000 * episode + frame, 0.5, 1.5, 2.5, ...]`` truncated to ``dim``; every
    value is exactly representable in float32 (episode < 16384, frame < 65536).
    """
    return state_rows(np.array([episode_index]), np.array([frame_index]), dim)[0]


def expected_action(episode_index: int, frame_index: int, dim: int) -> np.ndarray:
    """The float32 ``action`` written for a frame, exactly.

    ``[frame + 0.25, -episode, 0.125, 0.25, 0.375, ...]`` truncated to ``dim``; every value is
    exactly representable in float32.
    """
    return action_rows(np.array([episode_index]), np.array([frame_index]), dim)[0]


# --------------------------------------------------------------------------- pixel pattern


def _checksum(payload: int) -> int:
    return zlib.crc32(payload.to_bytes(4, "little")) & 0xFFFF


def cell_bits(episode: int, frame: int, camera: int) -> np.ndarray:
    payload = episode << 18 | frame << 2 | camera
    word = payload << 16 | _checksum(payload)
    return np.array([(word >> (47 - i)) & 1 for i in range(48)], dtype=np.uint8)


def check_size(height: int, width: int) -> None:
    if height // ROWS < MIN_CELL or width // COLS < MIN_CELL:
        raise ValueError(
            f"Images of {height}x{width} are too small for the identity pattern; expected at "
            f"least {ROWS * MIN_CELL}x{COLS * MIN_CELL} (height x width) so that each of the "
            f"{ROWS}x{COLS} cells is {MIN_CELL}x{MIN_CELL} pixels or more. "
            f"Fix: pass height>={ROWS * MIN_CELL} and width>={COLS * MIN_CELL}."
        )


def frame_image(
    episode_index: int, frame_index: int, camera: int, height: int, width: int
) -> np.ndarray:
    """The uint8 RGB ``(height, width, 3)`` image the factory encodes for a frame.

    See the module docstring for the pattern. Raises ValueError when the image is smaller than
    48x64 or when ``episode_index >= 16384``, ``frame_index >= 65536`` or ``camera >= 4``.
    """
    check_size(height, width)
    if not (
        0 <= episode_index < MAX_EPISODES
        and 0 <= frame_index < MAX_FRAMES
        and 0 <= camera < MAX_CAMERAS
    ):
        raise ValueError(
            f"Cannot encode episode={episode_index}, frame={frame_index}, camera={camera}; "
            f"expected 0 <= episode < {MAX_EPISODES}, 0 <= frame < {MAX_FRAMES} and "
            f"0 <= camera < {MAX_CAMERAS}."
        )
    levels = np.where(cell_bits(episode_index, frame_index, camera) == 1, HIGH, LOW)
    block = levels.astype(np.uint8).reshape(ROWS, COLS)
    ch, cw = height // ROWS, width // COLS
    img = np.full((height, width, 3), LOW, dtype=np.uint8)
    grid = np.repeat(np.repeat(block, ch, axis=0), cw, axis=1)
    img[: ch * ROWS, : cw * COLS] = grid[:, :, None]
    return img


def _to_hwc_255(image) -> np.ndarray:
    if hasattr(image, "detach"):  # torch.Tensor, without importing torch
        image = image.detach().cpu()
        if image.dtype.is_floating_point:
            image = image.float()
        image = image.numpy()
    a = np.asarray(image)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3:
        raise ValueError(f"Expected an image of 2 or 3 dimensions; found shape {a.shape}.")
    # Images are at least 48x64, so a leading 1 or 3 can only be the channel axis.
    if a.shape[0] in (1, 3) and a.shape[2] not in (1, 3):
        a = np.moveaxis(a, 0, 2)
    if a.shape[2] not in (1, 3):
        raise ValueError(f"Expected 1 or 3 channels (HWC or CHW); found shape {a.shape}.")
    floating = np.issubdtype(a.dtype, np.floating)
    a = a.astype(np.float32)
    if floating and a.size and float(a.max()) <= 1.0 + 1e-3:
        a = a * 255.0
    return a


def decode_frame_identity(image) -> tuple[int, int, int]:
    """Read ``(episode_index, frame_index, camera)`` back from a (decoded) factory frame.

    Accepts uint8 HWC, uint8 CHW, or float CHW/HWC in [0, 1] (numpy arrays or torch tensors), of
    the size the frame was written at. Raises ValueError when the image is too small or the
    checksum does not match (not a factory frame, wrong size, or damaged beyond recognition).
    """
    a = _to_hwc_255(image)
    h, w = a.shape[:2]
    check_size(h, w)
    gray = a.mean(axis=2)
    ch, cw = h // ROWS, w // COLS
    mh, mw = ch // 4, cw // 4
    cells = gray[: ch * ROWS, : cw * COLS].reshape(ROWS, ch, COLS, cw)
    means = cells[:, mh : ch - mh, :, mw : cw - mw].mean(axis=(1, 3))
    word = 0
    for bit in (means.reshape(-1) > 128).tolist():
        word = word << 1 | int(bit)
    payload, check = word >> 16, word & 0xFFFF
    if _checksum(payload) != check:
        raise ValueError(
            "Frame identity checksum mismatch: the image is not a factory frame of this size, "
            "or it is damaged beyond recognition."
        )
    return payload >> 18, (payload >> 2) & 0xFFFF, payload & 0x3
