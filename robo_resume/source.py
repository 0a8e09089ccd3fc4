"""Where a dataset's data comes from and which of it: :class:`DataSource`.

One options object for both datasets: :class:`~robo_resume.dataset.ChunkedEpisodeDataset` takes
one, and each :class:`~robo_resume.mix.MixSource` of a :class:`~robo_resume.mix.MixedDataset`
holds one. Everything else a constructor takes is about how the data is read (batch size,
resume, items, topology), not about which data.

Plain data, no I/O: nothing is opened until a dataset is constructed from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import describe
from .splits import EpisodeSelection

__all__ = ["SOURCE_FIELDS", "DataSource", "as_source"]

Features = Sequence[str] | Mapping[str, str | None] | None


@dataclass(frozen=True)
class DataSource:
    """A LeRobot dataset (folder or Hub repo), the episodes and the features to use.

    Attributes:
        root: dataset folder (holding ``meta/``). With ``repo_id``, a folder without ``meta/``
            is where the Hub download goes (instead of the huggingface_hub cache).
        repo_id: ``"owner/name"`` of a dataset on the Hugging Face Hub, used when ``root`` is
            None or holds no dataset: the metadata and only the selected episodes' (and
            features') files are downloaded, or found in the cache (offline with
            ``HF_HUB_OFFLINE=1``). See :func:`robo_resume.hub.resolve_root`.
        revision: Hub branch, tag (e.g. "v3.0", "v2.1") or commit; None: the default branch.
        episodes: episode indices to use (``index`` values stay absolute), a slice string by
            position such as ``"train[:90%]"``, or a seeded :class:`~robo_resume.splits.Split`;
            None: all.
        features: which features items hold, under which names: None (all, as named in the
            dataset), a list of keys to keep, or a mapping ``{key: new_name}`` where
            ``new_name`` None drops the feature and unmapped features keep their names. A
            dropped feature is never opened, decoded or downloaded (a copy without some
            camera's mp4s streams the rest). Renamed features (and their ``<key>_is_pad``)
            appear under the new name in items and batches, and ``delta_timestamps`` names
            them by the new name.
        chunk_frames: maximum frames per chunk (contiguous frames of one episode, one parquet
            range read and one video seek); None: the order's default (for the shuffle order 2,
            or 1 when no selected feature is a video; 64 for the interleave order:
            :meth:`StreamTuning.chunk_frames <robo_resume.StreamTuning.chunk_frames>`; in a mix,
            the mix's value).

    Raises:
        ValueError: neither ``root`` nor ``repo_id`` is given, ``chunk_frames`` is not a
            positive int, ``features`` is not a list or mapping of keys, or two features get
            one name.
    """

    root: str | Path | None = None
    repo_id: str | None = None
    revision: str | None = None
    episodes: EpisodeSelection = None
    features: Features = None
    chunk_frames: int | None = None

    def __post_init__(self) -> None:
        if self.root is None and self.repo_id is None:
            raise ValueError(
                describe(
                    "A DataSource needs a root or a repo_id",
                    found="neither",
                    fix="DataSource('path/to/dataset') or DataSource(repo_id='owner/name')",
                )
            )
        cf = self.chunk_frames
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, int) or cf < 1):
            raise ValueError(describe("chunk_frames must be a positive int", found=repr(cf)))
        f = self.features
        if f is None:
            return
        if isinstance(f, Mapping):
            bad = {k: v for k, v in f.items() if not isinstance(k, str)}
            bad.update({k: v for k, v in f.items() if v is not None and not isinstance(v, str)})
            if bad:
                raise ValueError(
                    describe(
                        "features= maps feature keys to new names",
                        expected="{key: 'new_name'} or {key: None} (drop)",
                        found=repr(bad)[:120],
                    )
                )
            names = [v for k, v in f.items() if v is not None and v != k]
            kept = [k for k in f if f[k] is not None and f[k] == k]
            dup = sorted({n for n in names if names.count(n) > 1 or n in kept})
            if dup:
                raise ValueError(
                    describe(
                        "features= gives two features the same name",
                        found=f"{dup} named twice in {dict(f)}",
                        fix="give every kept feature its own name",
                    )
                )
        elif isinstance(f, str) or not isinstance(f, Iterable):
            raise ValueError(
                describe(
                    "features= must name keys",
                    expected="a list of keys to keep, or {key: 'new_name' or None}",
                    found=repr(f)[:120],
                )
            )

    def selection(self) -> Sequence[str] | Mapping[str, None] | None:
        """The features to read, renames left out.

        Returns:
            What :meth:`~robo_resume.format.metadata.DatasetMeta.select` takes: None (all),
            the list of keys to keep, or ``{key: None}`` of the keys to drop.
        """
        f = self.features
        if isinstance(f, Mapping):
            drops = {k: None for k, v in f.items() if v is None}
            return drops or None
        return None if f is None else list(f)

    def renames(self) -> dict[str, str]:
        """The renamed features.

        Returns:
            ``{key in the dataset: name in items}`` (empty: none renamed).
        """
        f = self.features
        if not isinstance(f, Mapping):
            return {}
        return {k: v for k, v in f.items() if v is not None and v != k}


SOURCE_FIELDS = ("root", "repo_id", "revision", "episodes", "features", "chunk_frames")
"""The :class:`DataSource` fields a constructor also takes as keywords (shorthand)."""


def as_source(source: Any, fields: Mapping[str, Any], *, owner: str) -> DataSource:
    """``source`` and shorthand ``fields`` as one DataSource.

    ``source`` is a :class:`DataSource`, a folder path or None; ``fields`` are keywords among
    :data:`SOURCE_FIELDS`. ``owner`` names the constructor in messages. Raises TypeError for a
    keyword that is not a field (as Python does for an unknown keyword) and ValueError when a
    DataSource and shorthand fields are both given (one place says where the data comes from).
    """
    unknown = [k for k in fields if k not in SOURCE_FIELDS]
    if unknown:
        raise TypeError(
            f"{owner}() got an unexpected keyword argument {unknown[0]!r} "
            f"(where data comes from: {', '.join(SOURCE_FIELDS)}; see DataSource)"
        )
    given = {k: v for k, v in fields.items() if v is not None}
    if isinstance(source, DataSource):
        if given:
            raise ValueError(
                describe(
                    f"{owner}() got a DataSource and DataSource fields as keywords",
                    found=f"DataSource and {sorted(given)}",
                    fix=f"put {', '.join(sorted(given))} into the DataSource",
                )
            )
        return source
    if source is not None:
        if "root" in given:
            raise ValueError(
                describe(
                    f"{owner}() got the dataset root twice",
                    found=f"{source!r} and root={given['root']!r}",
                    fix="pass the folder once",
                )
            )
        if isinstance(source, str | Path):
            given["root"] = source
        else:
            raise TypeError(
                describe(
                    f"{owner}() takes where the data comes from as its first argument",
                    expected="a dataset folder (str or Path) or a DataSource",
                    found=f"{type(source).__name__}: {source!r}"[:120],
                )
            )
    return DataSource(**given)
