"""Byte ranges of mp4 chunks (robo_resume/format/mp4_ranges.py, ranged_file.py): the sample
tables agree with FFmpeg's demuxer, and decoding a chunk from a RangedFile holding only the
computed pieces gives the pixels of a decode of the whole file (open50's mpeg4, AV1 written by
lerobot and by PyAV, h264 with B-frames, a file whose first track is audio)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import av
import numpy as np
import pytest

from robo_resume.errors import BytesNotHeldError, CorruptFileError, VideoDecodeError
from robo_resume.format import load_metadata
from robo_resume.format.mp4_ranges import READ_THROUGH, SampleTable, read_sample_table
from robo_resume.format.ranged_file import RangedFile, merge_spans

TOL = 1e-4  # VideoReader's default tolerance_s


def _write(path: Path, codec: str, n: int, options: dict[str, str], *, audio_first=False) -> Path:
    """An mp4 of ``n`` 320x240 frames of random 8x8 blocks (every frame different), 30 fps."""
    with av.open(str(path), "w") as c:
        audio = c.add_stream("aac", rate=16000) if audio_first else None
        s = c.add_stream(codec, rate=30, options=options)
        s.width, s.height, s.pix_fmt = 320, 240, "yuv420p"
        rng = np.random.default_rng(0)
        for i in range(n):
            base = rng.integers(0, 255, size=(30, 40, 3), dtype=np.uint8)
            img = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
            if audio is not None and i % 2 == 0:
                tone = np.zeros((1, 1024), dtype=np.float32) + np.float32(i % 7) / 10
                frame = av.AudioFrame.from_ndarray(tone, format="fltp", layout="mono")
                frame.sample_rate, frame.pts = 16000, i * 512
                for p in audio.encode(frame):
                    c.mux(p)
        for p in s.encode():
            c.mux(p)
        if audio is not None:
            for p in audio.encode():
                c.mux(p)
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory, lerobot_written) -> dict[str, Path]:
    """The videos under test, by name."""
    root = tmp_path_factory.mktemp("mp4ranges")
    files = {
        # two B-frames, b-pyramid as x264 sets it by default, a GOP longer than a chunk
        "h264_bf2": _write(root / "h264.mp4", "libx264", 240, {"bf": "2", "g": "40"}),
        "h264_bf3_pyramid": _write(
            root / "pyr.mp4",
            "libx264",
            150,
            {"bf": "3", "g": "30", "x264-params": "b-pyramid=normal"},
        ),
        "h264_audio_first": _write(
            root / "audio.mp4", "libx264", 90, {"bf": "2", "g": "30"}, audio_first=True
        ),
        "lerobot_av1": lerobot_written / "videos/observation.images.top/chunk-000/file-000.mp4",
    }
    if "libsvtav1" in av.codecs_available:  # lerobot's encoder and its settings (g=2, crf=30)
        files["pyav_av1"] = _write(root / "av1.mp4", "libsvtav1", 120, {"g": "2", "crf": "30"})
    return files


def _open50_file(open50: Path, i: int = 0) -> Path:
    return sorted((open50 / "videos").glob("*/*/*.mp4"))[i]


def _table(path: Path) -> SampleTable:
    data = path.read_bytes()
    return read_sample_table(lambda a, b: data[a:b], len(data), name=str(path))


def _decode(src, table: SampleTable, first: int, stop: int, threads: int) -> np.ndarray:
    """Frames [first, stop) decoded the way VideoReader does: one backward seek to the time
    of ``first`` (keyframe, rounded ticks), then forward, matching times within TOL."""
    times = table.frame_times[first:stop]
    with av.open(src) as c:
        s = c.streams.video[0]
        s.thread_type, s.thread_count = "AUTO", threads
        c.seek(round(times[0] * table.timescale), stream=s, backward=True, any_frame=False)
        out = []
        for frame in c.decode(s):
            t = frame.pts / table.timescale
            if t < times[0] - TOL:
                continue
            assert abs(t - times[len(out)]) < TOL, (t, times[len(out)])
            out.append(frame.to_ndarray(format="rgb24"))
            if len(out) == len(times):
                break
    return np.stack(out)


def _chunks(table: SampleTable) -> list[tuple[int, int]]:
    """The first frame, the first frames, a chunk ending at the last frame, chunks starting on
    and right after a keyframe, one ending right before a keyframe, a long one."""
    n, keys = table.num_frames, table.keyframes
    order = table.order
    key_frames = sorted(int(np.flatnonzero(order == k)[0]) for k in keys)  # as frames
    k = key_frames[min(2, len(key_frames) - 1)]
    later = key_frames[-1]
    return [
        (0, 1),
        (0, 16),
        (n - 10, n),
        (n - 1, n),
        (k, min(k + 20, n)),
        (k + 1, min(k + 21, n)),
        (max(later - 12, 0), later),
        (n // 3, min(n // 3 + 64, n)),
    ]


def _check_pieces(table: SampleTable, f: RangedFile, first: int, stop: int) -> float:
    """Spans inside the file, ordered and disjoint; bytes held within range + open spans +
    the holes merged; returns held / the frames' own bytes."""
    spans = f.spans
    assert spans == merge_spans(spans)  # sorted, disjoint, not touching
    assert all(0 <= s < e <= table.size for s, e in spans)
    start, end = table.frame_range_bytes(first, stop)
    assert 0 <= start < end <= table.size
    assert any(s <= start and end <= e for s, e in spans)
    opened = table.open_spans()
    bound = (end - start) + sum(e - s for s, e in opened) + READ_THROUGH * len(opened)
    assert f.held <= bound
    return f.held / table.frame_bytes(first, stop)


