"""``robo-resume inspect``: what a dataset holds, which files are missing or unreadable."""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from typing import Any

from .common import FAILED, OK, emit


def cmd_inspect(args: argparse.Namespace) -> int:
    """Version, episodes, frames, fps, features, cameras with codec and keyframe interval."""
    import av

    from ..files import check_files
    from ..format.metadata import load_metadata

    meta = load_metadata(args.root)
    check = check_files(meta)
    missing = sorted(p.path for p in check.problems if p.problem == "missing")
    unreadable = {p.path: p.error for p in check.problems if p.problem == "unreadable"}
    bad = {p.path for p in check.problems}
    cams: dict[str, Any] = {}
    for cam in meta.camera_keys:
        declared = meta.features[cam].get("info", {}).get("video.codec")
        paths = sorted({e.videos[cam].path for e in meta.episodes} - bad)
        found = None
        for rel in paths[:1]:  # the first readable file describes the camera
            try:
                with av.open(str(meta.root / rel)) as c:
                    s = c.streams.video[0]
                    s.thread_count = 1
                    tb = s.time_base
                    if tb is None:
                        raise ValueError("the video stream has no time base")
                    keys = [
                        float(p.pts * tb) for p in c.demux(s) if p.is_keyframe and p.pts is not None
                    ]
                    gaps = [round((b - a) * meta.fps) for a, b in itertools.pairwise(sorted(keys))]
                    found = {
                        # the codec (e.g. av1), not the decoder that reads it (e.g. libdav1d)
                        "codec": s.codec_context.codec.canonical_name,
                        "decoder": s.codec_context.codec.name,
                        "size": [s.codec_context.height, s.codec_context.width],
                        "fps": round(float(s.average_rate or 0), 3),
                        "keyframe_interval": Counter(gaps).most_common(1)[0][0] if gaps else None,
                    }
            except Exception as exc:  # a file that opens but cannot be demuxed
                unreadable[rel] = f"{type(exc).__name__}: {exc}"
        cams[cam] = {
            "declared_codec": declared,
            "container": found,
            "agrees": found is not None and found["codec"] == _codec_name(declared),
        }
    report = {
        "root": str(meta.root),
        "version": meta.version,
        "episodes": meta.num_episodes,
        "frames": meta.total_frames,
        "fps": meta.fps,
        "tasks": len(meta.tasks),
        "features": {k: v.get("dtype") for k, v in meta.features.items()},
        "cameras": cams,
        "missing_files": missing,
        "unreadable_files": unreadable,
        "readable_episodes": len(check.readable),
        # equal on two copies with the same episodes and metadata (compare the nodes' copies)
        "fingerprint": meta.fingerprint()["episodes_sha256"][:16],
    }
    lines = [
        f"{report['root']}: LeRobot {meta.version}, {meta.num_episodes} episodes, "
        f"{meta.total_frames} frames at {meta.fps} fps, {len(meta.tasks)} task(s)",
        f"  fingerprint {report['fingerprint']} (the same on every copy of this dataset)",
    ]
    lines += [f"  feature {k}: {v}" for k, v in report["features"].items()]
    for cam, c in cams.items():
        if c["container"]:
            k = c["container"]
            note = "" if c["agrees"] else f"  (info.json says {c['declared_codec']})"
            lines.append(
                f"  camera {cam}: {k['codec']} {k['size'][1]}x{k['size'][0]}, keyframe "
                f"every {k['keyframe_interval']} frames{note}; decoder {k['decoder']}"
            )
        else:
            lines.append(f"  camera {cam}: no readable video")
    if missing:
        kinds = Counter(p.kind for p in check.problems if p.problem == "missing")
        lines.append(
            f"  missing files: {len(missing)} ("
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            + "): "
            + ", ".join(missing)
        )
    for rel, err in unreadable.items():
        lines.append(f"  unreadable: {rel}: {err}")
    if missing or unreadable:
        lines.append(
            f"  readable episodes: {len(check.readable)} of {meta.num_episodes} "
            "(select them with --episodes readable; robo-resume train: "
            "--dataset.episodes=readable; Python: episodes=readable_episodes(root))"
        )
    emit(args, report, "\n".join(lines))
    return FAILED if (missing or unreadable) else OK


def _codec_name(declared: Any) -> str | None:
    """info.json's ``video.codec`` as FFmpeg's codec name (``h265`` is ``hevc``)."""
    if not isinstance(declared, str):
        return None
    name = declared.strip().lower()
    return {"h265": "hevc", "x264": "h264", "avc": "h264", "x265": "hevc"}.get(name, name)
