"""Read-ahead keeps decoded frames unconverted (stream/read_ahead.py, items/ranges.py ahead()).

With many open chunks a stream decodes a few frames of a chunk per visit and keeps them as
decoded (YUV) frames, converting each straight into its batch row later. The batches equal
those read frame by frame, and a broken video fails in the same read with the same error.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from test_bad_input_corpus import faststart_then_truncate

import robo_resume.stream.read_ahead as read_ahead
from robo_resume import ChunkedEpisodeDataset, StreamTuning
from robo_resume.errors import CorruptFileError, VideoDecodeError
from robo_resume.format.video import VideoReader
from robo_resume.items.windows import HeldWindows

WIDE = StreamTuning(interleave=32)
LENGTHS = (37, 52, 29, 44, 61, 33)


@pytest.fixture(scope="module")
def cams(factory):
    """Two cameras, several chunks per episode, one mp4 per episode."""
    return factory(episode_lengths=LENGTHS, num_cameras=2, episodes_per_file=1).root


def _batches(root, workers=0, **kw):
    ds = ChunkedEpisodeDataset(
        root, batch_size=8, chunk_frames=8, image_dtype="uint8", tuning=WIDE, seed=3, **kw
    )
    loader = ds.dataloader(
        num_workers=workers, multiprocessing_context="fork" if workers else None
    )  # forked workers see a patched READ_AHEAD_BYTES
    return [{k: v for k, v in b.items() if isinstance(v, torch.Tensor)} for b in loader]


def _equal(got, plain):
    assert len(got) == len(plain) > 10
    for a, p in zip(got, plain, strict=True):
        assert a.keys() == p.keys()
        for k in a:
            assert torch.equal(a[k], p[k]), k


@pytest.mark.parametrize(
    "delta",
    [
        None,
        {"observation.images.cam0": [-0.1, 0.0], "action": [0.0, 0.1]},
        {"observation.images.cam0": [0.0]},  # one frame: squeezed to (3, H, W)
        {"observation.images.cam0": [-0.2, 0.0, 0.1], "observation.images.cam1": [-0.1]},
    ],
    ids=["no-window", "window", "one-frame-window", "gapped-windows-both-cameras"],
)
def test_frames_kept_unconverted_give_the_same_batches(cams, monkeypatch, delta):
    """Without workers: frames are served from kept decoded frames (counted), and every
    column of every batch equals reading frame by frame. A camera with a window is kept as
    its distinct RGB frames and each window place's frame (HeldWindows), the other camera as
    decoded frames; windows reach over chunk and episode starts (clipped, padded)."""
    taken, windows = [], []
    take, put = VideoReader.take_ahead, HeldWindows.put

    def spy(self, count):
        taken.append(count)
        return take(self, count)

    def spy_put(self, buf, rows):
        windows.append(len(self))
        return put(self, buf, rows)

    monkeypatch.setattr(VideoReader, "take_ahead", spy)
    monkeypatch.setattr(HeldWindows, "put", spy_put)
    got = _batches(cams, delta_timestamps=delta)
    if delta is None or len(delta) - ("action" in delta) < 2:
        assert sum(taken) > 100  # most frames of a camera without a window: kept decoded
    if delta is not None:
        assert sum(windows) > 100  # most windows: put from kept distinct frames
    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", 0)  # one frame per read
    taken.clear()
    plain = _batches(cams, delta_timestamps=delta)
    assert not taken
    _equal(got, plain)


def test_frames_kept_unconverted_with_workers(cams, monkeypatch):
    """The same with 2 (forked) workers, windows on a camera and on the action."""
    delta = {"observation.images.cam1": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]}
    got = _batches(cams, 2, delta_timestamps=delta)
    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", 0)
    _equal(got, _batches(cams, 2, delta_timestamps=delta))


def test_held_bytes_count_decoded_frames_at_half_rgb(cams):
    """The budget counts a camera without a window as YUV 4:2:0 (1.5 bytes per pixel), one
    with a window as its RGB window."""
    ds = ChunkedEpisodeDataset(cams, batch_size=8, chunk_frames=8, tuning=WIDE)
    rgb = [int(np.prod(ds.items.camera_shape(c))) for c in ds.meta.camera_keys]
    assert ds.reader.frame_bytes() == sum(rgb) // 2
    delta = {"observation.images.cam0": [-0.1, 0.0]}
    ds = ChunkedEpisodeDataset(
        cams, batch_size=8, chunk_frames=8, tuning=WIDE, delta_timestamps=delta
    )
    assert ds.reader.frame_bytes() == 2 * rgb[0] + rgb[1] // 2


def test_a_video_cut_short_fails_in_the_same_read(factory, tmp_path, monkeypatch):
    """Episode 4's mp4 of cam1 (61 frames) is cut part way (its index kept at the front):
    frames from about 24 on do not decode. Read ahead, a decode failure is met while decoding
    ahead and kept in its place: the read that reaches it raises, with the same error type and
    message (file, episode, frames, stream position) and after the same batches as reading
    frame by frame. (Read-ahead of RGB arrays raised it early: a CorruptFileError at frame 24
    where frame by frame raises a VideoDecodeError at frame 56.)"""
    root = tmp_path / "ds"
    src = factory(episode_lengths=LENGTHS, num_cameras=2, episodes_per_file=1, codec="h264", gop=4)
    shutil.copytree(src.root, root)
    meta = ChunkedEpisodeDataset(root, batch_size=8).meta
    faststart_then_truncate(root / meta.episode(4).videos["observation.images.cam1"].path, 0.7)

    def run():
        ds = ChunkedEpisodeDataset(
            root, batch_size=8, chunk_frames=8, image_dtype="uint8", tuning=WIDE, seed=3
        )
        done = 0
        with pytest.raises((VideoDecodeError, CorruptFileError)) as info:
            for _ in ds.iter_batches():
                done += 1
        return done, type(info.value), str(info.value)

    taken = []
    take = VideoReader.take_ahead
    monkeypatch.setattr(VideoReader, "take_ahead", lambda s, c: taken.append(c) or take(s, c))
    ahead = run()
    assert sum(taken) > 50
    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", 0)
    plain = run()
    assert "episode 4" in plain[2] and "Raised while streaming frames" in plain[2], plain[2]
    assert ahead == plain


@pytest.mark.parametrize("m", [1, 3, 12])  # 12 windows of 2: the fancy-indexed path
@pytest.mark.parametrize("w", [1, 2])
def test_held_windows_put_and_array_give_the_windows(m, w):
    """Every window place gets its frame, by either path; a slice shares the frames."""
    rng = np.random.default_rng(m * 10 + w)
    frames = rng.integers(0, 255, (m + w + 2, 3, 4, 5), dtype=np.uint8)
    index = np.minimum(np.arange(m)[:, None] + np.arange(w) + 1, len(frames) - 1)
    held = HeldWindows(frames, index, squeeze=w == 1)
    want = frames[index][:, 0] if w == 1 else frames[index]
    np.testing.assert_array_equal(held.array(), want)
    buf = np.zeros((m + 4, *want.shape[1:]), dtype=np.uint8)
    rows = np.arange(m)[::-1] + 2  # rows in any order
    held.put(buf, rows)
    np.testing.assert_array_equal(buf[rows], want)
    assert not buf[:2].any() and not buf[m + 2 :].any()
    tail = held[1:]
    assert len(tail) == m - 1 and tail.frames is frames
    np.testing.assert_array_equal(tail.array(), want[1:])
