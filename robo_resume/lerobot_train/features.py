"""The dataset's feature names as the policy sees them: ``--data.features`` / ``--mix.features``
applied to lerobot's metadata, and the check, before the policy is built, that the names are
the ones lerobot's policies read (``action``, ``observation.state``,
``observation.images.<camera>``, ``observation.environment_state``)."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import describe
from .data_flags import renamed_features
from .options import TrainSetupError

ACTION = "action"
STATE = "observation.state"
ENV_STATE = "observation.environment_state"
IMAGES = "observation.images."
_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
_VISUAL = ("video", "image")
_STATE_NAMES = ("state", "states", "qpos", "proprio", "proprioception", "robot_state", "joints")

log = logging.getLogger("robo_resume.train")


def check_mapping(features: Mapping[str, Any], mapping: Mapping[str, Any], flag: str, root: Any):
    """Refuse a mapping that names keys the dataset does not have (:class:`TrainSetupError`)."""
    unknown = [k for k in mapping if k not in features]
    if unknown:
        raise TrainSetupError(
            describe(
                f"{flag} names features the dataset does not have",
                expected=f"keys among {[k for k in features if k not in _COLUMNS]}",
                found=unknown,
                file=Path(root) / "meta" / "info.json" if root else None,
                fix=f"map the dataset's own keys in {flag}",
            )
        )


def apply_mapping(meta: Any, mapping: Mapping[str, str | None] | None) -> None:
    """Rename (and drop) features of lerobot's ``LeRobotDatasetMetadata`` ``meta`` in place:
    its features and its stats, so that the policy and the normaliser see the batches' names."""
    if not mapping:
        return
    meta.info.features = renamed_features(meta.info.features, mapping)
    meta.stats = renamed_features(meta.stats, mapping)


def suggest(features: Mapping[str, Any], mapping: Mapping[str, str | None]) -> dict[str, Any]:
    """``mapping`` plus renames to lerobot's names of the keys that look like an action, a
    state, an environment state or a camera (the fix an error suggests)."""
    out: dict[str, Any] = dict(mapping)
    taken = {v for v in out.values() if v} | {k for k in features if k not in out}
    for key, ft in features.items():
        if key in _COLUMNS or key in out:
            continue
        low = key.lower()
        name = None
        if ft.get("dtype") in _VISUAL:
            if not key.startswith(IMAGES):
                name = IMAGES + key.removeprefix("observation.").replace("/", ".")
        elif key == ACTION or key.startswith("observation."):
            continue
        elif low.startswith("action"):
            name = ACTION
        elif "env" in low and "state" in low:
            name = ENV_STATE
        elif low in _STATE_NAMES or low.endswith("state"):
            name = STATE
        if name is not None and name not in taken:
            out[key] = name
            taken.add(name)
    return out


def check_policy_features(
    cfg: Any,
    meta: Any,
    mapping: Mapping[str, Any],
    original: Mapping[str, Any],
    flag: str,
    others: list[dict] | None = None,
) -> None:
    """Before the policy is built: the features (after ``mapping``, applied to ``meta``) hold
    what lerobot's policy config reads, else a :class:`TrainSetupError` naming what the policy
    needs, what the dataset has, and the ``flag`` (``--data.features``, or ``--mix.features``
    with ``others``, the other sources' mappings, after the first source's) that renames them.

    ``original``: the dataset's features under their own names. Keys that lerobot's policies
    never read (neither ``action`` nor ``observation.*``) are logged as a WARNING.
    """
    from lerobot.configs.types import FeatureType
    from lerobot.utils.feature_utils import dataset_to_policy_features

    features = meta.features
    policy = dataset_to_policy_features(features)
    inputs = {k: ft for k, ft in policy.items() if ft.type is not FeatureType.ACTION}
    problem = None
    if ACTION not in features:
        problem = "The dataset has no feature named 'action', the policy's output"
    elif not inputs:
        problem = "The dataset has no observation feature the policy can take as input"
    else:
        trial = copy.deepcopy(cfg.policy)
        trial.output_features = {k: ft for k, ft in policy.items() if k not in inputs}
        trial.input_features = inputs
        try:
            trial.validate_features()
        except ValueError as exc:
            problem = f"--policy.type={cfg.policy.type} refuses the dataset's features: {exc}"
    ignored = [k for k in features if k not in _COLUMNS and k not in policy]
    fix = fix_flag(flag, suggest(original, mapping), others)
    if problem is None:
        if ignored and suggest(original, mapping) != dict(mapping):
            log.warning(
                "features %s are not named as lerobot's policies read them (action, "
                "observation.*): the policy does not use them; rename them with %s",
                ignored,
                fix,
            )
        return
    raise TrainSetupError(
        describe(
            problem,
            expected=f"--policy.type={cfg.policy.type} reads 'action' (its output) and inputs "
            f"named '{STATE}', '{IMAGES}<camera>' (or any image or video feature) and "
            f"'{ENV_STATE}' (lerobot's policy config; act and diffusion need an image or the "
            "environment state)",
            found=f"features {[k for k in features if k not in _COLUMNS]}"
            + (f" (after {flag})" if mapping else "")
            + (f", of which lerobot's policies ignore {ignored}" if ignored else ""),
            file=Path(meta.root) / "meta" / "info.json",
            fix=f"rename the dataset's keys with {fix}",
        )
    )


def fix_flag(flag: str, mapping: Mapping[str, Any], others: list[dict] | None = None) -> str:
    """The flag that sets ``mapping`` (``--data.features='{...}'``), or for ``--mix.features``
    the JSON list with ``mapping`` first and ``others`` (the other sources' mappings) after."""
    if flag == "--mix.features":
        return f"{flag}='{json.dumps([dict(mapping), *(others or [])])}'"
    return f"{flag}='{json.dumps(dict(mapping))}'"
