"""Conversion straight into the batch (robo_resume.format.swscale) against PyAV's own."""

from __future__ import annotations

import threading

import av
import numpy as np
import pytest

from robo_resume.format import swscale
from robo_resume.format.rgb import planar_rgb


def _frame(fmt: str, w: int, h: int, seed: int = 0) -> av.VideoFrame:
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=fmt)


def _pyav_planar(frame: av.VideoFrame) -> np.ndarray:
    g = frame.reformat(format="gbrp")
    h, w = frame.height, frame.width
    planes = [np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:h, :w] for p in g.planes]
    return np.stack([planes[2], planes[0], planes[1]])  # gbrp planes are G, B, R


def test_swscale_loads_here():
    # CI runs PyAV's wheel, which bundles swscale: the fast path must be the one tested.
    assert swscale.available()


@pytest.mark.parametrize("fmt", ["yuv420p", "yuvj420p", "yuv444p", "nv12", "gray"])
@pytest.mark.parametrize("size", [(96, 96), (224, 224), (640, 480), (32, 48)])
def test_convert_equals_pyav_reformat(fmt, size):
    w, h = size
    frame = _frame(fmt, w, h)
    batch = np.zeros((3, 3, h, w), np.uint8)  # convert into a row of a batch, as the stream does
    assert swscale.convert_gbrp(frame, batch[1])
    np.testing.assert_array_equal(batch[1], _pyav_planar(frame))
    assert not batch[0].any() and not batch[2].any()  # nothing written outside the row


def test_declines_what_it_cannot_do_and_writes_nothing():
    frame = _frame("yuv420p", 96, 96)
    for out in (
        np.zeros((3, 96, 90), np.uint8),  # another size
        np.zeros((96, 96, 3), np.uint8),  # interleaved layout
        np.zeros((3, 96, 192), np.uint8)[:, :, ::2],  # not contiguous
        np.zeros((3, 96, 96), np.float32),  # another dtype
        np.zeros(3 * 96 * 96 + 1, np.uint8)[1:].reshape(3, 96, 96),  # not aligned
    ):
        assert not swscale.convert_gbrp(frame, out)
        assert not out.any()
    odd = _frame("yuv420p", 90, 90)  # rows of 90 bytes are not 16-byte aligned
    assert not swscale.convert_gbrp(odd, np.zeros((3, 90, 90), np.uint8))


def test_planar_rgb_equals_rgb24_on_both_paths():
    for w, h in ((96, 96), (90, 90)):  # direct conversion, and the copy path
        frame = _frame("yuv420p", w, h, seed=w)
        out = np.empty((3, h, w), np.uint8)
        planar_rgb(frame, out)
        np.testing.assert_array_equal(out, frame.to_ndarray(format="rgb24").transpose(2, 0, 1))


def test_threads_convert_concurrently_with_their_own_contexts():
    frames = [_frame("yuv420p", 96, 96, seed=s) for s in range(8)]
    expected = [_pyav_planar(f) for f in frames]
    results: dict[int, list[np.ndarray]] = {}

    def work(t: int) -> None:
        outs = []
        for _ in range(50):
            for f in frames:
                out = np.empty((3, 96, 96), np.uint8)
                assert swscale.convert_gbrp(f, out)
                outs.append(out)
        results[t] = outs

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outs in results.values():
        for k, out in enumerate(outs):
            np.testing.assert_array_equal(out, expected[k % len(frames)])
    assert len(results) == 4


def test_convert_at_an_address_writes_that_row_and_declines_the_rest():
    # the stream's path: rows of one checked batch buffer by address (convert_gbrp_at)
    frame = _frame("yuv420p", 96, 96, seed=3)
    batch = np.zeros((4, 3, 96, 96), np.uint8)
    base, step = batch.ctypes.data, batch.strides[0]
    assert swscale.convert_gbrp_at(frame, base + 2 * step, batch.shape[1:])
    np.testing.assert_array_equal(batch[2], _pyav_planar(frame))
    assert not batch[[0, 1, 3]].any()
    assert not swscale.convert_gbrp_at(frame, base + 1, batch.shape[1:])  # not aligned
    assert not swscale.convert_gbrp_at(frame, base, (3, 96, 80))  # another size
    assert not batch[[0, 1, 3]].any()


def test_writer_converts_its_format_and_size_and_declines_the_rest():
    # gbrp_writer: convert_gbrp_at with the per-stream lookups made once
    write = swscale.gbrp_writer("yuv420p", 96, 96)
    assert write is not None
    batch = np.zeros((4, 3, 96, 96), np.uint8)
    base, step = batch.ctypes.data, batch.strides[0]
    frames = [_frame("yuv420p", 96, 96, seed=s) for s in (5, 6)]
    assert write(frames[0], base + 3 * step) and write(frames[1], base)
    np.testing.assert_array_equal(batch[3], _pyav_planar(frames[0]))
    np.testing.assert_array_equal(batch[0], _pyav_planar(frames[1]))
    before = batch.copy()
    assert not write(_frame("yuv444p", 96, 96), base + step)  # another format
    assert not write(_frame("yuv420p", 96, 80), base + step)  # another size
    assert not write(frames[0], base + step + 1)  # not aligned
    np.testing.assert_array_equal(batch, before)  # nothing written by the refusals
    assert swscale.gbrp_writer("yuv420p", 90, 90) is None  # rows not 16-byte aligned
    assert swscale.gbrp_writer("no-such-format", 96, 96) is None


def test_frames_at_into_a_batch_equals_rgb24_by_address(factory):
    # VideoReader.frames_at converting straight into rows of a batch (by address) gives the
    # frames rgb24 gives, each in its row, whatever the row order
    from robo_resume.format import VideoReader
    from robo_resume.format.rgb import row_addresses

    ds = factory(episode_lengths=(20,), num_cameras=1, height=96, width=96)
    path = next(ds.root.glob("videos/**/*.mp4"))
    times = np.arange(0, 12) / ds.fps
    rows = np.array([5, 0, 9, 3, 11, 1, 7, 2, 10, 4, 8, 6])
    with VideoReader(path) as r:
        want = r.frames_at(times)  # (n, H, W, 3) rgb24
    batch = np.zeros((12, 3, 96, 96), np.uint8)
    assert row_addresses(batch)[0] is not None  # the address path is the one taken
    with VideoReader(path) as r:
        r.frames_at(times, channels_first=True, out=batch, rows=rows)
    for i, row in enumerate(rows.tolist()):
        np.testing.assert_array_equal(batch[row], want[i].transpose(2, 0, 1))


def test_row_addresses_are_remembered_per_array_object_only():
    """A remembered address is given back for the same array object only: an entry whose
    array is gone (a new array may get its id) is recomputed, views get their own address."""
    import robo_resume.format.rgb as rgb

    a = np.empty((4, 3, 16, 16), dtype=np.uint8)
    assert rgb.row_addresses(a) == (a.ctypes.data, a.strides[0])
    assert rgb.row_addresses(a) == (a.ctypes.data, a.strides[0])  # from the memo
    b = a[1:]
    assert rgb.row_addresses(b) == (a.ctypes.data + a.strides[0], a.strides[0])
    c = np.empty((4, 3, 16, 16), dtype=np.uint8)

    class Gone:  # a dead weak reference under c's id: a freed array's entry
        def __call__(self):
            return None

    rgb._ADDRESSES[id(c)] = (Gone(), 1, 2)
    assert rgb.row_addresses(c) == (c.ctypes.data, c.strides[0])
    assert rgb.row_addresses(np.empty((4, 16, 16, 3), np.float32)) == (None, 0)
