"""Keyframes from the mp4 index (stss), the automatic keyframe chunks, and resuming a state
saved with the even plan."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import numpy as np
import pytest

from robo_resume import ChunkedEpisodeDataset, StreamTuning
from robo_resume.audit import consume
from robo_resume.errors import CorruptFileError
from robo_resume.format import load_metadata
from robo_resume.format.mp4_index import keyframe_frames, mp4_keyframe_samples
from robo_resume.format.video import VideoReader


def box(kind: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def full(kind: bytes, payload: bytes) -> bytes:
    return box(kind, b"\0\0\0\0" + payload)


def trak(handler: bytes, stbl_children: bytes) -> bytes:
    hdlr = full(b"hdlr", b"\0\0\0\0" + handler + b"\0" * 12)
    stbl = box(b"stbl", stbl_children)
    return box(b"trak", box(b"mdia", full(b"mdhd", b"\0" * 20) + hdlr + box(b"minf", stbl)))


def stss(*numbers: int, count: int | None = None) -> bytes:
    n = len(numbers) if count is None else count
    return full(b"stss", struct.pack(f">I{len(numbers)}I", n, *numbers))


def stsz(count: int) -> bytes:
    return full(b"stsz", struct.pack(">II", 0, count))


def mp4(tmp_path: Path, *boxes: bytes, name: str = "v.mp4") -> Path:
    p = tmp_path / name
    p.write_bytes(box(b"ftyp", b"isom\0\0\0\0") + b"".join(boxes))
    return p


def test_stss_of_the_video_track(tmp_path):
    audio = trak(b"soun", stss(1, 2))
    video = trak(b"vide", stsz(30) + stss(1, 11, 21))
    p = mp4(tmp_path, box(b"mdat", b"x" * 40), box(b"moov", audio + video))
    assert mp4_keyframe_samples(p).tolist() == [0, 10, 20]


def test_no_stss_means_every_sample_is_a_keyframe(tmp_path):
    p = mp4(tmp_path, box(b"moov", trak(b"vide", stsz(5))), box(b"mdat", b"x" * 5))
    assert mp4_keyframe_samples(p).tolist() == [0, 1, 2, 3, 4]


def test_fragmented_or_no_video_falls_back(tmp_path):
    video = trak(b"vide", stss(1))
    assert mp4_keyframe_samples(mp4(tmp_path, box(b"moov", video), box(b"moof"))) is None
    frag = box(b"moov", video + box(b"mvex"))
    assert mp4_keyframe_samples(mp4(tmp_path, frag, name="f.mp4")) is None
    assert (
        mp4_keyframe_samples(mp4(tmp_path, box(b"moov", trak(b"soun", stss(1))), name="a")) is None
    )
    assert mp4_keyframe_samples(mp4(tmp_path, box(b"mdat", b"x"), name="n.mp4")) is None


def test_damaged_index_is_refused_with_the_file_named(tmp_path):
    # An entry count far beyond the box: refused before anything is allocated.
    p = mp4(tmp_path, box(b"moov", trak(b"vide", stss(1, count=2**31))))
    with pytest.raises(CorruptFileError) as e:
        mp4_keyframe_samples(p)
    msg = str(e.value)
    assert "stss entries" in msg and str(p) in msg and "Expected 2147483648" in msg
    # A box claiming more bytes than the file has.
    q = tmp_path / "big.mp4"
    q.write_bytes(box(b"ftyp", b"isom") + struct.pack(">I4s", 10**6, b"moov") + b"\0" * 16)
    with pytest.raises(CorruptFileError, match=r"box b'moov' at offset 12 to fit .*size 1000000"):
        mp4_keyframe_samples(q)
    # A sample count beyond the file size.
    r = mp4(tmp_path, box(b"moov", trak(b"vide", stsz(2**32 - 1))), name="r.mp4")
    with pytest.raises(CorruptFileError, match="samples"):
        mp4_keyframe_samples(r)
    # Sample numbers out of order.
    s = mp4(tmp_path, box(b"moov", trak(b"vide", stss(1, 9, 5))), name="s.mp4")
    with pytest.raises(CorruptFileError, match="increasing order"):
        mp4_keyframe_samples(s)


@pytest.mark.parametrize(
    "codec,gop", [("av1", 2), ("h264", 7), ("h264", 250), ("mpeg4", 12), ("mpeg4", 1)]
)
def test_same_keyframes_as_demuxing(factory, codec, gop):
    ds = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec=codec, gop=gop)
    fps = load_metadata(ds.root).fps
    files = sorted(Path(ds.root).glob("videos/**/*.mp4"))
    assert files
    for p in files:
        times = VideoReader(p).keyframe_times()
        demuxed = np.round(np.asarray(times) * fps).astype(np.int64)
        assert mp4_keyframe_samples(p).tolist() == demuxed.tolist()
        assert keyframe_frames(p, fps).tolist() == demuxed.tolist()


def test_seek_to_a_keyframe_given_as_float32_lands_on_it(factory):
    ds = factory(episode_lengths=(90,), num_cameras=1, codec="h264", gop=25, fps=30)
    (p,) = sorted(Path(ds.root).glob("videos/**/*.mp4"))
    r = VideoReader(p)
    t = float(np.float32(50 / 30))  # as read from a float32 timestamp column: 1.6666666269
    assert t < 50 / 30
    r.frames_at([t], tolerance_s=1e-4)
    assert r.decoded <= 3  # not the 26+ frames from the keyframe before (25)
    r.close()


def test_auto_cuts_long_gops_only(factory):
    long = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec="mpeg4", gop=12)
    ds = ChunkedEpisodeDataset(long.root, batch_size=4, chunk_frames=8)
    assert ds.keyframe_cuts
    # File 0 holds episodes 0 (30 frames) and 1 (41): keyframes at 0/12/24 of episode 0 and
    # 6/18/30 of episode 1; 12 > chunk_frames: chunks run from keyframe to keyframe.
    stops = {e: [c.stop for c in ds.chunks if c.episode_index == e] for e in range(3)}
    assert stops == {0: [12, 24, 30], 1: [6, 18, 30, 41], 2: [12, 24, 25]}
    short = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec="av1", gop=2)
    ds = ChunkedEpisodeDataset(short.root, batch_size=4, chunk_frames=8)
    assert not ds.keyframe_cuts
    assert [c.length for c in ds.chunks][:4] == [8, 8, 8, 6]
    off = ChunkedEpisodeDataset(
        long.root, batch_size=4, tuning=StreamTuning(cut_at_keyframes=False)
    )
    assert not off.keyframe_cuts


def test_reading_many_files_is_announced(factory, monkeypatch, caplog):
    import robo_resume.format.keyframes as positions

    long = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec="mpeg4", gop=12)
    with caplog.at_level(logging.INFO, logger="robo_resume"):
        ChunkedEpisodeDataset(long.root, batch_size=4, chunk_frames=8)
    assert not [m for m in caplog.messages if "reading the keyframes" in m]  # 2 files: quiet
    monkeypatch.setattr(positions, "_MANY_FILES", 2)
    with caplog.at_level(logging.INFO, logger="robo_resume"):
        ChunkedEpisodeDataset(long.root, batch_size=4, chunk_frames=8)
    [line] = [m for m in caplog.messages if "reading the keyframes" in m]
    assert "of 2 video files of 'observation.images.cam0'" in line
    assert "cut_at_keyframes=False" in line


def test_auto_without_video_files_is_the_even_plan(factory, tmp_path):
    import shutil

    src = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec="mpeg4", gop=12)
    root = tmp_path / "novideo"
    shutil.copytree(src.root, root)
    shutil.rmtree(root / "videos")
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8)
    assert not ds.keyframe_cuts
    assert [c.length for c in ds.chunks][:4] == [8, 8, 8, 6]
    with pytest.raises(FileNotFoundError):
        ChunkedEpisodeDataset(root, batch_size=4, tuning=StreamTuning(cut_at_keyframes=True))


def test_state_saved_with_the_even_plan_resumes_exactly(factory, caplog):
    """What a state of a version before keyframe chunks (the even plan) gives: the run
    without cuts up to the crash, then the default dataset adopts the even plan."""
    src = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec="mpeg4", gop=12)
    kw = dict(batch_size=4, seed=3, chunk_frames=8)

    def old(**k):
        return ChunkedEpisodeDataset(
            src.root, **kw, tuning=StreamTuning(cut_at_keyframes=False), **k
        )

    def new(**k):
        return ChunkedEpisodeDataset(src.root, **kw, **k)

    assert new().chunks != old().chunks  # the default plan differs
    full, _ = consume(old, epochs=2, num_workers=0)
    before, state = consume(old, epochs=2, num_workers=0, stop_after=7)
    state = json.loads(json.dumps(state))
    with caplog.at_level(logging.INFO, logger="robo_resume"):
        after, _ = consume(
            new, epochs=2, num_workers=0, stop_after=len(full) - 7, resume_state=state
        )
    got = [list(b) for _, b in before] + [list(b) for _, b in after]
    assert got == [list(b) for _, b in full]
    assert any("not cut at keyframes" in r.getMessage() for r in caplog.records)
    # A state of the keyframe plan is not re-planned.
    _, kf_state = consume(new, epochs=2, num_workers=0, stop_after=5)
    ds = new(resume_state=kf_state)
    assert ds.keyframe_cuts and ds.chunks == new().chunks


def test_auto_reads_only_the_first_files_of_a_short_gop_dataset(factory, monkeypatch):
    from robo_resume.format import keyframes as positions
    from robo_resume.stream.tuning import AUTO_FILES

    src = factory(
        episode_lengths=(9,) * (AUTO_FILES + 3),
        num_cameras=1,
        codec="mpeg4",
        gop=2,
        episodes_per_file=1,
    )
    read = []
    real = positions.keyframe_frames

    def counted(path, fps, **kw):
        read.append(path)
        return real(path, fps, **kw)

    monkeypatch.setattr(positions, "keyframe_frames", counted)
    ds = ChunkedEpisodeDataset(src.root, batch_size=4, chunk_frames=4)
    assert not ds.keyframe_cuts
    assert len(read) == AUTO_FILES
    read.clear()
    ds = ChunkedEpisodeDataset(
        src.root, batch_size=4, chunk_frames=4, tuning=StreamTuning(cut_at_keyframes=True)
    )
    assert ds.keyframe_cuts and len(read) == AUTO_FILES + 3


def test_cuts_follow_the_window_lookback(factory):
    src = factory(episode_lengths=(30, 41, 25), num_cameras=1, codec="mpeg4", gop=12)
    fps = load_metadata(src.root).fps
    cam = "observation.images.cam0"
    ds = ChunkedEpisodeDataset(
        src.root, batch_size=4, chunk_frames=8, delta_timestamps={cam: [-2 / fps, 0.0]}
    )
    # Keyframes at 0/12/24 of episode 0, 6/18/30 of episode 1, 0/12/24 of episode 2: each cut
    # 2 frames later, so a chunk's first window (frames start-2, start) starts on a keyframe.
    stops = {e: [c.stop for c in ds.chunks if c.episode_index == e] for e in range(3)}
    assert stops == {0: [14, 26, 30], 1: [8, 20, 32, 41], 2: [14, 25]}


def test_unreadable_file_error_names_it(tmp_path):
    p = tmp_path / "empty.mp4"
    p.write_bytes(b"")
    with pytest.raises(CorruptFileError) as e:
        keyframe_frames(p, 30, episode=4)
    msg = str(e.value)
    assert "keyframes of a video file cannot be read" in msg
    assert str(p) in msg and "episode 4" in msg and "cut_at_keyframes=False" in msg
