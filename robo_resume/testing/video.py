"""Encoding the factory's videos (AV1, h264 or mpeg4) with PyAV."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import cast

import numpy as np

from .truth import ENCODER, FactoryDataset, frame_image


def codec_options(codec: str, gop: int) -> dict[str, str]:
    if codec == "av1":
        # lerobot (0.4, 0.6) passes g, crf 30 and preset 12. At presets >= 10 SVT-AV1 barely codes
        # the non-reference frames of this pattern (they decode as copies of their neighbours'
        # cells), so the factory uses preset 8, which keeps every frame decodable.
        return {"g": str(gop), "crf": "30", "preset": "8"}
    if codec == "h264":  # keyframes exactly every gop frames: no scene-cut keyframes
        return {
            "g": str(gop),
            "keyint_min": str(gop),
            "sc_threshold": "0",
            "crf": "18",
            "preset": "veryfast",
            "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0",
        }
    return {"g": str(gop), "sc_threshold": "1000000000"}


@contextlib.contextmanager
def _own_scheduling():
    """Keep this thread's CPU scheduling policy as it was across encoding.

    SVT-AV1 (FFmpeg's libsvtav1), run as root, switches the thread that drives it to the
    real-time policy SCHED_FIFO at priority 99. Every process forked afterwards inherits it:
    DataLoader workers, forkservers, training subprocesses. A real-time process that spins
    starves the machine (the kernel leaves other processes 5% of the CPU). The policy is put
    back once the encoder is done. No-op where the OS has no ``sched_getscheduler``.
    """
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, policy, param)


def _encode_video(
    path: Path, frames: Iterator[np.ndarray], *, fps: int, codec: str, gop: int, h: int, w: int
) -> int:
    """Encode RGB frames into ``path``; frame ``i`` gets pts ``i`` in time base ``1/fps``."""
    import av

    # SVT-AV1 prints its configuration to the console unless told otherwise.
    os.environ.setdefault("SVT_LOG", "1")
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    level = av.logging.get_level()
    av.logging.set_level(av.logging.ERROR)  # x264 prints its settings and statistics otherwise
    try:
        with _own_scheduling(), av.open(str(path), "w") as out:
            stream = cast(  # a video encoder's name gives a video stream
                "av.VideoStream",
                out.add_stream(ENCODER[codec], rate=fps, options=codec_options(codec, gop)),
            )
            stream.pix_fmt = "yuv420p"
            stream.width, stream.height = w, h
            if codec == "mpeg4":
                stream.bit_rate = max(1_000_000, h * w * fps * 2)
            time_base = Fraction(1, fps)
            for img in frames:
                frame = av.VideoFrame.from_ndarray(img, format="rgb24")
                frame.pts, frame.time_base = count, time_base
                out.mux(stream.encode(frame))
                count += 1
            out.mux(stream.encode())
    finally:
        av.logging.set_level(level)
    return count


def _frames(ds: FactoryDataset, episodes: Sequence[int], camera: int) -> Iterator[np.ndarray]:
    for e in episodes:
        for f in range(ds.episode_lengths[e]):
            yield frame_image(e, f, camera, ds.height, ds.width)


def write_videos(ds: FactoryDataset, episodes: Sequence[int], path_of_camera) -> None:
    for c, cam in enumerate(ds.camera_keys):
        expected = sum(ds.episode_lengths[e] for e in episodes)
        path = path_of_camera(cam)
        written = _encode_video(
            path,
            _frames(ds, episodes, c),
            fps=ds.fps,
            codec=ds.codec,
            gop=ds.gop,
            h=ds.height,
            w=ds.width,
        )
        assert written == expected, (path, written, expected)