def test_sample_table_is_what_the_demuxer_reads(open50, written):
    """Offsets, sizes, times and keyframes equal the packets FFmpeg demuxes, for every file."""
    for path in [_open50_file(open50), _open50_file(open50, 7), *written.values()]:
        table = _table(path)
        with av.open(str(path)) as c:
            s = c.streams.video[0]
            packets = [p for p in c.demux(s) if p.size]
            assert table.timescale == s.time_base.denominator and s.time_base.numerator == 1
        assert table.num_frames == len(packets)
        assert table.offsets.tolist() == [p.pos for p in packets]
        assert table.sizes.tolist() == [p.size for p in packets]
        assert table.pts.tolist() == [p.pts for p in packets]
        assert table.keyframes.tolist() == [i for i, p in enumerate(packets) if p.is_keyframe]
        assert np.all(np.diff(table.frame_times) > 0)
        assert table.codec in ("mp4v", "avc1", "av01")
        # the head, then the moov (a header read first when the head does not reach it)
        assert table.spans_read[0] == (0, min(64 * 1024, table.size))
        assert all(table.moov[0] <= s and e <= table.moov[1] for s, e in table.spans_read[1:])


def test_reorder_depth_from_composition_offsets(open50, written):
    """0 without B-frames (mpeg4, AV1), 1 for two B-frames, 2 with a b-pyramid; the decode
    window reaches that many samples past the last frame's sample."""
    assert _table(_open50_file(open50)).reorder_depth == 0
    assert _table(written["lerobot_av1"]).reorder_depth == 0
    h264 = _table(written["h264_bf2"])
    pyramid = _table(written["h264_bf3_pyramid"])
    assert h264.reorder_depth >= 1 and pyramid.reorder_depth == 2
    frame = 30
    last = int(h264.order[frame])
    assert h264.decode_samples(frame, frame + 1)[1] == last + 1 + h264.reorder_depth
    assert (
        h264.decode_samples(frame, frame + 1, decoder_delay=2)[1] == last + 3 + h264.reorder_depth
    )


@pytest.mark.parametrize(
    "name",
    ["open50", "lerobot_av1", "pyav_av1", "h264_bf2", "h264_bf3_pyramid", "h264_audio_first"],
)
def test_chunk_decodes_like_the_whole_file(name, open50, written, capsys):
    """Pixels from a RangedFile holding only the pieces equal a decode of the whole file, with
    one decoder thread and with FFmpeg's automatic frame threads."""
    # robo_resume's own factory writes AV1: an encoder missing is a failure, not a skip
    assert name in written or name == "open50", f"{name}: no AV1 encoder in this PyAV build"
    path = _open50_file(open50) if name == "open50" else written[name]
    table = _table(path)
    data = path.read_bytes()
    ratios = []
    for first, stop in _chunks(table):
        f = table.chunk_file(first, stop, lambda a, b: data[a:b])
        ratios.append(_check_pieces(table, f, first, stop))
        for threads in (1, 0):
            want = _decode(str(path), table, first, stop, threads)
            f.seek(0)
            got = _decode(f, table, first, stop, threads)
            assert np.array_equal(got, want), (name, first, stop, threads)
    with capsys.disabled():
        print(
            f"\n{name}: bytes held / bytes of the frames' samples: "
            + ", ".join(f"{r:.2f}" for r in ratios)
        )


@pytest.mark.parametrize("name", ["open50", "pyav_av1"])
def test_plain_pieces_suffice_without_reordering(name, open50, written):
    """Without eof_span (no flush at the end of the span), one decoder thread and no
    reordering (reorder_depth 0): the span alone holds what the decoder reads."""
    # robo_resume's own factory writes AV1: an encoder missing is a failure, not a skip
    assert name in written or name == "open50", f"{name}: no AV1 encoder in this PyAV build"
    path = _open50_file(open50) if name == "open50" else written[name]
    table, data = _table(path), path.read_bytes()
    assert table.reorder_depth == 0
    for first, stop in _chunks(table):
        f = RangedFile(table.size, [(s, data[s:e]) for s, e in table.pieces(first, stop)])
        assert np.array_equal(
            _decode(f, table, first, stop, 1), _decode(str(path), table, first, stop, 1)
        )


