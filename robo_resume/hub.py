"""Datasets on the Hugging Face Hub: download only the metadata and the selected episodes' files.

:func:`resolve_root` turns ``repo_id`` (+ ``revision``) into a local dataset folder that the
readers open like any other root:

1. ``snapshot_download(repo_id, repo_type="dataset", allow_patterns=["meta/**"])``: the
   metadata only (info.json, episode tables, tasks, stats).
2. :func:`~robo_resume.format.metadata.load_metadata` on it, then the episode selection
   (indices, ``"train[:90%]"`` or a :class:`~robo_resume.splits.Split`, as ``episodes=``).
3. A second ``snapshot_download`` at the **same commit** as step 1 whose ``allow_patterns``
   are the data and video files of the selected episodes (:func:`download_patterns`), from the
   v3.0 or v2.1 episode metadata. Nothing else is fetched; files already in the cache are not
   fetched again, and the call is skipped when every file is there. Past
   :data:`MAX_PATTERNS` patterns (random splits of large v2.1 datasets), the missing files are
   fetched one by one with ``hf_hub_download`` at that commit instead, because
   ``snapshot_download`` matches every repo file against every pattern.

Offline (``HF_HUB_OFFLINE=1``, read at call time, or ``local_files_only=True``): both steps
resolve from the local cache only. huggingface_hub then returns the cached snapshot folder
without checking its files, so :func:`resolve_root` checks that every file the selection needs
is there and raises :class:`~robo_resume.errors.MissingFileError` naming the missing files,
saying that offline mode is on, and how to fix it.

huggingface_hub is optional: it is imported only when something must be downloaded
(``pip install huggingface_hub``, or the ``lerobot`` extra, which depends on it).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import MissingFileError, describe
from .format.metadata import DatasetMeta, load_metadata
from .hub_patterns import download_patterns, episode_files
from .splits import EpisodeSelection, select_episodes

__all__ = ["download_patterns", "episode_files", "resolve_dataset", "resolve_root"]

logger = logging.getLogger("robo_resume")

META_PATTERNS = ("meta/**",)
"""allow_patterns of the first download: the whole ``meta/`` folder, nothing else."""

MAX_PATTERNS = 64
"""Above this many patterns the files are fetched one by one (``hf_hub_download``) instead:
``snapshot_download`` matches every repo file against every pattern, which a random split of a
large v2.1 dataset (one file per episode and camera) would make quadratic."""

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "ON", "YES", "TRUE"}

Download = Callable[..., "str | Path"]
"""``download(repo_id, *, revision, allow_patterns, cache_dir, local_dir, local_files_only)``
returning the snapshot folder: :func:`huggingface_hub.snapshot_download` with
``repo_type="dataset"`` (the default), or a test double."""


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in _TRUE


def _hub_offline() -> bool:
    """Offline mode, from the environment now or huggingface_hub's import-time constant."""
    if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
        return True
    constants = sys.modules.get("huggingface_hub.constants")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _import_hub() -> Any:
    """The huggingface_hub module, or an ImportError saying how to install it."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise ImportError(
            describe(
                "Reading a dataset from the Hugging Face Hub needs huggingface_hub",
                expected="the huggingface_hub package",
                found=f"{type(exc).__name__}: {str(exc).rstrip('.')}",
                fix="pip install huggingface_hub (or robo_resume[lerobot]), or pass root= a "
                "local copy of the dataset",
            )
        ) from exc
    return huggingface_hub


def _snapshot_download(
    repo_id: str,
    *,
    revision: str | None,
    allow_patterns: Sequence[str],
    cache_dir: str | Path | None,
    local_dir: str | Path | None,
    local_files_only: bool,
) -> str:
    return _import_hub().snapshot_download(
        repo_id,
        repo_type="dataset",
        revision=revision,
        allow_patterns=list(allow_patterns),
        cache_dir=cache_dir,
        local_dir=local_dir,
        local_files_only=local_files_only,
    )


def _hf_hub_download_files(
    repo_id: str,
    *,
    revision: str | None,
    files: Sequence[str],
    cache_dir: str | Path | None,
    local_dir: str | Path | None,
) -> Path:
    """Fetch ``files`` one by one (8 threads); return the snapshot folder holding them."""
    hub = _import_hub()

    def one(f: str) -> Path:
        got = Path(
            hub.hf_hub_download(
                repo_id,
                filename=f,
                repo_type="dataset",
                revision=revision,
                cache_dir=cache_dir,
                local_dir=local_dir,
            )
        )
        return got.parents[len(PurePosixPath(f).parts) - 1]

    with ThreadPoolExecutor(max_workers=8) as pool:
        folders = set(pool.map(one, files))
    if len(folders) != 1:
        raise RuntimeError(f"files of {repo_id} landed in several folders: {sorted(folders)}")
    return folders.pop()


def _offline_fix(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (
        "offline mode is on (HF_HUB_OFFLINE=1 or local_files_only=True), so only the local "
        "cache is used: download the files once with network (unset HF_HUB_OFFLINE and run "
        f"again, or `hf download {repo_id} --repo-type dataset{rev}`, which is "
        "`huggingface-cli download` on huggingface_hub < 0.34), or select episodes that are "
        "cached, or pass root= a local copy"
    )


def _hub_error(
    exc: BaseException, repo_id: str, revision: str | None, offline: bool, cache: str
) -> Exception | None:
    """A robo_resume error for a huggingface_hub error (matched by class name, no import)."""
    names = {c.__name__ for c in type(exc).__mro__}
    rev = revision or "main"
    if "LocalEntryNotFoundError" in names:
        return MissingFileError(
            describe(
                f"The dataset {repo_id!r} (revision {rev!r}) is not in the local Hugging Face "
                "cache" + (" and offline mode is on" if offline else " and the Hub is unreachable"),
                expected=f"a snapshot under {cache}",
                found=f"{type(exc).__name__}: {str(exc).rstrip('.')}",
                fix=_offline_fix(repo_id, revision)
                if offline
                else "check the network connection (and HF_ENDPOINT), then run again",
            )
        )
    if "RevisionNotFoundError" in names:
        return MissingFileError(
            describe(
                f"The dataset {repo_id!r} has no revision {rev!r} on the Hub",
                expected="a branch, tag or commit of the dataset repo",
                found=f"{type(exc).__name__}: {str(exc).rstrip('.')}",
                fix="pass an existing revision (e.g. 'main', or a version tag such as 'v3.0' "
                "or 'v2.1' for LeRobot datasets)",
            )
        )
    if "RepositoryNotFoundError" in names:
        return MissingFileError(
            describe(
                f"The Hub has no dataset repo {repo_id!r} that this account can read",
                expected="an existing dataset repo id 'owner/name'",
                found=f"{type(exc).__name__}: {str(exc).rstrip('.')}",
                fix="check the repo id and that it is a dataset (not a model) repo; for private "
                "or gated datasets log in with `hf auth login` (`huggingface-cli login` on "
                "huggingface_hub < 0.34) and accept the terms",
            )
        )
    return None


def _cache_folder(repo_id: str, cache_dir: str | Path | None) -> str:
    """Where huggingface_hub keeps this dataset (for messages)."""
    constants = sys.modules.get("huggingface_hub.constants")
    home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"
    base = (
        cache_dir
        or getattr(constants, "HF_HUB_CACHE", None)
        or os.environ.get("HF_HUB_CACHE")
        or home
    )
    return str(Path(base) / ("datasets--" + repo_id.replace("/", "--")))


@contextmanager
def _hub_errors(repo_id: str, revision: str | None, offline: bool, cache: str) -> Iterator[None]:
    """Turn the huggingface_hub errors users meet into robo_resume errors (others propagate)."""
    try:
        yield
    except Exception as exc:
        mapped = _hub_error(exc, repo_id, revision, offline, cache)
        if mapped is None:
            raise
        raise mapped from exc


def _check_files(
    folder: Path,
    files: Sequence[str],
    selected: Sequence[int],
    repo_id: str,
    *,
    offline: bool,
    revision: str | None,
) -> None:
    missing = [f for f in files if not (folder / f).is_file()]
    if not missing:
        return
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    raise MissingFileError(
        describe(
            f"{len(missing)} of the {len(files)} data/video files of the {len(selected)} "
            f"selected episodes of {repo_id!r} are missing"
            + (" from the local cache (offline mode is on)" if offline else " after download"),
            expected=f"the selected episodes' files under {folder}",
            found=f"missing {shown}",
            fix=_offline_fix(repo_id, revision)
            if offline
            else "the Hub snapshot lacks files its metadata points to: check the dataset "
            "repo, or select other episodes",
        )
    )


def resolve_dataset(
    repo_id: str | None = None,
    *,
    root: str | Path | None = None,
    revision: str | None = None,
    episodes: EpisodeSelection = None,
    features: Any = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    _download: Download | None = None,
) -> tuple[Path, DatasetMeta]:
    """:func:`resolve_root`, also returning the dataset's metadata (loaded once).

    ``features`` (see :meth:`~robo_resume.format.metadata.DatasetMeta.select`): the files of
    features left out are not downloaded, and the returned metadata is the selected one.
    """
    local_dir = None
    if root is not None:
        root = Path(root).expanduser()
        if (root / "meta" / "info.json").is_file():
            return root, load_metadata(root).select(features)
        if repo_id is None:
            raise MissingFileError(
                describe(
                    "The dataset root holds no LeRobot dataset",
                    expected="a folder holding meta/info.json",
                    found="no meta/info.json" if root.is_dir() else "no such folder",
                    file=root,
                    fix="pass the folder of a downloaded dataset as root, or repo_id='owner/name' "
                    "to download it (into root when root is given)",
                )
            )
        local_dir = root
    if not isinstance(repo_id, str) or not repo_id.strip():
        raise ValueError(
            describe(
                "No dataset to open",
                expected="root= a local dataset folder, or repo_id='owner/name' on the Hub",
                found=f"root={root!r}, repo_id={repo_id!r}",
            )
        )
    offline = bool(local_files_only) or _hub_offline()
    download = _download or _snapshot_download
    cache = str(local_dir) if local_dir is not None else _cache_folder(repo_id, cache_dir)
    where = dict(cache_dir=cache_dir, local_dir=local_dir)

    with _hub_errors(repo_id, revision, offline, cache):
        folder = Path(
            download(
                repo_id,
                revision=revision,
                allow_patterns=list(META_PATTERNS),
                local_files_only=offline,
                **where,
            )
        )
    if not (folder / "meta" / "info.json").is_file():
        raise MissingFileError(
            describe(
                f"The snapshot of {repo_id!r} has no meta/info.json"
                + (" in the local cache (offline mode is on)" if offline else ""),
                expected="a LeRobot dataset repo (v3.0 or v2.1) with meta/info.json",
                found=f"no meta/info.json in {folder}",
                file=folder / "meta" / "info.json",
                fix=_offline_fix(repo_id, revision)
                if offline
                else "check that the repo is a LeRobot dataset and the revision is right",
            )
        )
    meta = load_metadata(folder).select(features)
    selected = select_episodes(meta, episodes)
    files = episode_files(meta, selected)
    missing = [f for f in files if not (folder / f).is_file()]
    if missing and not offline:
        # Same commit as the metadata: a push between the two calls cannot mix versions.
        pinned = folder.name if local_dir is None and _COMMIT.match(folder.name) else revision
        patterns = download_patterns(meta, selected)
        one_by_one = _download is None and len(patterns) > MAX_PATTERNS
        logger.info(
            "hub: %s@%s: fetching %d files of %d episodes (%s)",
            repo_id,
            pinned,
            len(missing),
            len(selected),
            "one by one" if one_by_one else f"{len(patterns)} allow_patterns",
        )
        with _hub_errors(repo_id, pinned, offline, cache):
            if one_by_one:
                folder = _hf_hub_download_files(repo_id, revision=pinned, files=missing, **where)
            else:
                folder = Path(
                    download(
                        repo_id,
                        revision=pinned,
                        allow_patterns=list(patterns),
                        local_files_only=offline,
                        **where,
                    )
                )
    _check_files(folder, files, selected, repo_id, offline=offline, revision=revision)
    return folder, meta


def resolve_root(
    repo_id: str | None = None,
    *,
    root: str | Path | None = None,
    revision: str | None = None,
    episodes: EpisodeSelection = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    _download: Download | None = None,
) -> Path:
    """A local folder holding the dataset's metadata and the files ``episodes`` need.

    Args:
        repo_id: ``"owner/name"`` of a dataset repo on the Hub.
        root: a local copy: used as it is when it holds ``meta/info.json`` (nothing is
            checked or downloaded); otherwise, with ``repo_id``, the download goes into this
            folder (huggingface_hub's ``local_dir``) instead of the cache.
        revision: branch, tag or commit (None: the default branch). LeRobot publishes version
            tags such as ``"v3.0"`` and ``"v2.1"``.
        episodes: the selection the run will use (indices, ``"train[:90%]"``, a ``Split``,
            None for all); only these episodes' data and video files are downloaded.
        cache_dir: huggingface_hub cache folder (None: ``HF_HUB_CACHE``).
        local_files_only: use only the local cache (as ``HF_HUB_OFFLINE=1`` does).

    Returns the snapshot folder (``<cache>/datasets--owner--name/snapshots/<commit>``, or
    ``root``). Raises :class:`~robo_resume.errors.MissingFileError` for a repo, revision or
    file that cannot be found (offline: not in the cache), ImportError when huggingface_hub
    is needed but not installed. See the module docstring for the download steps.
    """
    return resolve_dataset(
        repo_id,
        root=root,
        revision=revision,
        episodes=episodes,
        cache_dir=cache_dir,
        local_files_only=local_files_only,
        _download=_download,
    )[0]
