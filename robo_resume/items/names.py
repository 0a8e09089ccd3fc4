"""Feature names in items: a dataset's renames (``DataSource(features={key: "new_name"})``).

A rename changes only the key under which a feature (and its ``<key>_is_pad`` mask) appears in
items and batches; what is read, and from which files, stays the dataset's own. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import describe
from ..format.metadata import DatasetMeta

PAD = "_is_pad"


def check_renames(meta: DatasetMeta, renames: Mapping[str, str]) -> dict[str, str]:
    """``renames`` (dataset key -> item key) checked against ``meta``'s selected features.

    Raises ValueError naming a renamed key the dataset does not have (or that was dropped), and
    a new name that another kept feature already has.
    """
    renames = dict(renames)
    unknown = [k for k in renames if k not in meta.features]
    if unknown:
        raise ValueError(
            describe(
                "features= renames keys the dataset does not have",
                expected=f"keys among {list(meta.features)}",
                found=unknown,
                file=meta.root / "meta" / "info.json",
            )
        )
    taken = [v for v in renames.values() if v in meta.features and v not in renames]
    if taken:
        raise ValueError(
            describe(
                "features= renames a feature to the name of another feature",
                found=f"{taken} already in the dataset (renames {renames})",
                fix="rename or drop that feature too ({key: None} drops it)",
            )
        )
    return renames


def item_key(key: str, renames: Mapping[str, str]) -> str:
    """The name of dataset key ``key`` (or its ``<key>_is_pad``) in items."""
    if key in renames:
        return renames[key]
    if key.endswith(PAD) and key[: -len(PAD)] in renames:
        return renames[key[: -len(PAD)]] + PAD
    return key


def dataset_keys(keys: Mapping[str, Any] | None, renames: Mapping[str, str]) -> dict[str, Any]:
    """``keys`` named as in items (e.g. ``delta_timestamps``) named as in the dataset.

    A key that is only the dataset's name of a renamed feature raises ValueError: items never
    show it, so a user naming it meant the new name.
    """
    if not keys:
        return dict(keys or {})
    back = {v: k for k, v in renames.items()}
    stale = [k for k in keys if k in renames and k not in back]
    if stale:
        raise ValueError(
            describe(
                "delta_timestamps names a feature by its old name",
                found=f"{stale}, renamed to {[renames[k] for k in stale]} by features=",
                fix="name features as items show them (the new names)",
            )
        )
    return {back.get(k, k): v for k, v in keys.items()}


def rename(batch: dict[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``batch`` (an item or a batch) with its keys named as in items; as is without renames."""
    if not renames:
        return batch
    return {item_key(k, renames): v for k, v in batch.items()}


def renamed(keys: Iterable[str], renames: Mapping[str, str]) -> tuple[str, ...]:
    """``keys`` named as in items."""
    return tuple(item_key(k, renames) for k in keys)