def test_open50_chunks_of_64_frames(open50, capsys):
    """Every 64-frame chunk of every open50 file: pieces inside the file and at most 1 MB,
    a median near lerobot's 7.7 KB a frame; three chunks decode identically."""
    held, own = [], []
    for path in sorted((open50 / "videos").glob("*/*/*.mp4")):
        with open(path, "rb") as fh:
            size = fh.seek(0, io.SEEK_END)

            def read(a: int, b: int) -> bytes:
                fh.seek(a)
                return fh.read(b - a)

            table = read_sample_table(read, size, name=str(path))
            assert len(table.spans_read) <= 3  # head, moov header, moov
            for first in range(0, table.num_frames - 64, 64):
                spans = table.pieces(first, first + 64)
                assert spans == merge_spans(spans) and spans[-1][1] <= size
                held.append(sum(e - s for s, e in spans))
                own.append(table.frame_bytes(first, first + 64))
    held_a, own_a = np.array(held), np.array(own)
    assert held_a.max() <= 1_000_000 and np.all(held_a >= own_a)
    assert 400_000 <= np.median(held_a) <= 1_000_000
    with capsys.disabled():
        print(
            f"\nopen50, {len(held)} chunks of 64 frames: held median {np.median(held_a) / 1e6:.3f}"
            f" MB (min {held_a.min() / 1e6:.3f}, max {held_a.max() / 1e6:.3f}); held / frames' "
            f"samples median {np.median(held_a / own_a):.2f}, max {(held_a / own_a).max():.2f}"
        )


def test_frame_at_a_v30_episode_time(open50):
    """``from_timestamp + timestamp`` (float32 parquet times) maps to the file's frame; a time
    between frames is refused, naming the file and the nearest frames."""
    meta = load_metadata(open50)
    video = meta.columns.videos["image"]
    e = int(np.flatnonzero(video.from_timestamp > 0)[0]) if np.any(video.from_timestamp > 0) else 0
    ref = meta.episode(e).videos["image"]
    path = open50 / ref.path
    table = _table(path)
    first = round(ref.from_timestamp * meta.fps)
    for k in (0, 1, 57, int(meta.columns.length[e]) - 1):
        t = ref.from_timestamp + float(np.float32(k / meta.fps))
        assert table.frame_at(t) == first + k
    with pytest.raises(VideoDecodeError, match=r"No video frame.*frames at .*file .*\.mp4"):
        table.frame_at(ref.from_timestamp + 0.5 / meta.fps)


def test_read_outside_the_pieces_names_offset_and_ranges(written):
    path = written["h264_bf2"]
    data = path.read_bytes()
    f = RangedFile(len(data), {0: data[:100], 5000: data[5000:6000]}, name="s3://bucket/x.mp4")
    assert f.read(150) == data[:100]  # a short read, up to the end of the piece
    f.seek(5500)
    assert f.read(10) == data[5500:5510]
    f.seek(100)
    with pytest.raises(
        BytesNotHeldError,
        match=r"Expected a byte offset inside the held ranges \[0-100, 5000-6000\]\. "
        r"Found a read of \d+ bytes at offset 100\. At file s3://bucket/x\.mp4\. Fix: ",
    ):
        f.read(10)
    f.seek(len(data))
    assert f.read(10) == b""
    # eof_span reads as the end of the file, held or not; a read before it stops at it
    g = RangedFile(len(data), [(0, data[:100]), (5000, data[5000:6000])], eof_span=(60, 5500))
    assert g.read(100) == data[:60]
    assert g.read(10) == b""
    g.seek(2000)
    assert g.read(10) == b""
    g.seek(5400)
    assert g.read(10) == b""
    g.seek(5500)
    assert g.read(3) == data[5500:5503]
    with pytest.raises(ValueError, match="do not fit"):
        RangedFile(10, {5: b"0123456789"})


def test_decoding_without_the_needed_pieces_raises(written):
    """Holding the open spans but not the chunk: PyAV surfaces the named error."""
    path = written["h264_bf2"]
    table, data = _table(path), path.read_bytes()
    f = RangedFile(len(data), [(s, data[s:e]) for s, e in table.open_spans()], name=str(path))
    with pytest.raises(BytesNotHeldError, match=r"offset \d+\. At file .*h264\.mp4"):
        _decode(f, table, table.num_frames - 20, table.num_frames, 1)


