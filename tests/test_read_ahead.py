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
    [None, {"observation.images.cam0": [-0.1, 0.0], "action": [0.0, 0.1]}],
    ids=["no-window", "window"],
)
def test_frames_kept_unconverted_give_the_same_batches(cams, monkeypatch, delta):
    """Without workers: frames are served from kept decoded frames (counted), and every
    column of every batch equals reading frame by frame. With a window on cam0, that camera
    is kept as RGB windows and cam1 as decoded frames."""
    taken = []
    take = VideoReader.take_ahead

    def spy(self, count):
        taken.append(count)
        return take(self, count)

    monkeypatch.setattr(VideoReader, "take_ahead", spy)
    got = _batches(cams, delta_timestamps=delta)
    assert sum(taken) > 100  # most frames came from kept decoded frames
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
    assert ds._held_bytes() == sum(rgb) // 2
    delta = {"observation.images.cam0": [-0.1, 0.0]}
    ds = ChunkedEpisodeDataset(
        cams, batch_size=8, chunk_frames=8, tuning=WIDE, delta_timestamps=delta
    )
    assert ds._held_bytes() == 2 * rgb[0] + rgb[1] // 2


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
