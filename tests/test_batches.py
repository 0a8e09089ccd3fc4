"""The batch path (``ds.dataloader()``) equals the item path collated by torch, exactly.

``ChunkedEpisodeDataset.dataloader`` builds whole batches in the workers (columns, one copy per
batch) instead of yielding items for ``default_collate``. These tests compare both paths on
the same dataset and options: same batches in the same order, same keys in the same order,
same dtypes, shapes and values. Nothing is sorted.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from robo_resume import CURSOR_KEY, ChunkedEpisodeDataset, LeRobotReader, StreamTuning
from robo_resume.stream.loader import BatchLoader


@pytest.fixture(scope="module")
def two_cams(factory):
    return factory(episode_lengths=(21, 34, 9, 27, 16), num_cameras=2, codec="av1", gop=2).root


def item_batches(ds, num_workers):
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=ds.batch_size,
        drop_last=ds.drop_last,
        num_workers=num_workers,
        **({"multiprocessing_context": "forkserver"} if num_workers else {}),
    )
    return list(loader)


def assert_same_batches(ours, theirs):
    assert len(ours) == len(theirs), f"{len(ours)} batches != {len(theirs)}"
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert list(a) == list(b), f"batch {k}: keys {list(a)} != {list(b)}"
        for key, want in b.items():
            got = a[key]
            if isinstance(want, torch.Tensor):
                assert got.dtype == want.dtype, f"batch {k} {key}: {got.dtype} != {want.dtype}"
                assert got.shape == want.shape, f"batch {k} {key}: {got.shape} != {want.shape}"
                assert torch.equal(got, want), f"batch {k} {key}: values differ"
            else:
                assert got == want, f"batch {k} {key}: {got} != {want}"


def assert_same_streams(ours, theirs, limit=None):
    """:func:`assert_same_batches` on two batch iterators, one pair at a time (none kept: the
    batches of a few 480x640 episodes are GBs, fresh memory for every one held), over their
    first ``limit`` batches (all: both must end together). The pairs' episode and frame
    indices, in order."""
    pairs = zip(ours, theirs, strict=limit is None)
    seen = []
    for k, (a, b) in enumerate(itertools.islice(pairs, limit)):
        try:
            assert_same_batches([a], [b])
        except AssertionError as exc:
            raise AssertionError(f"batch {k}: {exc}") from None
        seen.append({c: a[c] for c in ("episode_index", "frame_index") if c in a})
    if limit is not None:
        assert len(seen) == limit, f"{len(seen)} batches, expected {limit}"
    return seen


@pytest.mark.parametrize(
    ("num_workers", "batch_size", "interleave", "drop_last", "image_dtype", "delta"),
    [
        (0, 7, 4, False, "float32", False),
        (0, 32, 1, False, "uint8", False),
        (0, 5, 3, True, "float32", True),
        (2, 8, 4, False, "float32", False),  # uint8 across processes, float in the main one
        (2, 6, 2, True, "uint8", True),
    ],
)
def test_batches_equal_collated_items(
    two_cams, num_workers, batch_size, interleave, drop_last, image_dtype, delta
):
    kw = dict(
        batch_size=batch_size,
        seed=3,
        chunk_frames=10,
        drop_last=drop_last,
        image_dtype=image_dtype,
        tuning=StreamTuning(interleave=interleave, block_frames=4),
        delta_timestamps={
            "action": [0.0, 0.1, 0.2],
            "observation.images.cam0": [-0.1, 0.0],
        }
        if delta
        else None,
    )
    ds = ChunkedEpisodeDataset(two_cams, **kw)
    loader = ds.dataloader(num_workers=num_workers)
    assert isinstance(loader, BatchLoader)
    if num_workers and image_dtype == "float32":
        assert loader.float_keys == tuple(ds.meta.camera_keys)
    ours = list(loader)
    theirs = item_batches(ChunkedEpisodeDataset(two_cams, **kw), num_workers)
    assert_same_batches(ours, theirs)
    assert sum(len(b["index"]) for b in ours) > 0
    assert ours[0]["observation.images.cam0"].dtype == getattr(torch, image_dtype)


@pytest.mark.parametrize(
    ("num_workers", "batch_size", "image_dtype", "delta"),
    [
        (0, 7, "float32", None),
        (0, 5, "uint8", "sliding"),
        (2, 8, "float32", "sliding"),
        (2, 6, "uint8", None),
        (0, 6, "uint8", "gaps"),
        (0, 5, "uint8", "sliding, one by one"),
        (0, 6, "uint8", "gaps, one by one"),
    ],
)
def test_batches_equal_reader_items_collated(
    two_cams, num_workers, batch_size, image_dtype, delta, monkeypatch
):
    """Independent of the stream's machinery: every batch equals ``default_collate`` of
    :class:`LeRobotReader` items (random access, one frame at a time) at the batch's indices.
    Camera windows over consecutive frames in order ("sliding") take the read's precomputed
    places (windows.window_run); others ("gaps": a gap, a reversed order) search them. A
    window's repeated frames are copied in one call at these small sizes, one by one for large
    frames ("one by one": the threshold lowered)."""
    if delta and delta.endswith(", one by one"):
        import robo_resume.items.windows as windows

        monkeypatch.setattr(windows, "FANCY_COPY_BYTES", 0)
        delta = delta.removesuffix(", one by one")
    dt = {
        None: None,
        "sliding": {"action": [0.0, 0.1, 0.2], "observation.images.cam0": [-0.1, 0.0]},
        "gaps": {
            "observation.images.cam0": [-0.2, 0.0],
            "observation.images.cam1": [0.0, -0.1, -0.2],
        },
    }[delta]
    kw = dict(image_dtype=image_dtype, delta_timestamps=dt)
    ds = ChunkedEpisodeDataset(
        two_cams,
        batch_size=batch_size,
        seed=4,
        chunk_frames=10,
        tuning=StreamTuning(block_frames=4),
        **kw,
    )
    reader = LeRobotReader(two_cams, **kw)
    ours = list(ds.dataloader(num_workers=num_workers))
    assert len(ours) > 2
    for batch in ours:
        batch = dict(batch)
        cursor = batch.pop(CURSOR_KEY)
        assert cursor.shape == (len(batch["index"]), 5)
        want = torch.utils.data.default_collate([reader[int(i)] for i in batch["index"]])
        assert_same_batches([batch], [want])


def test_batches_equal_collated_items_infinite_across_epochs(two_cams):
    kw = dict(batch_size=9, seed=1, chunk_frames=8, infinite=True)
    ds = ChunkedEpisodeDataset(two_cams, **kw)
    per_epoch = ds.schedule(0).frames_per_stream
    n = per_epoch // 9 + 3  # batches that cross into the second epoch
    it = iter(ds.dataloader())
    ours = [next(it) for _ in range(n)]
    items = iter(ChunkedEpisodeDataset(two_cams, **kw))
    theirs = [torch.utils.data.default_collate([next(items) for _ in range(9)]) for _ in range(n)]
    assert_same_batches(ours, theirs)
    assert ours[-1][CURSOR_KEY][-1, 3] == 1  # the last batch is in epoch 1


def test_in_process_batches_equal_torchs_iterator(two_cams):
    # 0 workers: the loader takes each batch straight from the dataset's iterator instead of
    # through torch's per-batch fetch and default_convert; the batches, the number of them and
    # the seed torch draws from the global RNG per iteration stay what torch's own gives
    from robo_resume.stream.loader import DatasetBatches

    ds = ChunkedEpisodeDataset(two_cams, batch_size=6, seed=3, image_dtype="uint8")
    torch.manual_seed(0)
    it = iter(ds.dataloader(num_workers=0))
    assert it._next != it._it.__next__, "precondition: the in-process path is taken"
    ours, rng_ours = list(it), torch.get_rng_state()
    torch.manual_seed(0)
    plain = torch.utils.data.DataLoader(DatasetBatches(ChunkedEpisodeDataset(two_cams, batch_size=6,
        seed=3, image_dtype="uint8")), batch_size=None)  # fmt: skip
    theirs, rng_theirs = list(plain), torch.get_rng_state()
    assert len(ours) > 3
    assert_same_batches(ours, theirs)
    assert all(type(b["task"]) is list for b in ours)
    assert torch.equal(rng_ours, rng_theirs)


def test_collate_fn_gives_an_item_loader(two_cams):
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4)
    loader = ds.dataloader(collate_fn=torch.utils.data.default_collate)
    assert loader.batch_size == 4 and not isinstance(loader, BatchLoader)
    assert len(next(iter(loader))["index"]) == 4


def test_pin_memory_keeps_float_conversion_in_the_worker(two_cams):
    ds = ChunkedEpisodeDataset(two_cams, batch_size=4)
    assert ds.dataloader(num_workers=2, pin_memory=True).float_keys == ()


@pytest.mark.parametrize("codec", ["av1", "h264", "mpeg4"])
def test_planar_decode_equals_rgb24(factory, codec):
    """Channels-first frames (FFmpeg's planar gbrp) equal rgb24 frames transposed, exactly."""
    from robo_resume.format.video import VideoReader

    ds = factory(codec=codec, gop=5, num_cameras=1, episode_lengths=(30,))
    path = next(ds.root.glob("videos/**/*.mp4"))
    times = [i / ds.fps for i in range(0, 30, 3)]
    with VideoReader(path) as a, VideoReader(path) as b:
        hwc = a.frames_at(times)
        chw = b.frames_at(times, channels_first=True)
    assert chw.shape == (len(times), 3, *hwc.shape[1:3])
    assert np.array_equal(chw, hwc.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("path_taken", ["direct", "copy"])
def test_planar_decode_falls_back_when_ffmpeg_disagrees(factory, monkeypatch, path_taken):
    """If FFmpeg's planar conversion differs from rgb24 on the first frame, rgb24 is used:
    on the direct conversion into the batch and on the convert-then-copy path."""
    import robo_resume.format.rgb as rgb
    import robo_resume.format.video as video

    ds = factory(codec="h264", gop=5, num_cameras=1, episode_lengths=(30,))
    path = next(ds.root.glob("videos/**/*.mp4"))
    monkeypatch.setattr(rgb, "PLANAR_OK", {})
    real, direct = rgb.planar_rgb, rgb.convert_gbrp

    def skewed_direct(frame, out):  # a swscale whose gbrp output is off by one
        done = direct(frame, out)
        out += np.uint8(1)
        return done

    monkeypatch.setattr(
        rgb, "convert_gbrp", skewed_direct if path_taken == "direct" else lambda f, o: False
    )

    def skewed(frame, out, address=None):  # an FFmpeg whose gbrp output is off by one
        class Skewed:
            def __getattr__(self, name):
                return getattr(frame, name)

            def reformat(self, **kw):
                g = frame.reformat(**kw)
                return g if kw.get("format") != "gbrp" else _OffByOne(g)

        real(Skewed() if path_taken == "copy" else frame, out, address)

    monkeypatch.setattr(video, "planar_rgb", skewed)
    with video.VideoReader(path) as a, video.VideoReader(path) as b:
        hwc = a.frames_at([0.0, 0.1, 0.2])
        chw = b.frames_at([0.0, 0.1, 0.2], channels_first=True)
    assert list(rgb.PLANAR_OK.values()) == [False]
    assert np.array_equal(chw, hwc.transpose(0, 3, 1, 2))


class _OffByOne:
    """A gbrp frame whose planes are all shifted by one value."""

    def __init__(self, frame):
        self.planes = []
        for p in frame.planes:
            shifted = _Plane(((np.frombuffer(p, np.uint8).astype(np.int16) + 1) % 256).tobytes())
            shifted.line_size = p.line_size
            self.planes.append(shifted)


class _Plane(bytearray):
    line_size: int
