"""Which features robo_resume reads, and the lerobot 0.6 features it refuses when loading.

robo_resume reads numeric columns (float, int, bool, lists of them and 2-D to 5-D arrays), declared
``string`` columns, RGB ``video`` features, depth maps stored as video, 8-bit ``image``
features (PNG or JPEG in the data parquet, see :mod:`robo_resume.format.images`), lerobot 0.6's
language columns ``language_persistent`` and ``language_events`` (lists of message dicts per
frame, see :mod:`robo_resume.format.language`) and the task, and returns them exactly as
lerobot's ``LeRobotDataset`` does. A depth map is a feature whose ``info`` says ``is_depth_map``
(lerobot <= 0.4 wrote ``video.is_depth_map``, in ``info`` or ``video_info``; lerobot 0.6 reads
all three, and so does :func:`is_depth_map`); as a ``video`` feature (12-bit HEVC ``gray12le``,
what lerobot 0.6 records) it is read as lerobot returns it, ``(1, H, W)`` float32 millimetres
(:mod:`robo_resume.format.depth`). lerobot 0.6 stores and returns some features differently,
and robo_resume refuses them in :func:`check_features` (called by
:func:`~robo_resume.format.metadata.load_metadata`) instead of returning something else:

- Depth maps stored as ``image`` features (16-bit frames in the data parquet): robo_resume's
  image decoding reads 8-bit images only.
- dtype ``language`` on a column other than the two language columns: lerobot 0.6 knows
  language columns by their name and fails on any other (``datasets.Value("language")``).

Everything else in info.json is accepted, in particular the encoder settings lerobot 0.6 records
in a video feature's ``info`` (``video.g``, ``video.crf``, ``video.preset``, ...,
``is_depth_map: false``) and keys this version does not know: decoding follows the container,
not info.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UnsupportedFeatureError, describe
from .language import LANGUAGE_COLUMNS

__all__ = ["LANGUAGE_COLUMNS", "check_features", "is_depth_map", "unsupported_features"]


def is_depth_map(feature: Mapping[str, Any]) -> bool:
    """True when a feature is a depth map, by the flags lerobot 0.6's ``depth_keys`` reads."""
    info = feature.get("info") or {}
    video_info = feature.get("video_info") or {}
    if not isinstance(info, Mapping) or not isinstance(video_info, Mapping):
        return False
    return bool(
        info.get("is_depth_map")
        or info.get("video.is_depth_map")
        or video_info.get("video.is_depth_map")
    )


def unsupported_features(features: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{key: "depth map" | "language column"}`` for the features robo_resume refuses."""
    out = {}
    for key, ft in features.items():
        if not isinstance(ft, Mapping):
            continue  # malformed entries are reported where they are used
        if ft.get("dtype") == "language" and key not in LANGUAGE_COLUMNS:
            out[key] = "language column"  # the two LANGUAGE_COLUMNS are read
        elif is_depth_map(ft) and ft.get("dtype") != "video":  # depth video is read
            out[key] = "depth map"
    return out


def _describe_found(key: str, kind: str, feature: Mapping[str, Any]) -> str:
    if kind == "language column":
        return (
            f"'{key}' (dtype {feature.get('dtype')!r} under a name other than "
            f"{' and '.join(LANGUAGE_COLUMNS)})"
        )
    info = feature.get("info") or {}
    codec, pix_fmt = info.get("video.codec"), info.get("video.pix_fmt")
    stored = f", {codec} {pix_fmt}" if codec and pix_fmt else ""
    return f"'{key}' (dtype {feature.get('dtype')!r}{stored}, is_depth_map in its info)"


def check_features(features: Mapping[str, Mapping[str, Any]], info_path: Path) -> None:
    """Raise :class:`UnsupportedFeatureError` if ``features`` holds a depth map, or dtype
    ``language`` under another name than the two language columns (see the module docstring);
    the message names every such feature and the fix."""
    refused = unsupported_features(features)
    if not refused:
        return
    kinds = sorted(set(refused.values()))
    keys = list(refused)
    root = info_path.parent.parent
    names = "[" + ", ".join(f"'{k}'" for k in keys) + "]"
    how = []
    if "depth map" in kinds:
        how.append(
            "read these features with lerobot's LeRobotDataset (depth maps come back as "
            "(1, H, W) float32 in depth_output_unit)"
        )
    if "language column" in kinds:
        how.append(
            "rename a language column to language_persistent or language_events (the only "
            "names lerobot 0.6 reads as language; it fails on others too)"
        )
    raise UnsupportedFeatureError(
        describe(
            f"The dataset has {' and '.join(k + 's' for k in kinds)}, which robo_resume does "
            f"not read: {', '.join(repr(k) for k in keys)}",
            expected="numeric columns, RGB video features and the task (robo_resume returns "
            "those exactly as lerobot's LeRobotDataset does)",
            found="; ".join(_describe_found(k, refused[k], features[k]) for k in keys),
            file=info_path,
            fix="; ".join(how) + ", or stream a copy without them with robo_resume: "
            "lerobot-edit-dataset "
            f"--repo_id local/copy --root {root} --new_root NEW_ROOT "
            f'--operation.type remove_feature --operation.feature_names "{names}"',
        )
    )
