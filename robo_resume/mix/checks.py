"""That the sources of a mix fit together: key mappings, features, shapes, dtypes, fps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DatasetFormatError, describe
from .source import VISUAL, MixSource

if TYPE_CHECKING:
    from ..dataset import ChunkedEpisodeDataset


def source_delta(
    source: MixSource, delta: Mapping[str, Sequence[float]] | None
) -> dict[str, Sequence[float]] | None:
    """``delta_timestamps`` (in the mix's names) in ``source``'s own feature names."""
    if not delta:
        return None
    back = {v: k for k, v in source.keys.items() if v is not None}
    return {back.get(k, k): v for k, v in delta.items()}


class SourceChecks:
    """That the sources of a mix fit together: key mappings, features, shapes, dtypes, fps.

    Built from the mix's sources and their datasets: ``renames[i]`` maps source ``i``'s
    features to the mix's names (None: dropped), ``features`` is the mix's feature layout
    (source 0's, renamed). Raises :class:`~robo_resume.errors.DatasetFormatError` for a key
    mapping that names unknown features or gives two features one name, and :meth:`problems`
    lists every way the other sources differ from source 0, each told with its fix.
    """

    def __init__(
        self, sources: Sequence[MixSource], datasets: Sequence[ChunkedEpisodeDataset]
    ) -> None:
        self.sources, self.datasets = sources, datasets
        self.renames = [self.check_source(i) for i in range(len(sources))]
        self.features = self.features_of(0)

    def name(self, i: int) -> str:
        """How messages name source ``i``: its index and repo id or folder."""
        s = self.sources[i]
        return f"source {i} ({s.repo_id or s.root})"

    def problems(self) -> list[str]:
        """Every way sources 1.. differ from source 0 (see :meth:`check_fits`)."""
        return [p for i in range(1, len(self.sources)) for p in self.check_fits(i)]

    def check_source(self, i: int) -> dict[str, str | None]:
        """Source ``i``'s renames to the mix's names, checked."""
        feats = self.datasets[i].meta.features  # without the features mapped to None
        keys = dict(self.sources[i].keys)
        unknown = [k for k in keys if k not in feats and k not in self.datasets[i].meta.dropped]
        if unknown:
            raise DatasetFormatError(
                describe(
                    f"The key mapping of {self.name(i)} names features it does not have",
                    expected=f"names among {list(feats)}",
                    found=unknown,
                    file=Path(self.datasets[i].meta.root) / "meta" / "info.json",
                    fix="map this source's own feature names, e.g. keys={'<its name>': "
                    "'<mix name>'}",
                )
            )
        targets = [t for t in (keys.get(k, k) for k in feats) if t is not None]
        dup = sorted({t for t in targets if targets.count(t) > 1})
        if dup:
            raise DatasetFormatError(
                describe(
                    f"The key mapping of {self.name(i)} gives two features one name",
                    expected="distinct mix names",
                    found=dup,
                    fix="map or drop (None) the feature that already has that name",
                )
            )
        return {k: keys.get(k, k) for k in feats}

    def features_of(self, i: int) -> dict[str, dict[str, Any]]:
        """Source ``i``'s features in the mix's names: ``{name: {dtype, shape}}``."""
        out = {}
        for k, ft in self.datasets[i].meta.features.items():
            name = self.renames[i][k]
            if name is not None:
                out[name] = {"dtype": ft.get("dtype"), "shape": list(ft.get("shape") or [])}
        return out

    def check_fits(self, i: int) -> list[str]:
        """Every way source ``i`` differs from source 0 (fps, features, shapes, dtypes)."""
        problems: list[str] = []
        ref, mine = self.features, self.features_of(i)
        meta0, meta = self.datasets[0].meta, self.datasets[i].meta
        info = Path(meta.root) / "meta" / "info.json"
        if meta.fps != meta0.fps:
            problems.append(
                describe(
                    f"{self.name(i)} has another fps than source 0",
                    expected=f"fps={meta0.fps} (source 0)",
                    found=f"fps={meta.fps}",
                    file=info,
                    fix="mix datasets recorded at one frame rate (delta_timestamps and video "
                    "times assume it); resample the dataset or leave it out",
                )
            )
        missing = [k for k in ref if k not in mine]
        extra = [k for k in mine if k not in ref]
        if missing or extra:
            problems.append(
                describe(
                    f"{self.name(i)} does not have the mix's features",
                    expected=f"features {list(ref)} (source 0, after its key mapping)",
                    found=(f"missing {missing}" if missing else "")
                    + ("; " if missing and extra else "")
                    + (f"extra {extra}" if extra else ""),
                    file=info,
                    fix="map this source's names with MixSource(keys={'<its name>': "
                    "'<mix name>'}), or drop a feature with keys={'<its name>': None}",
                )
            )
        for k, want in ref.items():
            got = mine.get(k)
            if got is None:
                continue
            if got["shape"] != want["shape"]:
                problems.append(
                    describe(
                        f"Feature '{k}' of {self.name(i)} has another shape than in source 0",
                        expected=f"shape {want['shape']} (source 0)",
                        found=f"shape {got['shape']}",
                        file=info,
                        fix="mix features of one shape: map another feature to this name, or "
                        "drop it from every source (keys={'<name>': None})",
                    )
                )
            kinds = {want["dtype"] in VISUAL, got["dtype"] in VISUAL}
            if len(kinds) > 1 or (not kinds.pop() and got["dtype"] != want["dtype"]):
                problems.append(
                    describe(
                        f"Feature '{k}' of {self.name(i)} has another dtype than in source 0",
                        expected=f"dtype {want['dtype']} (source 0)",
                        found=f"dtype {got['dtype']}",
                        file=info,
                        fix="map a feature of the same dtype to this name",
                    )
                )
        return problems