def test_box_sizes_64_bit_and_zero(written):
    """A 64-bit mdat size (in place of FFmpeg's 8-byte 'free' + 32-bit header) and a last box
    of size 0 (to the end of the file) give the same table, and the chunk still decodes."""
    path = written["h264_bf2"]
    data = bytearray(path.read_bytes())
    table = _table(path)
    kinds = [b.kind for b in table.boxes]
    assert kinds[-3:] == ["free", "mdat", "moov"]  # FFmpeg's layout, moov at the end
    free, mdat, moov = table.boxes[-3:]
    assert free.end - free.start == 8 and mdat.payload - mdat.start == 8
    data[free.start : free.start + 16] = struct.pack(">I4sQ", 1, b"mdat", mdat.end - free.start)
    data[moov.start : moov.start + 4] = struct.pack(">I", 0)
    changed = read_sample_table(lambda a, b: bytes(data[a:b]), len(data), name="changed")
    assert [b.kind for b in changed.boxes][-2:] == ["mdat", "moov"]
    assert changed.boxes[-2].payload == mdat.payload and changed.boxes[-1].end == len(data)
    assert np.array_equal(changed.offsets, table.offsets)
    assert np.array_equal(changed.pts, table.pts)
    f = changed.chunk_file(100, 130, lambda a, b: bytes(data[a:b]))
    assert np.array_equal(_decode(f, changed, 100, 130, 1), _decode(str(path), table, 100, 130, 1))


def test_truncated_moov_and_missing_stss(open50, written):
    path = _open50_file(open50)
    data = path.read_bytes()
    table = _table(path)
    cut = data[: table.moov[0] + 1000]  # the file ends inside the moov
    with pytest.raises(CorruptFileError, match=r"box 'moov' at offset \d+ to fit.*At file cut"):
        read_sample_table(lambda a, b: cut[a:b], len(cut), name="cut")
    with pytest.raises(CorruptFileError, match=r"a 'moov' box.*Found ftyp,free,mdat"):
        read_sample_table(lambda a, b: cut[a:b], table.moov[0], name="no moov")
    # no stss: every sample is a keyframe (ISO 14496-12), so a chunk starts at its own sample
    at = data.index(b"stss", table.moov[0])
    no_stss = data[:at] + b"free" + data[at + 4 :]
    intra = read_sample_table(lambda a, b: no_stss[a:b], len(no_stss), name="no stss")
    assert intra.keyframes.tolist() == list(range(intra.num_frames))
    assert intra.decode_samples(50, 60) == (50, 60)
    assert table.decode_samples(50, 60)[0] < 50  # with stss: from the keyframe before
    # a table whose counts exceed their box
    at = data.index(b"stsz", table.moov[0])
    bad = data[: at + 12] + struct.pack(">I", 10**6) + data[at + 16 :]
    with pytest.raises(CorruptFileError, match=r"entries of box 'stsz'"):
        read_sample_table(lambda a, b: bad[a:b], len(bad), name="bad")
    with pytest.raises(CorruptFileError, match=r"a box header"):
        read_sample_table(lambda a, b: b"\0\0\0", 3, name="tiny")


def test_frame_range_arguments_checked(open50):
    table = _table(_open50_file(open50))
    with pytest.raises(ValueError, match=r"frames \[5, 5\)"):
        table.frame_range_bytes(5, 5)
    with pytest.raises(ValueError, match="decoder_delay >= 0"):
        table.frame_range_bytes(0, 5, decoder_delay=-1)
    with pytest.raises(ValueError, match=r"<= 427"):
        table.frame_range_bytes(0, table.num_frames + 1)


@pytest.mark.parametrize("name", ["open50", "h264_bf3_pyramid"])
def test_video_reader_reads_a_ranged_file(name, open50, written):
    """VideoReader(path, files=...) over table.chunk_file(...) gives frames_at's pixels of the
    whole file (its seek, tolerance and default decoder threads), twice (a reopen opens the
    pieces again)."""
    from robo_resume.format.video import VideoReader

    class Pieces:  # a FileAccess serving the chunk's pieces
        def __init__(self, make):
            self.make = make

        def is_file(self, path):
            return True

        def open(self, path):
            return self.make()

        def where(self, path):
            return path

    path = _open50_file(open50) if name == "open50" else written[name]
    table, data = _table(path), path.read_bytes()
    k = int(table.keyframes[2])
    for first, stop in [(k + 1, k + 40), (table.num_frames - 30, table.num_frames)]:
        times = table.frame_times[first:stop]
        with VideoReader(path) as whole:
            want = whole.frames_at(times)
        pieces = Pieces(lambda a=first, b=stop: table.chunk_file(a, b, lambda x, y: data[x:y]))
        reader = VideoReader(path, files=pieces)
        for opened in (1, 2):
            assert np.array_equal(reader.frames_at(times), want)
            assert reader.seeks == opened  # one seek per open: no fallback to frame 0
            reader.close()
